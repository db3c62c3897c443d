package runlist

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unique"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// mirror holds the bucket in memory, fed by a KV watch: a query reads no
// NATS at all, and each changed row reaches every replica once.
type mirror struct {
	kv          jetstream.KeyValue
	maxFinished int // Options.MaxFinished
	log         *zap.Logger
	m           *Metrics

	mu      sync.RWMutex
	st      state
	sorted  []*entry      // st.rows newest first, while !stale
	stale   bool          // a run came or went since sorted was built
	synced  bool          // the watch delivered what existed when it began
	changed chan struct{} // closed (and replaced) at every change

	stop context.CancelFunc
	done chan struct{}
}

// state is the content of the bucket.
type state struct {
	rows     map[string]*entry         // runId -> entry
	draining map[string]*entry         // the rows with substatus DRAINING
	paused   map[string]*entry         // the rows with status PAUSED
	durs     map[string]*StepDurations // durKey -> durations
	cursor   uint64                    // the log sequence the rows include
	rev      uint64                    // highest bucket revision applied
	// window holds the finished rows in rows, oldest on top; at most
	// maxFinished of them (the rest stay in the bucket only).
	window
}

func newState(maxFinished int) state {
	return state{rows: map[string]*entry{}, draining: map[string]*entry{}, paused: map[string]*entry{}, durs: map[string]*StepDurations{},
		window: newWindow(maxFinished)}
}

// entry is a row with its bucket revision and its CreatedAt parsed.
type entry struct {
	row     Row
	rev     uint64
	created int64 // unix nanoseconds
	// finIndex is the entry's index in the window's heap, -1 when it is
	// not there (an open run).
	finIndex int
}

func startMirror(kv jetstream.KeyValue, maxFinished int, log *zap.Logger, m *Metrics) *mirror {
	ctx, cancel := context.WithCancel(context.Background())
	mr := &mirror{kv: kv, maxFinished: maxFinished, log: log.Named("mirror"), m: m, st: newState(maxFinished), changed: make(chan struct{}), stop: cancel, done: make(chan struct{})}
	go mr.loop(ctx)
	return mr
}

func (mr *mirror) close() {
	mr.stop()
	<-mr.done
}

