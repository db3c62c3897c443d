package natsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

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
// first records itself as Pending, then purges, then adds its records to
// Removed and clears Pending, each step a compare-and-set on one key: at
// any moment the stream is missing between Removed and Removed+Pending's
// records, and checkState holds it to that.
type ledger struct {
	// Removed is the number of records removed by finished removals.
	Removed uint64 `json:"removed"`
	// Pending is the removal under way, if any.
	Pending *pendingRemoval `json:"pending,omitempty"`
}

// pendingRemoval is one run's removal: its records with runSeq up to
// LastRunSeq, Records of them.
type pendingRemoval struct {
	RunID      string `json:"runId"`
	LastRunSeq uint64 `json:"lastRunSeq"`
	Records    uint64 `json:"records"`
}

func (l ledger) pendingRecords() uint64 {
	if l.Pending == nil {
		return 0
	}
	return l.Pending.Records
}

func (l ledger) String() string {
	if l.Pending == nil {
		return "no removal under way"
	}
	return fmt.Sprintf("removal of run %q (%d records) under way", l.Pending.RunID, l.Pending.Records)
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
	// step, when set (tests), is called after each step of a removal
	// ("pending", "purged"); an error stops the removal there, as if the
	// process died.
	step func(string) error
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
	st, err := js.Stream(ctx, opts.Stream)
	if err != nil {
		return nil, unavailable("open stream "+opts.Stream+" for removal", err)
	}
	if st.CachedInfo().Config.DenyPurge {
		return nil, ErrNotRemovable
	}
	kv, err := js.KeyValue(ctx, opts.StateBucket)
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
// run's records again (a no-op if they are gone) and adds them to the
// ledger.
func (r *Remover) Recover(ctx context.Context) error {
	l, rev, err := loadLedger(ctx, r.kv, r.name)
	if err != nil || l.Pending == nil {
		return err
	}
	r.log.Info("finishing a removal a restart interrupted", zap.String("runId", l.Pending.RunID), zap.Uint64("records", l.Pending.Records))
	return r.finish(ctx, l, rev)
}

// RemoveRun removes the records of runID with runSeq up to lastRunSeq,
// of which there must be records (the count its archive holds). Records
// the run got later stay. Removing a run again is harmless.
func (r *Remover) RemoveRun(ctx context.Context, runID string, lastRunSeq, records uint64) error {
	if runID == "" || lastRunSeq == 0 || records == 0 || records > lastRunSeq {
		return &statestore.Error{Code: statestore.CodeSchemaValidationFailed, Message: fmt.Sprintf("remove run %q: lastRunSeq %d, records %d", runID, lastRunSeq, records)}
	}
	l, rev, err := loadLedger(ctx, r.kv, r.name)
	if err != nil {
		return err
	}
	if l.Pending != nil {
		if err := r.finish(ctx, l, rev); err != nil {
			return err
		}
		if l, rev, err = loadLedger(ctx, r.kv, r.name); err != nil {
			return err
		}
	}
	left, err := r.remaining(ctx, runID, lastRunSeq)
	if err != nil {
		return err
	}
	if left == 0 {
		return nil // removed before (keys first, so they went too)
	}
	if left != records {
		return &statestore.Error{Code: statestore.CodeRunChanged, Message: fmt.Sprintf("run %q has %d records up to runSeq %d, not the %d archived: nothing removed", runID, left, lastRunSeq, records)}
	}
	l.Pending = &pendingRemoval{RunID: runID, LastRunSeq: lastRunSeq, Records: records}
	if rev, err = r.save(ctx, l, rev); err != nil {
		return err
	}
	if err := r.at("pending"); err != nil {
		return err
	}
	return r.finish(ctx, l, rev)
}

// finish purges l.Pending's keys and records and moves them to Removed.
func (r *Remover) finish(ctx context.Context, l ledger, rev uint64) error {
	p := l.Pending
	token := RunToken(p.RunID)
	for _, k := range r.keys {
		st, err := r.js.Stream(ctx, "KV_"+k.Bucket)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // the bucket is not used (no such component)
		}
		if err != nil {
			return unavailable("open bucket "+k.Bucket+" for removal", err)
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+k.Bucket+"."+k.Keys(token))); err != nil {
			return unavailable("purge run "+p.RunID+" from "+k.Bucket, err)
		}
	}
	if err := r.at("keys"); err != nil {
		return err
	}
	err := r.stream.Purge(ctx, jetstream.WithPurgeSubject(r.prefix+"."+RunToken(p.RunID)+".>"), jetstream.WithPurgeSequence(p.LastRunSeq+1))
	if err != nil {
		return unavailable("purge run "+p.RunID, err)
	}
	if err := r.at("purged"); err != nil {
		return err
	}
	l.Removed += p.Records
	l.Pending = nil
	_, err = r.save(ctx, l, rev)
	return err
}

// remaining counts runID's records with runSeq up to last.
func (r *Remover) remaining(ctx context.Context, runID string, last uint64) (uint64, error) {
	info, err := r.stream.Info(ctx, jetstream.WithSubjectFilter(r.prefix+"."+RunToken(runID)+".>"))
	if err != nil {
		return 0, unavailable("count run "+runID, err)
	}
	if info.State.Msgs == 0 || info.State.FirstSeq > last {
		return 0, nil
	}
	// The filtered state counts every subject of the run; each holds one
	// message. Those above last are records the run got after its archive.
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

func (r *Remover) at(step string) error {
	if r.step == nil {
		return nil
	}
	return r.step(step)
}
