package natsstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// DefaultStateBucket is the KV bucket where the store keeps the highest
// sequence it knows the event stream reached (its watermark).
const DefaultStateBucket = "SIDECAR_LOG_STATE"

// openStream creates the event stream, or binds to it when it exists. It
// never updates a stream: the sidecar's NATS user may not (Permissions),
// so that nobody holding its credentials can turn deletes or purges on.
// An existing stream whose configuration differs from cfg is accepted when
// it keeps every guarantee the log relies on (checkConfig), and reported.
func openStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, log *zap.Logger) (jetstream.Stream, error) {
	st, err := js.CreateStream(ctx, cfg)
	if err == nil {
		return st, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil, unavailable("open stream "+cfg.Name, err)
	}
	if st, err = BindStream(ctx, js, cfg.Name); err != nil {
		return nil, unavailable("open stream "+cfg.Name, err)
	}
	have := st.CachedInfo().Config
	if err := checkConfig(have, cfg); err != nil {
		return nil, err
	}
	// A stream created with retention on or off (purge allowed or denied)
	// differs from cfg by that alone: what it means is decided by retention
	// (STORE_NOT_REMOVABLE), not an older version's configuration. A create
	// with the stream's own retention setting succeeds exactly then.
	same := cfg
	same.DenyPurge, same.Metadata = have.DenyPurge, have.Metadata
	if _, err := js.CreateStream(ctx, same); err == nil {
		return st, nil
	}
	log.Warn("the event stream keeps a configuration that differs from this version's; it keeps every guarantee of the log, and an administrator may align it (docs/jetstream.md)",
		zap.String("stream", cfg.Name))
	return st, nil
}

// checkConfig refuses a stream on which records could be removed,
// replaced or duplicated. Purge is allowed on a stream created for
// retention (metadata MetaRemovable): there the removal ledger accounts
// for every record removed (checkState), and only the retention user may
// purge.
func checkConfig(have, want jetstream.StreamConfig) error {
	var p []string
	if !have.DenyDelete {
		p = append(p, "deny_delete is off")
	}
	if !have.DenyPurge && have.Metadata[MetaRemovable] != "true" {
		p = append(p, "deny_purge is off")
	}
	if have.AllowRollup {
		p = append(p, "allow_rollup is on")
	}
	if have.MaxMsgsPerSubject != 1 || have.Discard != jetstream.DiscardNew || !have.DiscardNewPerSubject {
		p = append(p, "it does not keep exactly the first message per subject (max_msgs_per_subject 1, discard new per subject)")
	}
	if have.MaxAge > 0 || have.MaxMsgs > 0 || have.MaxBytes > 0 {
		p = append(p, "it has age or size limits that would drop records")
	}
	if len(have.Subjects) != 1 || have.Subjects[0] != want.Subjects[0] {
		p = append(p, fmt.Sprintf("its subjects are %v, want %v", have.Subjects, want.Subjects))
	}
	if len(p) == 0 {
		return nil
	}
	return damaged(fmt.Sprintf("stream %s exists but %s; an administrator must restore its configuration", want.Name, strings.Join(p, ", ")), nil)
}

