package natsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// MetaRemovable is the stream metadata key set on an event stream created
// for retention (Options.Removable): its deny_purge is off and the removal
// ledger accounts for what is removed.
const MetaRemovable = "sidecar.removable"

// RetentionUser is the NATS user that may remove finished runs from the
// event stream (per-subject purge) and write the removal ledger, and
// nothing else (RetentionPermissions). The sidecar's own user may not.
const RetentionUser = "sidecar-retention"

// ledgerKey is the key of the stream's removal ledger in the state bucket.
func ledgerKey(stream string) string { return stream + ".removed" }

// ledger counts the records retention removed from a stream. A removal
// of a batch of runs first records them as Batch, then purges them, then
// adds their records to Removed and clears Batch, each step a
// compare-and-set on one key: at any moment the stream is missing between
// Removed and Removed plus the batch's records, and checkState holds it to
// that.
type ledger struct {
	// Removed is the number of records removed by finished removals.
	Removed uint64 `json:"removed"`
	// Batch is the removal under way, if any: up to removeBatchRuns runs.
	Batch []pendingRemoval `json:"batch,omitempty"`
	// Pending is a removal under way of one run, the ledger's one-run
	// form: loadLedger reads it into Batch, save never writes it.
	Pending *pendingRemoval `json:"pending,omitempty"`
	// Archive is the newest archive manifest noted before runs it
	// covers left (NoteArchiveHead).
	Archive *notedHead `json:"archive,omitempty"`
}

// notedHead is an archive manifest: its seq and chain.
type notedHead struct {
	Seq   uint64 `json:"seq"`
	Chain string `json:"chain"`
}

// pendingRemoval is one run's removal: its records with runSeq up to
// LastRunSeq, Records of them.
type pendingRemoval struct {
	RunID      string `json:"runId"`
	LastRunSeq uint64 `json:"lastRunSeq"`
	Records    uint64 `json:"records"`
}

func (l ledger) pendingRecords() uint64 {
	var n uint64
	for _, p := range l.Batch {
		n += p.Records
	}
	return n
}

func (l ledger) String() string {
	switch len(l.Batch) {
	case 0:
		return "no removal under way"
	case 1:
		return fmt.Sprintf("removal of run %q (%d records) under way", l.Batch[0].RunID, l.Batch[0].Records)
	}
	return fmt.Sprintf("removal of %d runs (%d records) under way", len(l.Batch), l.pendingRecords())
}

// loadLedger reads the stream's removal ledger (zero when absent) and its
// revision (0 when absent).
func loadLedger(ctx context.Context, kv jetstream.KeyValue, stream string) (ledger, uint64, error) {
	e, err := kv.Get(ctx, ledgerKey(stream))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ledger{}, 0, nil
	}
	if err != nil {
		return ledger{}, 0, unavailable("read the removal ledger", err)
	}
	var l ledger
	if err := json.Unmarshal(e.Value(), &l); err != nil {
		return ledger{}, 0, damaged(fmt.Sprintf("the removal ledger %s/%s does not parse", kv.Bucket(), ledgerKey(stream)), err)
	}
	if l.Pending != nil {
		l.Batch = append(l.Batch, *l.Pending)
		l.Pending = nil
	}
	return l, e.Revision(), nil
}

