package drain

// The pause state drain keeps besides the event log, shared by every
// replica through one JetStream KV bucket (docs/drain.md, "Keys"): the
// drain index, the resume schedule and the engine ledger. Every entry is
// derived from the log or from Conductor, so a lost entry costs time (a
// full pass finds it again), never a decision.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// DefaultBucket is the JetStream KV bucket of Keys.
const DefaultBucket = "SIDECAR_PAUSES"

// Key prefixes of the bucket.
const (
	keyDrain  = "drain."
	keyResume = "resume."
	keyEngine = "engine."
	// keyMoved marks a bucket that has taken over the entries of
	// KeysOptions.LegacyBucket.
	keyMoved = "moved.legacy"
	// legacyRun prefixes the run entries of the legacy bucket, whose
	// enginePaused and engineCycle were the engine ledger.
	legacyRun = "run."
)

// KeysOptions configures OpenKeys. The zero value works.
type KeysOptions struct {
	// Bucket is the KV bucket (default DefaultBucket).
	Bucket string
	// Replicas is the bucket's replica count (default 1).
	Replicas int
	// LegacyBucket names the bucket where earlier versions kept these
	// entries (the run index, SIDECAR_RUNS: drain.<runId>, resume.<runId>
	// and each run entry's enginePaused and engineCycle). OpenKeys moves
	// them here once, so that a sidecar restarted on an older data
	// directory keeps its drains, its scheduled resumes and its ledger.
	// Empty: nothing to move.
	LegacyBucket string
	// ListTimeout bounds a listing of the bucket's keys when the caller's
	// context has no deadline (default 30s).
	ListTimeout time.Duration
	// Logger (default zap.NewNop()).
	Logger *zap.Logger
}

// Keys keeps the drain index (DrainIndex), the resume schedule
// (ResumeSchedule) and the engine ledger (EngineLedger) in a JetStream KV
// bucket. It is safe for concurrent use, and any number of replicas share
// one bucket: a mark or an entry of a later pause cycle is never removed
// by the end of an earlier one.
type Keys struct {
	kv   jetstream.KeyValue
	opts KeysOptions
	log  *zap.Logger
}

var (
	_ DrainIndex     = (*Keys)(nil)
	_ ResumeSchedule = (*Keys)(nil)
	_ EngineLedger   = (*Keys)(nil)
	_ RevisionLedger = (*Keys)(nil)
)

// OpenKeys creates the bucket, or binds to it, and moves the entries of
// opts.LegacyBucket into it the first time. It does not take ownership of
// js.
func OpenKeys(ctx context.Context, js jetstream.JetStream, opts KeysOptions) (*Keys, error) {
	if opts.Bucket == "" {
		opts.Bucket = DefaultBucket
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.ListTimeout <= 0 {
		opts.ListTimeout = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	kv, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:      opts.Bucket,
		Description: "Conductor sidecar pauses: drain index, scheduled resumes, engine ledger (docs/drain.md)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    opts.Replicas,
	})
	if err != nil {
		return nil, keysUnavailable("open bucket "+opts.Bucket, err)
	}
	k := &Keys{kv: kv, opts: opts, log: opts.Logger.Named("drain-keys")}
	if opts.LegacyBucket != "" {
		if err := k.moveLegacy(ctx, js); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// Streams is the JetStream stream Keys keeps its entries in (its bucket's).
func (k *Keys) Streams() []string { return []string{"KV_" + k.kv.Bucket()} }

// moveLegacy copies the entries an earlier version kept in the legacy
// bucket (each one unless this bucket has it already), removes the moved
// drain and resume keys there, and marks the move done. Two replicas
// moving at once write the same entries.
func (k *Keys) moveLegacy(ctx context.Context, js jetstream.JetStream) error {
	if _, err := k.kv.Get(ctx, keyMoved); err == nil {
		return nil
	} else if !isMissing(err) {
		return keysUnavailable("read "+keyMoved, err)
	}
	old, err := js.KeyValue(ctx, k.opts.LegacyBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return k.markMoved(ctx, 0)
	}
	if err != nil {
		return keysUnavailable("open legacy bucket "+k.opts.LegacyBucket, err)
	}
	moved := 0
	for _, prefix := range []string{keyDrain, keyResume} {
		keys, err := k.listIn(ctx, old, prefix+">")
		if err != nil {
			return err
		}
		for _, key := range keys {
			e, err := old.Get(ctx, key)
			if isMissing(err) {
				continue
			}
			if err != nil {
				return keysUnavailable("read legacy "+key, err)
			}
			if _, err := k.kv.Create(ctx, key, e.Value()); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
				return keysUnavailable("move "+key, err)
			}
			if err := old.Delete(ctx, key, jetstream.LastRevision(e.Revision())); err != nil && !isRevisionMismatch(err) {
				return keysUnavailable("remove legacy "+key, err)
			}
			moved++
		}
	}
	n, err := k.moveLedger(ctx, old)
	if err != nil {
		return err
	}
	return k.markMoved(ctx, moved+n)
}

// moveLedger copies the engine ledger of the legacy run entries of runs
// that are not final (the only ones the watcher still follows).
func (k *Keys) moveLedger(ctx context.Context, old jetstream.KeyValue) (int, error) {
	ctx, cancel := k.listContext(ctx)
	defer cancel()
	w, err := old.WatchFiltered(ctx, []string{legacyRun + ">"}, jetstream.IgnoreDeletes())
	if err != nil {
		return 0, keysUnavailable("read legacy run entries", err)
	}
	defer func() { _ = w.Stop() }()
	moved := 0
	for {
		var e jetstream.KeyValueEntry
		select {
		case e = <-w.Updates():
		case <-ctx.Done():
			return 0, keysUnavailable("read legacy run entries", ctx.Err())
		}
		if e == nil {
			return moved, nil // every entry read
		}
		var rec struct {
			RunID        string `json:"runId"`
			State        string `json:"state"`
			EnginePaused bool   `json:"enginePaused"`
			EngineCycle  int64  `json:"engineCycle"`
		}
		if json.Unmarshal(e.Value(), &rec) != nil || rec.RunID == "" || rec.State == "FINAL" || (rec.EngineCycle == 0 && !rec.EnginePaused) {
			continue
		}
		b, _ := json.Marshal(engineNote{Paused: rec.EnginePaused, Cycle: rec.EngineCycle})
		if _, err := k.kv.Create(ctx, keyEngine+rec.RunID, b); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return 0, keysUnavailable("move the engine ledger of "+rec.RunID, err)
		}
		moved++
	}
}