// checkState reports a stream that lost records. The stream never removes
// a message on its own (no limits, deletes denied, discard new), so its
// sequences are 1..LastSeq without holes, and LastSeq never goes below a
// sequence the sidecar saw stored, except for the records retention
// removed: the removal ledger counts them, and the stream must be missing
// exactly that many (plus, while a removal of a batch of runs is under
// way, up to the batch's records).
func checkState(name string, st jetstream.StreamState, watermark uint64, l ledger) error {
	missing := st.LastSeq - min(st.Msgs, st.LastSeq)
	switch {
	case st.LastSeq < watermark:
		return damaged(fmt.Sprintf("stream %s ends at sequence %d but sequence %d was stored before: the log was rolled back or truncated", name, st.LastSeq, watermark), nil)
	case l.Removed > 0 || len(l.Batch) > 0:
		if missing < l.Removed || missing > l.Removed+l.pendingRecords() {
			return damaged(fmt.Sprintf("stream %s is missing %d of its %d records, but retention removed %d (%s): records were lost or removed outside retention",
				name, missing, st.LastSeq, l.Removed, l), nil)
		}
		return nil
	case st.NumDeleted > 0:
		return damaged(fmt.Sprintf("stream %s is missing %d records inside sequences %d..%d (deletes are denied: its files are damaged)", name, st.NumDeleted, st.FirstSeq, st.LastSeq), nil)
	case st.LastSeq > 0 && st.FirstSeq > 1:
		return damaged(fmt.Sprintf("stream %s starts at sequence %d: records 1..%d are missing", name, st.FirstSeq, st.FirstSeq-1), nil)
	}
	return nil
}

// Check reports whether the log is still the one Open verified: the stream
// exists, was not replaced (same creation time), is whole (checkState),
// and has not gone below the highest sequence this store saw. It returns an
// error matching statestore.ErrDamaged naming the damage, or
// statestore.ErrUnavailable when the server did not answer. /readyz calls
// it, so it costs one stream-info request.
func (s *Store) Check(ctx context.Context) error {
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	// The highest sequence seen before the stream's state is read: an
	// append acknowledged in between raises it past the state read, which
	// is not a rollback.
	high := s.mark.high()
	st, err := s.js.Stream(ctx, s.name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return damaged(fmt.Sprintf("stream %s was deleted while the sidecar ran", s.name), err)
	}
	if err != nil {
		return unavailable("check stream "+s.name, err)
	}
	info := st.CachedInfo()
	if !info.Created.Equal(s.created) {
		return damaged(fmt.Sprintf("stream %s was replaced while the sidecar ran (created %s, opened one created %s)",
			s.name, info.Created.UTC().Format(time.RFC3339Nano), s.created.UTC().Format(time.RFC3339Nano)), nil)
	}
	if err := checkConfig(info.Config, jetstream.StreamConfig{Name: s.name, Subjects: []string{s.prefix + ".>"}}); err != nil {
		return err
	}
	l, err := ledgerForHoles(ctx, s.mark.kv, s.name, info.State)
	if err != nil {
		return err
	}
	return checkState(s.name, info.State, high, l)
}

// ledgerForHoles reads the removal ledger when the stream misses records
// (only then can it matter): a log that never lost a record costs no
// request.
func ledgerForHoles(ctx context.Context, kv jetstream.KeyValue, stream string, st jetstream.StreamState) (ledger, error) {
	if st.LastSeq <= st.Msgs {
		return ledger{}, nil
	}
	l, _, err := loadLedger(ctx, kv, stream)
	return l, err
}

// damaged is a STORE_DAMAGED error; its message ends with the runbook.
func damaged(msg string, err error) error {
	return &statestore.Error{Code: statestore.CodeStoreDamaged, Message: msg + ` (runbook: docs/operations.md, "Damaged data dir")`, Err: err}
}

// watermark keeps the highest stream sequence this store saw stored, and
// saves it to a KV bucket (only ever upward, with compare-and-set, so
// replicas sharing the stream agree) once per interval while it moved and
// at Close. At Open a stream that ends below the saved watermark was rolled
// back. What was appended within the last interval before a crash is not
// yet saved, so a rollback of only those records is not detected.
type watermark struct {
	kv       jetstream.KeyValue
	key      string
	interval time.Duration
	log      *zap.Logger

	seen  atomic.Uint64 // highest sequence seen stored
	saved uint64        // highest sequence saved (loop only)

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func openWatermark(ctx context.Context, js jetstream.JetStream, bucket, stream string, replicas int, interval time.Duration, log *zap.Logger) (*watermark, error) {
	kv, err := OpenBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "Conductor sidecar: the highest sequence each event stream reached (rollback detection)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, unavailable("open bucket "+bucket, err)
	}
	w := &watermark{kv: kv, key: stream, interval: interval, log: log}
	v, _, err := w.load(ctx)
	if err != nil {
		return nil, err
	}
	w.seen.Store(v)
	w.saved = v
	return w, nil
}