// RetentionPermissions are RetentionUser's: stream info and per-subject
// purge of the event stream, direct gets of it, reads and writes of the
// state bucket (the removal ledger), and purges of the buckets whose
// per-run keys leave with a run (RunKeys). It cannot publish to the
// stream, delete a message, or touch any other stream or bucket.
func RetentionPermissions(stream, stateBucket string, runKeyBuckets ...string) *server.Permissions {
	kv := "KV_" + stateBucket
	var purge []string
	for _, b := range runKeyBuckets {
		purge = append(purge, "$JS.API.STREAM.INFO.KV_"+b, "$JS.API.STREAM.PURGE.KV_"+b)
	}
	return &server.Permissions{
		Publish: &server.SubjectPermission{
			Allow: append([]string{
				"$JS.API.INFO",
				"$JS.API.STREAM.INFO." + stream, "$JS.API.STREAM.PURGE." + stream,
				"$JS.API.DIRECT.GET." + stream, "$JS.API.DIRECT.GET." + stream + ".>", "$JS.API.STREAM.MSG.GET." + stream,
				"$JS.API.STREAM.INFO." + kv, "$JS.API.STREAM.MSG.GET." + kv,
				"$JS.API.DIRECT.GET." + kv, "$JS.API.DIRECT.GET." + kv + ".>",
				"$KV." + stateBucket + ".>",
			}, purge...),
		},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
}

// RemoverOptions configures OpenRemover; the zero value uses the defaults
// of Options.
type RemoverOptions struct {
	Stream        string
	SubjectPrefix string
	StateBucket   string
	// RunKeys are the buckets whose keys of a run leave with it, purged
	// (no delete marker stays) before the run's records.
	RunKeys []RunKeys
	Logger  *zap.Logger
}

// RunKeys names a bucket's keys of one run.
type RunKeys struct {
	// Bucket is the KV bucket.
	Bucket string
	// Keys returns the run's key, or key pattern ("<token>.>"), from its
	// RunToken.
	Keys func(runToken string) string
}

// RunKey is RunKeys.Keys of a bucket with one key per run, its RunToken
// (SIDECAR_SNAPSHOTS).
func RunKey(runToken string) string { return runToken }

// RunKeyPrefix is RunKeys.Keys of a bucket whose keys of a run all start
// with its RunToken and a dot (SIDECAR_EVENT_IDS).
func RunKeyPrefix(runToken string) string { return runToken + ".>" }

// removeBatchRuns is the most runs one removal ledger entry holds: a
// RemoveRuns of more is removed in batches of this many, each one
// "pending" and one "done" write of the ledger.
const removeBatchRuns = 64

// removeInFlight bounds the runs of a batch whose counts and purges are in
// flight at once.
const removeInFlight = 16

// Remover removes finished runs from the event stream: a per-subject purge
// made as RetentionUser, accounted for in the removal ledger. It does not
// decide what may be removed: its caller (retention) removes a run only
// once the run's archive was read back and checked.
type Remover struct {
	js     jetstream.JetStream
	keys   []RunKeys
	stream jetstream.Stream
	kv     jetstream.KeyValue
	name   string
	prefix string
	log    *zap.Logger
	// step, when set (tests), is called after each step of a removal:
	// "pending" (the batch is in the ledger), "keys" and "purged" of each
	// run (its keys, then its records, are purged; runs of a batch run
	// concurrently), and "purged" with no run once every run of the batch
	// is. An error stops that run, or the batch, there, as if the process
	// died.
	step func(step, runID string) error
}

// OpenRemover binds to the event stream and its state bucket on js, a
// connection as RetentionUser, and finishes a removal a crash left
// pending. A stream that denies purge fails with ErrNotRemovable.
func OpenRemover(ctx context.Context, js jetstream.JetStream, opts RemoverOptions) (*Remover, error) {
	if opts.Stream == "" {
		opts.Stream = DefaultStream
	}
	if opts.SubjectPrefix == "" {
		opts.SubjectPrefix = DefaultSubjectPrefix
	}
	if opts.StateBucket == "" {
		opts.StateBucket = DefaultStateBucket
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	st, err := BindStream(ctx, js, opts.Stream)
	if err != nil {
		return nil, unavailable("open stream "+opts.Stream+" for removal", err)
	}
	if st.CachedInfo().Config.DenyPurge {
		return nil, ErrNotRemovable
	}
	kv, err := BindBucket(ctx, js, opts.StateBucket)
	if err != nil {
		return nil, unavailable("open bucket "+opts.StateBucket+" for removal", err)
	}
	r := &Remover{js: js, keys: opts.RunKeys, stream: st, kv: kv, name: opts.Stream, prefix: opts.SubjectPrefix, log: opts.Logger.Named("remover")}
	if err := r.Recover(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// Recover finishes a removal a crash left pending: it purges the pending
// batch's runs again (a no-op for those that are gone) and adds their
// records to the ledger.
func (r *Remover) Recover(ctx context.Context) error {
	l, rev, err := loadLedger(ctx, r.kv, r.name)
	if err != nil || len(l.Batch) == 0 {
		return err
	}
	r.log.Info("finishing a removal a restart interrupted", zap.Int("runs", len(l.Batch)), zap.Uint64("records", l.pendingRecords()))
	return r.finish(ctx, l, rev)
}

// ArchiveHead returns the archive manifest (seq, chain) noted as the
// newest that runs removed from the stream went to (seq 0: none noted),
// and whether records were removed at all (a store that removed before
// heads were noted has removed set and no head).
func (r *Remover) ArchiveHead(ctx context.Context) (seq uint64, chain string, removed bool, err error) {
	l, _, err := loadLedger(ctx, r.kv, r.name)
	if err != nil {
		return 0, "", false, err
	}
	removed = l.Removed > 0 || len(l.Batch) > 0
	if l.Archive == nil {
		return 0, "", removed, nil
	}
	return l.Archive.Seq, l.Archive.Chain, removed, nil
}

// NoteArchiveHead notes manifest seq (chain) as the archive's head, before
// the runs it covers leave: a later process finds the archive it is given
// holds it, or archives nothing there (an empty directory where the
// volume is not mounted yet, another prefix). A head no newer than the
// one noted changes nothing.
func (r *Remover) NoteArchiveHead(ctx context.Context, seq uint64, chain string) error {
	for range 8 {
		l, rev, err := loadLedger(ctx, r.kv, r.name)
		if err != nil {
			return err
		}
		if l.Archive != nil && l.Archive.Seq >= seq {
			return nil
		}
		l.Archive = &notedHead{Seq: seq, Chain: chain}
		_, err = r.save(ctx, l, rev)
		if err == nil || !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return err
		}
	}
	return unavailable("note the archive's head", errors.New("the removal ledger kept changing"))
}

// RemoveRun removes one run: RemoveRuns of it alone.
func (r *Remover) RemoveRun(ctx context.Context, runID string, lastRunSeq, records uint64) error {
	return r.RemoveRuns(ctx, []statestore.Removal{{RunID: runID, LastRunSeq: lastRunSeq, Records: records}})
}

// RemoveRuns removes each run's records with runSeq up to its LastRunSeq,
// of which there must be Records (the count its archive holds), in
// batches of up to removeBatchRuns runs: one ledger write before a
// batch's purges and one after, the purges of the batch's runs concurrent.
// Records a run got later stay. Removing a run again is harmless. A run
// whose count differs is left whole, the others are removed, and the
// error (RUN_CHANGED) names it. A runId given twice removes nothing.
func (r *Remover) RemoveRuns(ctx context.Context, runs []statestore.Removal) error {
	seen := make(map[string]bool, len(runs))
	for _, rm := range runs {
		if rm.RunID == "" || rm.LastRunSeq == 0 || rm.Records == 0 || rm.Records > rm.LastRunSeq || seen[rm.RunID] {
			return &statestore.Error{Code: statestore.CodeSchemaValidationFailed, Message: fmt.Sprintf("remove run %q: lastRunSeq %d, records %d (a runId once per call): nothing removed", rm.RunID, rm.LastRunSeq, rm.Records)}
		}
		seen[rm.RunID] = true
	}
	var changed []error
	for len(runs) > 0 {
		n := min(len(runs), removeBatchRuns)
		c, err := r.removeBatch(ctx, runs[:n])
		if err != nil {
			return err
		}
		changed = append(changed, c...)
		runs = runs[n:]
	}
	if len(changed) > 0 {
		return &statestore.Error{Code: statestore.CodeRunChanged, Message: changedRuns(changed)}
	}
	return nil
}

// namedChanges is how many changed runs a RUN_CHANGED error of RemoveRuns
// names; the rest are counted, so that the error stays a line a log can
// take whatever the batch's size.
const namedChanges = 3

// changedRuns is the message of RemoveRuns' RUN_CHANGED error.
func changedRuns(changed []error) string {
	shown := changed[:min(len(changed), namedChanges)]
	msg := errors.Join(shown...).Error()
	if rest := len(changed) - len(shown); rest > 0 {
		msg += fmt.Sprintf("\nand %d more runs that changed: nothing of them removed", rest)
	}
	return msg
}

// removeBatch removes up to removeBatchRuns runs and returns the runs it
// left because their count differs.
func (r *Remover) removeBatch(ctx context.Context, runs []statestore.Removal) ([]error, error) {
	l, rev, err := loadLedger(ctx, r.kv, r.name)
	if err != nil {
		return nil, err
	}
	if len(l.Batch) > 0 {
		if err := r.finish(ctx, l, rev); err != nil {
			return nil, err
		}
		if l, rev, err = loadLedger(ctx, r.kv, r.name); err != nil {
			return nil, err
		}
	}
	left := make([]uint64, len(runs))
	var g errgroup.Group
	g.SetLimit(removeInFlight)
	for i, rm := range runs {
		g.Go(func() (err error) {
			left[i], err = r.remaining(ctx, rm.RunID, rm.LastRunSeq)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var changed []error
	for i, rm := range runs {
		switch left[i] {
		case 0: // removed before (keys first, so they went too)
		case rm.Records:
			l.Batch = append(l.Batch, pendingRemoval{RunID: rm.RunID, LastRunSeq: rm.LastRunSeq, Records: rm.Records})
		default:
			changed = append(changed, fmt.Errorf("run %q has %d records up to runSeq %d, not the %d archived: nothing of it removed", rm.RunID, left[i], rm.LastRunSeq, rm.Records))
		}
	}
	if len(l.Batch) == 0 {
		return changed, nil
	}
	if rev, err = r.save(ctx, l, rev); err != nil {
		return nil, err
	}
	if err := r.at("pending", ""); err != nil {
		return nil, err
	}
	return changed, r.finish(ctx, l, rev)
}

// finish purges the keys and records of l.Batch's runs, removeInFlight
// runs at a time, and once every one is purged moves their records to
// Removed.
func (r *Remover) finish(ctx context.Context, l ledger, rev uint64) error {
	var buckets []jetstream.Stream
	var subjects []func(string) string
	for _, k := range r.keys {
		st, err := r.js.Stream(ctx, "KV_"+k.Bucket)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // the bucket is not used (no such component)
		}
		if err != nil {
			return unavailable("open bucket "+k.Bucket+" for removal", err)
		}
		buckets = append(buckets, st)
		subjects = append(subjects, func(token string) string { return "$KV." + k.Bucket + "." + k.Keys(token) })
	}
	var g errgroup.Group
	g.SetLimit(removeInFlight)
	for _, p := range l.Batch {
		g.Go(func() error {
			token := RunToken(p.RunID)
			for i, st := range buckets {
				if err := st.Purge(ctx, jetstream.WithPurgeSubject(subjects[i](token))); err != nil {
					return unavailable("purge run "+p.RunID+" from "+st.CachedInfo().Config.Name, err)
				}
			}
			if err := r.at("keys", p.RunID); err != nil {
				return err
			}
			err := r.stream.Purge(ctx, jetstream.WithPurgeSubject(r.prefix+"."+token+".>"), jetstream.WithPurgeSequence(p.LastRunSeq+1))
			if err != nil {
				return unavailable("purge run "+p.RunID, err)
			}
			return r.at("purged", p.RunID)
		})
	}
	// Every run of the batch is tried; the first failure is returned and
	// the batch stays pending, finished by the next removal or open.
	if err := g.Wait(); err != nil {
		return err
	}
	if err := r.at("purged", ""); err != nil {
		return err
	}
	l.Removed += l.pendingRecords()
	l.Batch = nil
	_, err := r.save(ctx, l, rev)
	return err
}

// remaining counts runID's records with runSeq up to last: two requests
// (the run's subjects, then its last message), plus one per record when the
// run got records after last. The last message comes from the stream's
// subject index (last_by_subj on the run's wildcard), at a cost that
// follows the run; a next_by_subj from last+1 would scan every later run's
// messages to find that there is none.
func (r *Remover) remaining(ctx context.Context, runID string, last uint64) (uint64, error) {
	filter := r.prefix + "." + RunToken(runID) + ".>"
	info, err := r.stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, unavailable("count run "+runID, err)
	}
	if info.State.Msgs == 0 || info.State.FirstSeq > last {
		return 0, nil
	}
	// The filtered state counts every subject of the run; each holds one
	// message. Those above last are records the run got after its archive;
	// when it got none (a run retention removes has ended), every subject
	// counts. A record appended after the Info is above last too.
	newest, err := r.stream.GetLastMsgForSubject(ctx, filter)
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && newest.Sequence <= last) {
		return uint64(len(info.State.Subjects)), nil
	}
	if err != nil {
		return 0, unavailable("count run "+runID, err)
	}
	var n uint64
	for subj := range info.State.Subjects {
		m, err := r.stream.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			return 0, unavailable("count run "+runID, err)
		}
		if m.Sequence <= last {
			n++
		}
	}
	return n, nil
}

// save writes l over revision rev and returns the new revision.
func (r *Remover) save(ctx context.Context, l ledger, rev uint64) (uint64, error) {
	b, err := json.Marshal(l)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		rev, err = r.kv.Create(ctx, ledgerKey(r.name), b)
	} else {
		rev, err = r.kv.Update(ctx, ledgerKey(r.name), b, rev)
	}
	if err != nil {
		return 0, unavailable("write the removal ledger", err)
	}
	return rev, nil
}

func (r *Remover) at(step, runID string) error {
	if r.step == nil {
		return nil
	}
	return r.step(step, runID)
}