func (k *Keys) markMoved(ctx context.Context, n int) error {
	if _, err := k.kv.Put(ctx, keyMoved, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		return keysUnavailable("mark the legacy entries moved", err)
	}
	if n > 0 {
		k.log.Info("moved the pause entries of the run index into the pause bucket",
			zap.String("from", k.opts.LegacyBucket), zap.String("to", k.opts.Bucket), zap.Int("entries", n))
	}
	return nil
}

// MarkDraining records in the drain index that runID's drain of pause
// cycle cycle may be open, so that the drain monitor of every replica
// finds it without reading every run. It is written after the RunPaused
// of that cycle persisted: a mark always names a cycle in the log.
func (k *Keys) MarkDraining(ctx context.Context, runID string, cycle int64) error {
	if _, err := k.kv.Put(ctx, keyDrain+runID, []byte(strconv.FormatInt(cycle, 10))); err != nil {
		return keysUnavailable("mark drain", err)
	}
	return nil
}

// EndDraining removes runID's drain mark if it names cycle or an older one
// (a mark of a later pause, written meanwhile, stays).
func (k *Keys) EndDraining(ctx context.Context, runID string, cycle int64) error {
	e, err := k.kv.Get(ctx, keyDrain+runID)
	if isMissing(err) {
		return nil
	}
	if err != nil {
		return keysUnavailable("read drain mark", err)
	}
	if marked, err := strconv.ParseInt(string(e.Value()), 10, 64); err == nil && marked > cycle {
		return nil
	}
	if err := k.kv.Delete(ctx, keyDrain+runID, jetstream.LastRevision(e.Revision())); err != nil && !isRevisionMismatch(err) {
		return keysUnavailable("end drain mark", err)
	}
	return nil
}

// DrainingRunIDs lists the runs of the drain index: its cost follows the
// number of open drains, not of active runs.
func (k *Keys) DrainingRunIDs(ctx context.Context) ([]string, error) {
	keys, err := k.listIn(ctx, k.kv, keyDrain+">")
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(keys))
	for i, key := range keys {
		ids[i] = strings.TrimPrefix(key, keyDrain)
	}
	return ids, nil
}

// scheduledResume is the value of a resume.<runId> key.
type scheduledResume struct {
	Cycle       int64     `json:"cycle"`
	At          time.Time `json:"at"`
	RequestedBy string    `json:"requestedBy,omitempty"`
	Reason      string    `json:"reason,omitempty"`
}

// ScheduleResume records that e.RunID's pause cycle is to be resumed at
// e.At, after that cycle's RunPaused persisted.
func (k *Keys) ScheduleResume(ctx context.Context, e ScheduledResume) error {
	b, err := json.Marshal(scheduledResume{Cycle: e.Cycle, At: e.At.UTC(), RequestedBy: e.RequestedBy, Reason: e.Reason})
	if err != nil {
		return err
	}
	if _, err := k.kv.Put(ctx, keyResume+e.RunID, b); err != nil {
		return keysUnavailable("schedule resume", err)
	}
	return nil
}