func (w *watermark) load(ctx context.Context) (uint64, uint64, error) {
	e, err := w.kv.Get(ctx, w.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, unavailable("read the log's watermark", err)
	}
	v, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, 0, damaged(fmt.Sprintf("the log's watermark %s/%s holds %q, not a sequence", w.kv.Bucket(), w.key, e.Value()), err)
	}
	return v, e.Revision(), nil
}

func (w *watermark) high() uint64 { return w.seen.Load() }

// saw records that seq is stored.
func (w *watermark) saw(seq uint64) {
	for {
		cur := w.seen.Load()
		if seq <= cur || w.seen.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// maxWatermarkBackoff caps the wait between failed saves.
const maxWatermarkBackoff = 30 * time.Second

// start saves the watermark every interval until close; after a failed
// save it waits twice as long each time, up to maxWatermarkBackoff, and
// logs at most once a minute.
func (w *watermark) start() {
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		wait := w.interval
		t := time.NewTimer(wait)
		defer t.Stop()
		var failing bool
		var lastLog time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			err := w.save(ctx)
			switch {
			case err == nil:
				if failing {
					failing = false
					w.log.Info("saving the log's watermark works again")
				}
				wait = w.interval
			case errors.Is(err, context.Canceled), errors.Is(err, nats.ErrConnectionClosed):
				return // closed, or the connection is (it never comes back)
			default:
				failing = true
				wait = min(2*wait, maxWatermarkBackoff)
				if time.Since(lastLog) > time.Minute {
					lastLog = time.Now()
					w.log.Warn("could not save the log's watermark; retrying with backoff (logged once a minute)", zap.Error(err))
				}
			}
			t.Reset(wait)
		}
	}()
}

// save writes seen if it is above what the bucket holds.
func (w *watermark) save(ctx context.Context) error {
	seen := w.seen.Load()
	if seen <= w.saved {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for range 3 {
		cur, rev, err := w.load(ctx)
		if err != nil {
			return err
		}
		if cur >= seen {
			w.saved = seen
			return nil
		}
		val := []byte(strconv.FormatUint(seen, 10))
		if rev == 0 {
			_, err = w.kv.Create(ctx, w.key, val)
		} else {
			_, err = w.kv.Update(ctx, w.key, val, rev)
		}
		if err == nil {
			w.saved = seen
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return err
		}
	}
	return errors.New("watermark: too many concurrent updates")
}

// close stops the loop and saves what was seen, within ctx.
func (w *watermark) close(ctx context.Context) error {
	if w.cancel != nil {
		w.cancel()
		w.wg.Wait()
	}
	return w.save(ctx)
}

// Guard reports streams (the streams of KV buckets and object stores
// included) that were deleted or replaced after it first saw them: the
// sidecar's user may do neither, so either means an administrator or
// another tenant of the server did. /readyz asks it with Store.Check.
type Guard struct {
	js      jetstream.JetStream
	timeout time.Duration
	created map[string]time.Time
}

// NewGuard records the creation time of every named stream, which must
// exist.
func NewGuard(ctx context.Context, js jetstream.JetStream, streams ...string) (*Guard, error) {
	g := &Guard{js: js, timeout: js.Options().DefaultTimeout, created: make(map[string]time.Time, len(streams))}
	if g.timeout <= 0 {
		g.timeout = 5 * time.Second
	}
	for _, name := range streams {
		st, err := BindStream(ctx, js, name)
		if err != nil {
			return nil, unavailable("guard stream "+name, err)
		}
		g.created[name] = st.CachedInfo().Created
	}
	return g, nil
}

// Check returns an error matching statestore.ErrDamaged naming the first
// stream that is gone or was re-created, or statestore.ErrUnavailable when
// the server did not answer.
func (g *Guard) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	for _, name := range slices.Sorted(maps.Keys(g.created)) {
		st, err := g.js.Stream(ctx, name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return damaged(fmt.Sprintf("stream %s was deleted while the sidecar ran", name), err)
		case err != nil:
			return unavailable("check stream "+name, err)
		case !st.CachedInfo().Created.Equal(g.created[name]):
			return damaged(fmt.Sprintf("stream %s was replaced while the sidecar ran", name), nil)
		}
	}
	return nil
}

