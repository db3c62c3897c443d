package runlist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// follower keeps the bucket up to date with the log: it scans the log from
// the cursor, folds each run's new events into its snapshot, writes the
// rows that changed and then the cursor.
type follower struct {
	kv   jetstream.KeyValue
	opts Options
	log  *zap.Logger
	m    *Metrics

	wake chan struct{}
	stop context.CancelFunc
	done chan struct{}

	// State of the current turn as owner; reset when the turn ends.
	owner     bool
	tail      statestore.LogTail // the log from cursor on
	cursor    uint64
	cursorRev uint64
	tracked   map[string]*tracked
	// fresh: this turn began at the log's start, so a run met for the
	// first time is new (its first event is the one met) unless seen;
	// once caught up, a run not tracked is read back from the log.
	fresh bool
	seen  map[string]bool
	// durs are the step durations this turn added to (durKey -> them);
	// dirty those not written yet.
	durs  map[string]*StepDurations
	dirty map[string]bool
	// mirror has the durations written before this turn.
	mirror *mirror
	// floorSeq is the Seq of the last floor written; floorRev the
	// mirror's revision then.
	floorSeq, floorRev uint64
}

// tracked is a run the follower has folded so far.
type tracked struct {
	snap    *statestore.RunSnapshot
	created string // persistedAt of its first event
	updated string // persistedAt of its last event folded
	rowRev  uint64 // revision of its row as last written (0: unknown)
	// engineStarts are, by step id, the engine's start time its latest
	// StepStarted carried (a step recorded from Conductor's report).
	engineStarts map[string]string
}

// noteStart keeps the engine's start time a StepStarted carries (none:
// forgotten, for a later attempt the gate started).
func (t *tracked) noteStart(r *statestore.RunEventRecord) {
	if r.EventType != statestore.StepStarted {
		return
	}
	at := engineTime(r, `"engineStartedAt"`)
	switch {
	case at != "":
		if t.engineStarts == nil {
			t.engineStarts = map[string]string{}
		}
		t.engineStarts[r.StepID] = at
	case t.engineStarts != nil:
		delete(t.engineStarts, r.StepID)
	}
}

// engineTime is the engine's time (engineStartedAt or engineEndedAt, by
// field) r's payload carries, "" for none. Only the payloads that name
// the field are decoded.
func engineTime(r *statestore.RunEventRecord, field string) string {
	if !bytes.Contains(r.Payload, []byte(field)) {
		return ""
	}
	var p struct {
		Started string `json:"engineStartedAt"`
		Ended   string `json:"engineEndedAt"`
	}
	if json.Unmarshal(r.Payload, &p) != nil {
		return ""
	}
	if field == `"engineStartedAt"` {
		return p.Started
	}
	return p.Ended
}

func startFollower(kv jetstream.KeyValue, opts Options, log *zap.Logger, mr *mirror) *follower {
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{kv: kv, opts: opts, log: log.Named("follower"), m: opts.Metrics, mirror: mr, wake: make(chan struct{}, 1), stop: cancel, done: make(chan struct{})}
	go f.loop(ctx)
	return f
}

func (f *follower) close() {
	f.stop()
	<-f.done
}