// loop watches the bucket, and watches it anew (after a backoff) when a
// watch ends or cannot start. A new watch fills a new map, swapped in
// once it has every entry: queries keep being answered from the old one
// meanwhile, and rows gone from the bucket (a bucket recreated) go.
func (mr *mirror) loop(ctx context.Context) {
	defer close(mr.done)
	backoff := 250 * time.Millisecond
	for ctx.Err() == nil {
		next := newState(mr.maxFinished)
		kw, err := mr.watch(ctx, &next)
		if err != nil {
			mr.log.Warn("run list: cannot watch the bucket; retrying", zap.Duration("in", backoff), zap.Error(err))
			if sleep(ctx, backoff) != nil {
				return
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		building, read := true, 0
		for {
			var e jetstream.KeyValueEntry
			var ok bool
			select {
			case <-ctx.Done():
				_ = kw.Stop()
				return
			case e, ok = <-kw.Updates():
			}
			if !ok {
				break
			}
			if e == nil { // the entries that existed are in
				mr.m.setStartRead(read)
				mr.swap(next)
				building, next = false, state{}
				backoff = 250 * time.Millisecond
				continue
			}
			if building {
				if strings.HasPrefix(e.Key(), keyRun) {
					read++
				}
				next.apply(e, mr.log)
				continue
			}
			mr.apply(e)
		}
		_ = kw.Stop()
		if ctx.Err() == nil {
			mr.log.Warn("run list: the watch of the bucket ended; watching it anew")
			if sleep(ctx, backoff) != nil {
				return
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}
}

// watch begins a watch of the bucket that first delivers what st does
// not hold yet: with a floor, the keys that are not rows are read into st
// and its window's bound set to the floor's position, and the watch
// begins at the floor's Seq; without one, it delivers every key. The
// watch replaces a consumer that stalls (natsstore.Watch) and delivers
// the initial-values marker once, so a replaced consumer neither swaps
// the state again nor loses the rows it had not delivered.
func (mr *mirror) watch(ctx context.Context, st *state) (jetstream.KeyWatcher, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	fl, err := mr.readFloor(rctx)
	if err != nil {
		return nil, err
	}
	if fl == nil {
		return natsstore.Watch(ctx, mr.kv, jetstream.AllKeys, mr.log)
	}
	if err := mr.readKeys(rctx, st); err != nil {
		return nil, err
	}
	st.bound = &entry{created: fl.Created, row: Row{RunID: fl.RunID}}
	st.forgetOutside() // the rows beyond the floor are not read
	return natsstore.Watch(ctx, mr.kv, jetstream.AllKeys, mr.log, jetstream.ResumeFromRevision(fl.Seq))
}

// apply applies a bucket entry; it reports whether a run came or went.
func (st *state) apply(e jetstream.KeyValueEntry, log *zap.Logger) (cameOrWent bool) {
	st.rev = max(st.rev, e.Revision())
	key := e.Key()
	switch {
	case key == keyCursor:
		if e.Operation() != jetstream.KeyValuePut {
			st.cursor = 0
		} else if c, err := strconv.ParseUint(string(e.Value()), 10, 64); err == nil {
			st.cursor = c
		}
		return false
	case strings.HasPrefix(key, keyDur):
		if e.Operation() != jetstream.KeyValuePut {
			delete(st.durs, key)
			return false
		}
		var d StepDurations
		if err := json.Unmarshal(e.Value(), &d); err == nil && d.TenantID == "" && d.PlanID != "" {
			// Durations of every tenant together, kept before they were
			// each tenant's: left out of every estimate.
			return false
		}
		if err := json.Unmarshal(e.Value(), &d); err != nil || d.key() != key {
			log.Warn("run list: an entry that is not step durations; ignored", zap.String("key", key), zap.Error(err))
			return false
		}
		st.durs[key] = &d
		return false
	case !strings.HasPrefix(key, keyRun):
		return false
	}
	runID := runIDOfKey(key)
	if e.Operation() != jetstream.KeyValuePut {
		st.gone(runID)
		return st.drop(runID)
	}
	var r Row
	if err := json.Unmarshal(e.Value(), &r); err != nil || r.RunID == "" || keyRun+natsstore.RunToken(r.RunID) != key {
		log.Warn("run list: an entry that is not a row; ignored", zap.String("key", key), zap.Error(err))
		return false
	}
	cur, had := st.rows[r.RunID]
	if had && (cur.rev > e.Revision() || cur.row.LastEventSeq > r.LastEventSeq) {
		return false
	}
	ne := entry{row: r, rev: e.Revision(), created: r.created().UnixNano(), finIndex: -1}
	finished := statestore.IsTerminalRunStatus(r.Status)
	if finished && st.beyond(&ne) {
		// Older than the finished rows kept: in the bucket only.
		st.evictedRev = max(st.evictedRev, ne.rev)
		st.letGo(r.RunID)
		return st.drop(r.RunID)
	}
	st.gone(r.RunID)
	intern(&ne.row)
	if had {
		ne.finIndex = cur.finIndex
		*cur = ne // in place: the sorted order and the window hold this pointer
	} else {
		cur = &ne
		st.rows[r.RunID] = cur
	}
	if r.Substatus == statestore.SubstatusDraining {
		st.draining[r.RunID] = cur
	} else {
		delete(st.draining, r.RunID)
	}
	if r.Status == statestore.RunStatusPaused {
		st.paused[r.RunID] = cur
	} else {
		delete(st.paused, r.RunID)
	}
	went := false
	if !finished {
		st.remove(cur)
	} else {
		for _, old := range st.keep(cur) {
			st.dropEntry(old)
			went = went || old == cur
		}
	}
	return !had || went
}

// drop removes runID's row; it reports whether there was one.
func (st *state) drop(runID string) bool {
	e, had := st.rows[runID]
	if had {
		st.dropEntry(e)
	}
	return had
}

func (st *state) dropEntry(e *entry) {
	id := e.row.RunID
	delete(st.rows, id)
	delete(st.draining, id)
	delete(st.paused, id)
	st.remove(e)
}

func (mr *mirror) swap(next state) {
	mr.mu.Lock()
	next.cursor, next.rev = max(next.cursor, mr.st.cursor), max(next.rev, mr.st.rev)
	mr.st = next
	mr.stale, mr.synced = true, true
	n := len(next.rows)
	mr.notifyLocked()
	mr.mu.Unlock()
	mr.m.setRows(n)
}

func (mr *mirror) apply(e jetstream.KeyValueEntry) {
	mr.mu.Lock()
	if mr.st.apply(e, mr.log) {
		mr.stale = true
	}
	n := len(mr.st.rows)
	mr.notifyLocked()
	mr.mu.Unlock()
	mr.m.setRows(n)
}

func (mr *mirror) notifyLocked() {
	close(mr.changed)
	mr.changed = make(chan struct{})
}

// waitCursor waits until the rows include the log up to seq and the list
// answers (its first read of the bucket is done).
func (mr *mirror) waitCursor(ctx context.Context, seq uint64) error {
	for {
		mr.mu.RLock()
		cursor, synced, ch := mr.st.cursor, mr.synced, mr.changed
		mr.mu.RUnlock()
		// Synced too: on an empty log the cursor is 0 from the start,
		// while the list still answers RUN_LIST_SYNCING.
		if synced && cursor >= seq {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// runIDOfKey is the runId of a row's key ("" for another key).
func runIDOfKey(key string) string {
	tok, ok := strings.CutPrefix(key, keyRun)
	if !ok {
		return ""
	}
	id, err := natsstore.ParseRunToken(tok)
	if err != nil {
		return ""
	}
	return id
}

// intern makes r share the strings that repeat across runs (scope, plan,
// status, label keys and values) with every other row that has them:
// the mirror holds every run, and most of a row is such strings.
func intern(r *Row) {
	for _, p := range []*string{&r.TenantID, &r.ProjectID, &r.EnvironmentID, &r.PlanID, &r.PlanVersion, &r.Status, &r.Substatus, &r.PauseReason, &r.PauseOrigin} {
		*p = unique.Make(*p).Value()
	}
	if len(r.Labels) > 0 {
		m := make(map[string]string, len(r.Labels))
		for k, v := range r.Labels {
			m[unique.Make(k).Value()] = unique.Make(v).Value()
		}
		r.Labels = m
	}
}

// durations returns a copy of the durations under key k (nil: none).
func (mr *mirror) durations(k string) []float64 {
	mr.mu.RLock()
	defer mr.mu.RUnlock()
	if d := mr.st.durs[k]; d != nil {
		return slices.Clone(d.Seconds)
	}
	return nil
}