// checkWhole verifies a read of a whole run (every record from the first):
// the stream's subject index holds a subject per record (each event has a
// subject of its own), and got must have a record for each, or the server
// must show the message on it (something that is not a record of the run,
// which the read skipped). The server trusts its index at start and checks
// a message's checksum only when it loads it: bytes overwritten inside a
// block file leave the index whole and the records unreadable, and a read
// without this check shows a shorter history as if it were the whole one.
// A subject still indexed that the server cannot show is STORE_DAMAGED;
// one gone from the index meanwhile (the run removed by retention) is not.
// It costs one stream-info request with the run's filter; more only when
// the counts differ.
func (s *Store) checkWhole(ctx context.Context, runID, filter string, got []statestore.RunEventRecord) error {
	indexed, err := s.subjectsOf(ctx, filter)
	if err != nil || len(indexed) <= len(got) {
		return err
	}
	have := make(map[string]bool, len(got))
	for _, r := range got {
		have[s.subject(runID, r.IdempotencyKey)] = true
	}
	var unreadable []string
	for subj := range indexed {
		if have[subj] {
			continue
		}
		_, err := s.nextMsg(ctx, directRequest{Seq: 1, NextFor: subj})
		switch {
		case err == nil:
		case errors.Is(err, errNotFound):
			unreadable = append(unreadable, subj)
		default:
			return unavailable("fetch: read a record the run's read missed", err)
		}
	}
	if len(unreadable) == 0 {
		return nil
	}
	again, err := s.subjectsOf(ctx, filter)
	if err != nil {
		return err
	}
	lost := 0
	for _, subj := range unreadable {
		if again[subj] > 0 {
			lost++
		}
	}
	if lost == 0 {
		return nil // removed meanwhile
	}
	return damaged(fmt.Sprintf("stream %s holds %d records of run %s that the server cannot read (the run's read got %d of %d): its files are damaged",
		s.name, lost, runID, len(got), len(indexed)), nil)
}

// subjectsOf returns the stream's message count per subject matching
// filter, from its subject index (a stream-info request).
func (s *Store) subjectsOf(ctx context.Context, filter string) (map[string]uint64, error) {
	body, err := json.Marshal(map[string]any{"subjects_filter": filter})
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	resp, err := s.nc.RequestWithContext(ctx, s.apiPrefix+"STREAM.INFO."+s.name, body)
	if err != nil {
		return nil, unavailable("read the subject index of stream "+s.name, err)
	}
	var info struct {
		State struct {
			Subjects map[string]uint64 `json:"subjects"`
		} `json:"state"`
		Total int                 `json:"total"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &info); err != nil {
		return nil, unavailable("read the subject index of stream "+s.name, err)
	}
	if info.Error != nil {
		return nil, unavailable("read the subject index of stream "+s.name, info.Error)
	}
	if info.Total > len(info.State.Subjects) {
		// Paged: more subjects than one answer holds; not a run's size.
		return nil, unavailable("read the subject index of stream "+s.name, fmt.Errorf("%d subjects on %s, %d in the answer", info.Total, filter, len(info.State.Subjects)))
	}
	return info.State.Subjects, nil
}