// nudge makes the follower look at the log now.
func (f *follower) nudge() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *follower) loop(ctx context.Context) {
	defer close(f.done)
	defer f.endTurn()
	backoff := time.Duration(0)
	for {
		if ctx.Err() != nil {
			return
		}
		read, more, err := f.step(ctx)
		wait := f.opts.Poll
		switch {
		case err != nil && ctx.Err() == nil:
			f.m.error()
			backoff = min(max(2*backoff, f.opts.Poll), 30*time.Second)
			if backoff >= 30*time.Second || backoff == f.opts.Poll {
				f.log.Warn("run list: following the log failed; retrying", zap.Duration("in", backoff), zap.Error(err))
			}
			f.endTurn() // start again from the stored cursor
			wait = backoff
		case more:
			backoff = 0
			continue // behind: read on at once
		case read > 0:
			// The log is moving: let a run's next events pile up, so that
			// its row is written once for them (a step's two events, a
			// run's steps), not once per event.
			backoff = 0
			wait = f.opts.Coalesce
		default:
			backoff = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-f.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// endTurn forgets the state of the turn: the next step reads the cursor
// again and tracks runs anew.
func (f *follower) endTurn() {
	if f.tail != nil {
		f.tail.Close()
	}
	f.owner, f.tail, f.tracked, f.seen, f.fresh = false, nil, nil, nil, false
	f.durs, f.dirty = nil, nil
}

// step does one round: it folds what the log has (foldReads), writes the
// rows that changed and then the cursor. It returns the records it read
// and whether more are waiting.
func (f *follower) step(ctx context.Context) (read int, more bool, err error) {
	if f.opts.Owner != nil && !f.opts.Owner.Owns(ownerKey) {
		f.endTurn()
		return 0, false, nil
	}
	if !f.owner {
		if err := f.loadCursor(ctx); err != nil {
			return 0, false, err
		}
		fctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
		tail, err := f.opts.Log.Follow(fctx, f.cursor)
		cancel()
		if err != nil {
			return 0, false, err
		}
		f.owner, f.tail, f.tracked = true, tail, map[string]*tracked{}
		f.durs, f.dirty = map[string]*StepDurations{}, map[string]bool{}
		if f.fresh = f.cursor == 0; f.fresh {
			f.seen = map[string]bool{}
			f.log.Info("run list: building the list from the start of the log")
		}
	}
	dirty, next, read, more, err := f.foldReads(ctx)
	if err != nil {
		return 0, false, err
	}
	if next == f.cursor {
		if f.fresh {
			f.log.Info("run list: built", zap.Uint64("through", f.cursor), zap.Int("runs", len(f.seen)))
			f.fresh, f.seen = false, nil
		}
		return 0, false, f.maybeFloor(ctx)
	}
	if err := f.writeRows(ctx, dirty); err != nil {
		return 0, false, err
	}
	if err := f.writeDurations(ctx); err != nil {
		return 0, false, err
	}
	if err := f.saveCursor(ctx, next); err != nil {
		return 0, false, err
	}
	for _, t := range dirty {
		if statestore.IsTerminalRunStatus(t.snap.Status) {
			delete(f.tracked, t.snap.RunID) // its next event, if any, reads it back
		}
	}
	f.bound()
	return read, more, nil
}

// maxFoldReads is how many full reads of the log (Options.Batch records
// each) the follower folds before it writes their rows: a run whose
// events span them (a bulk pause's RunPaused and RunDrainCompleted,
// which PostgreSQL appends in rounds: every run's first event, then
// every run's second) gets one row written for them, its latest.
const maxFoldReads = 8

// foldReads reads the log from the cursor, up to maxFoldReads full
// reads while more are waiting, folds what it reads, and returns the runs
// that changed (each once), the sequence read through (the cursor:
// nothing new), how many records it read (a read that moved the cursor
// without records, events of no run, counts as one: progress) and
// whether its last read was full (more are waiting).
func (f *follower) foldReads(ctx context.Context) (dirty []*tracked, next uint64, read int, more bool, err error) {
	next = f.cursor
	in := map[*tracked]bool{}
	for range maxFoldReads {
		sctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
		recs, at, err := f.tail.Next(sctx, f.opts.Batch)
		cancel()
		if err != nil {
			return nil, 0, 0, false, err
		}
		if at == next {
			break
		}
		changed, err := f.fold(ctx, recs)
		if err != nil {
			return nil, 0, 0, false, err
		}
		for _, t := range changed {
			if !in[t] {
				in[t] = true
				dirty = append(dirty, t)
			}
		}
		next, read = at, read+max(len(recs), 1)
		if more = len(recs) >= f.opts.Batch; !more {
			break // caught up
		}
	}
	return dirty, next, read, more, nil
}

// fold applies recs to the runs they belong to and returns the runs that
// changed.
func (f *follower) fold(ctx context.Context, recs []statestore.RunEventRecord) ([]*tracked, error) {
	byRun := map[string][]statestore.RunEventRecord{}
	var order []string
	for _, r := range recs {
		if _, ok := byRun[r.RunID]; !ok {
			order = append(order, r.RunID)
		}
		byRun[r.RunID] = append(byRun[r.RunID], r)
	}
	dirty := make([]*tracked, 0, len(order))
	for _, runID := range order {
		rs := byRun[runID]
		t := f.tracked[runID]
		readBack := false
		if t == nil {
			if f.fresh && !f.seen[runID] {
				t = &tracked{created: rs[0].PersistedAt}
			} else {
				var err error
				if t, err = f.readBack(ctx, runID, rs[len(rs)-1].RunSeq); err != nil {
					return nil, err
				}
				if t == nil {
					continue // removed by retention since it was read
				}
				readBack = true // its events are in, its row is not
			}
			f.tracked[runID] = t
			if f.fresh {
				f.seen[runID] = true
			}
		}
		before := int64(0)
		if t.snap != nil {
			before = t.snap.LastEventSeq
		}
		// The projector raises the alerts of invalid transitions; the list
		// only needs the state.
		t.snap, _ = statestore.Reduce(t.snap, rs)
		if t.snap != nil && t.snap.LastEventSeq != before {
			t.updated = rs[len(rs)-1].PersistedAt
			dirty = append(dirty, t)
			f.noteDurations(t, rs, before)
		} else if readBack {
			dirty = append(dirty, t)
		}
	}
	return dirty, nil
}

// readBack reads a run the follower meets mid-log from the log, up to at
// least its event upTo (a replica that is behind may answer with less;
// the read is retried then). It returns nil for a run that retention
// removed since its record was read: no records, its row forgotten.
func (f *follower) readBack(ctx context.Context, runID string, upTo int64) (*tracked, error) {
	for try := 0; ; try++ {
		fctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
		recs, err := f.opts.Log.Fetch(fctx, runID, 0, 0)
		cancel()
		if err != nil {
			return nil, err
		}
		if len(recs) > 0 && recs[len(recs)-1].RunSeq >= upTo {
			snap, _ := statestore.Reduce(nil, recs)
			t := &tracked{snap: snap, created: recs[0].PersistedAt, updated: recs[len(recs)-1].PersistedAt}
			for i := range recs {
				t.noteStart(&recs[i])
			}
			return t, nil
		}
		if len(recs) == 0 {
			// Retention removed the run after the follower read its
			// record: its row was forgotten first (ForgetRun).
			gone, err := forgotten(ctx, f.kv, f.opts.Timeout, runID)
			if err != nil {
				return nil, err
			}
			if gone {
				return nil, nil
			}
		}
		if try == 4 {
			return nil, fmt.Errorf("read run %s back: the log shows %d events, not yet its event %d", runID, len(recs), upTo)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// rowWrites is how many row writes the follower keeps in flight: each
// is a KV put the server stores on its own, so more in flight queue
// there rather than on the follower.
const rowWrites = 16

// writeRows writes the rows of the runs that changed, rowWrites at a
// time, and returns the first error (the other writes still run: a row
// written is never wrong, only the cursor waits for all of them).
func (f *follower) writeRows(ctx context.Context, dirty []*tracked) error {
	var g errgroup.Group
	g.SetLimit(rowWrites)
	for _, t := range dirty {
		g.Go(func() error { return f.writeRow(ctx, t) })
	}
	return g.Wait()
}

// writeRow writes t's row unless the bucket holds a newer one (another
// follower's, while two replicas believe they own the list): rows never
// go back. Nor does a forgotten row come back: a key whose last entry is
// ForgetRun's marker is never written (a new row is written only where
// the key holds nothing, unlike KeyValue.Create, which writes over a
// marker).
func (f *follower) writeRow(ctx context.Context, t *tracked) error {
	row := rowOf(t.snap, t.created, t.updated)
	for i := range row.InFlightSteps {
		// A step recorded as started from Conductor's report (a worker
		// task in progress at adoption) has run since Conductor started it,
		// unless it was idle since and its latest try started later.
		if at := t.engineStarts[row.InFlightSteps[i].StepID]; at != "" && t.snap.Step(row.InFlightSteps[i].StepID).TryStartedAt == "" {
			row.InFlightSteps[i].StartedAt = at
		}
	}
	b, err := json.Marshal(row)
	if err != nil {
		return err
	}
	key := keyRun + natsstore.RunToken(row.RunID)
	ctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	defer cancel()
	rev := t.rowRev
	for range 5 {
		var newRev uint64
		if rev == 0 {
			newRev, err = f.kv.Update(ctx, key, b, 0)
		} else {
			newRev, err = f.kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			t.rowRev = newRev
			f.m.wrote()
			return nil
		}
		if !conflict(err) {
			return fmt.Errorf("%w: write %s: %w", ErrUnavailable, key, err)
		}
		e, gerr := f.kv.Get(ctx, key)
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted):
			// The write lost to something that is not a row: ForgetRun's
			// marker. Its run left hot state.
			return nil
		case gerr != nil:
			return fmt.Errorf("%w: read %s: %w", ErrUnavailable, key, gerr)
		}
		var have Row
		if json.Unmarshal(e.Value(), &have) == nil && have.LastEventSeq >= row.LastEventSeq {
			t.rowRev = e.Revision()
			return nil
		}
		rev = e.Revision()
	}
	return fmt.Errorf("%w: write %s: it keeps changing", ErrUnavailable, key)
}

// conflict reports a lost compare-and-set (on a single server it also
// matches ErrKeyExists: same API code).
func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// loadCursor reads the stored cursor (0: none, build from the start).
func (f *follower) loadCursor(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	defer cancel()
	e, err := f.kv.Get(ctx, keyCursor)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		f.cursor, f.cursorRev = 0, 0
		return nil
	case err != nil:
		return fmt.Errorf("%w: read cursor: %w", ErrUnavailable, err)
	}
	c, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		f.log.Warn("run list: the stored cursor does not parse; rebuilding from the start of the log", zap.ByteString("cursor", e.Value()))
		c = 0
	}
	f.cursor, f.cursorRev = c, e.Revision()
	return nil
}

// saveCursor stores next as the cursor, if the cursor is still where this
// turn left it; else another follower moved it and this turn ends.
func (f *follower) saveCursor(ctx context.Context, next uint64) error {
	ctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	defer cancel()
	v := []byte(strconv.FormatUint(next, 10))
	var rev uint64
	var err error
	if f.cursorRev == 0 {
		rev, err = f.kv.Create(ctx, keyCursor, v)
	} else {
		rev, err = f.kv.Update(ctx, keyCursor, v, f.cursorRev)
	}
	if conflict(err) {
		f.log.Debug("run list: another replica moved the cursor; following from there")
		f.endTurn()
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: write cursor: %w", ErrUnavailable, err)
	}
	f.cursor, f.cursorRev = next, rev
	return nil
}

// bound drops tracked runs beyond MaxTracked (they are read back from the
// log at their next event).
func (f *follower) bound() {
	if f.tracked == nil || len(f.tracked) <= f.opts.MaxTracked {
		return
	}
	drop := len(f.tracked) - f.opts.MaxTracked*9/10
	for id := range f.tracked {
		if drop == 0 {
			break
		}
		delete(f.tracked, id)
		if f.fresh {
			// A dropped run met again is read back, not started anew.
			f.seen[id] = true
		}
		drop--
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// noteDurations records the durations of the steps that ended in rs (the
// records after before) of t's run: from the step's start to its end.
// Each end is the engine's time when its event carries one (a step
// recorded from Conductor's report: an adopted run's system task, or a
// task that ran before adoption or between two reads), else the log's
// persistedAt, as the snapshot has it.
func (f *follower) noteDurations(t *tracked, rs []statestore.RunEventRecord, before int64) {
	snap := t.snap
	for i := range rs {
		r := &rs[i]
		if r.RunSeq <= before {
			continue
		}
		t.noteStart(r)
		if r.EventType != statestore.StepCompleted && r.EventType != statestore.StepFailed {
			continue
		}
		st := snap.Step(r.StepID)
		if st == nil || st.StartedAt == "" || st.CompletedAt != r.PersistedAt {
			continue // a later attempt of the step is in the batch too
		}
		// The try that ended the step: from its RunStepTryStarted when the
		// step was idle (its idle time is not its duration), else from its
		// start (Conductor's, for a step recorded from its report).
		startedAt, endedAt := st.StartedAt, st.CompletedAt
		if at := t.engineStarts[r.StepID]; at != "" {
			startedAt = at
		}
		if st.TryStartedAt != "" {
			startedAt = st.TryStartedAt
		}
		if at := engineTime(r, `"engineEndedAt"`); at != "" {
			endedAt = at
		}
		from, err1 := time.Parse(time.RFC3339Nano, startedAt)
		to, err2 := time.Parse(time.RFC3339Nano, endedAt)
		if err1 != nil || err2 != nil || to.Before(from) {
			continue
		}
		k := durKey(snap.TenantID, snap.PlanID, snap.PlanVersion, r.StepID)
		d := f.durs[k]
		if d == nil {
			d = &StepDurations{TenantID: snap.TenantID, PlanID: snap.PlanID, PlanVersion: snap.PlanVersion, StepID: r.StepID}
			if !f.fresh {
				d.Seconds = f.mirror.durations(k) // the history before this turn
			}
			f.durs[k] = d
		}
		d.add(to.Sub(from).Seconds())
		f.dirty[k] = true
	}
}

// writeDurations writes the step durations that changed. Two followers
// at once may each write a key: the last write wins, and a few samples of
// the other are lost (an estimate, not a record).
func (f *follower) writeDurations(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	defer cancel()
	for k := range f.dirty {
		b, err := json.Marshal(f.durs[k])
		if err != nil {
			return err
		}
		if _, err := f.kv.Put(ctx, k, b); err != nil {
			return fmt.Errorf("%w: write %s: %w", ErrUnavailable, k, err)
		}
		delete(f.dirty, k)
	}
	return nil
}