// EndResume removes runID's scheduled resume if it names cycle or an older
// one (that of a later pause, written meanwhile, stays).
func (k *Keys) EndResume(ctx context.Context, runID string, cycle int64) error {
	e, err := k.kv.Get(ctx, keyResume+runID)
	if isMissing(err) {
		return nil
	}
	if err != nil {
		return keysUnavailable("read scheduled resume", err)
	}
	var s scheduledResume
	if json.Unmarshal(e.Value(), &s) == nil && s.Cycle > cycle {
		return nil
	}
	if err := k.kv.Delete(ctx, keyResume+runID, jetstream.LastRevision(e.Revision())); err != nil && !isRevisionMismatch(err) {
		return keysUnavailable("end scheduled resume", err)
	}
	return nil
}

// ScheduledResumes lists the scheduled resumes: its cost follows the
// number of pauses with a resume time, not of active runs. An entry that
// does not decode is skipped (the full pass still resumes its run).
func (k *Keys) ScheduledResumes(ctx context.Context) ([]ScheduledResume, error) {
	keys, err := k.listIn(ctx, k.kv, keyResume+">")
	if err != nil {
		return nil, err
	}
	out := make([]ScheduledResume, 0, len(keys))
	for _, key := range keys {
		e, err := k.kv.Get(ctx, key)
		if isMissing(err) {
			continue // resumed meanwhile
		}
		if err != nil {
			return nil, keysUnavailable("read "+key, err)
		}
		var s scheduledResume
		if err := json.Unmarshal(e.Value(), &s); err != nil {
			continue
		}
		out = append(out, ScheduledResume{RunID: strings.TrimPrefix(key, keyResume), Cycle: s.Cycle, At: s.At, RequestedBy: s.RequestedBy, Reason: s.Reason})
	}
	return out, nil
}

// engineNote is the value of an engine.<runId> key.
type engineNote struct {
	Paused bool  `json:"paused"`
	Cycle  int64 `json:"cycle"`
}

// NoteEngine records that runID's workflow was paused (or resumed) in
// Conductor for pause cycle cycle. A note of an older cycle than the
// recorded one changes nothing.
func (k *Keys) NoteEngine(ctx context.Context, runID string, paused bool, cycle int64) error {
	b, _ := json.Marshal(engineNote{Paused: paused, Cycle: cycle})
	for range 5 {
		e, err := k.kv.Get(ctx, keyEngine+runID)
		switch {
		case isMissing(err):
			_, err = k.kv.Create(ctx, keyEngine+runID, b)
		case err != nil:
			return keysUnavailable("read engine ledger", err)
		default:
			var n engineNote
			if json.Unmarshal(e.Value(), &n) == nil && (cycle < n.Cycle || n == (engineNote{paused, cycle})) {
				return nil
			}
			_, err = k.kv.Update(ctx, keyEngine+runID, b, e.Revision())
		}
		if err == nil {
			return nil
		}
		if !isRevisionMismatch(err) {
			return keysUnavailable("note engine state", err)
		}
	}
	return keysUnavailable("note engine state", fmt.Errorf("run %s: entry changed concurrently 5 times", runID))
}

// EngineState returns the state NoteEngine recorded for runID (not paused,
// cycle 0 when none).
func (k *Keys) EngineState(ctx context.Context, runID string) (paused bool, cycle int64, err error) {
	paused, cycle, _, err = k.EngineRevision(ctx, runID)
	return paused, cycle, err
}

// EngineRevision is EngineState with the revision of runID's note, which
// changes with every note written (0 when none).
func (k *Keys) EngineRevision(ctx context.Context, runID string) (paused bool, cycle int64, rev uint64, err error) {
	e, err := k.kv.Get(ctx, keyEngine+runID)
	if isMissing(err) {
		return false, 0, 0, nil
	}
	if err != nil {
		return false, 0, 0, keysUnavailable("read engine ledger", err)
	}
	var n engineNote
	if err := json.Unmarshal(e.Value(), &n); err != nil {
		return false, 0, e.Revision(), nil // rewritten by the next note
	}
	return n.Paused, n.Cycle, e.Revision(), nil
}

// listIn returns the keys of kv matching filter. A KV listing is a watch
// that waits for the stream to deliver every key: without a deadline of
// the caller's, it gets ListTimeout.
func (k *Keys) listIn(ctx context.Context, kv jetstream.KeyValue, filter string) ([]string, error) {
	ctx, cancel := k.listContext(ctx)
	defer cancel()
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, keysUnavailable("list "+filter, err)
	}
	var keys []string
	for key := range lister.Keys() {
		keys = append(keys, key)
	}
	if err := ctx.Err(); err != nil {
		return nil, keysUnavailable("list "+filter, err)
	}
	return keys, nil
}

func (k *Keys) listContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, k.opts.ListTimeout)
}

func isMissing(err error) bool {
	return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted)
}

// isRevisionMismatch reports a lost compare-and-set. On a single server a
// CAS conflict also matches jetstream.ErrKeyExists (same API code).
func isRevisionMismatch(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}
