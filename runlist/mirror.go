package runlist

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"time"
	"unique"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// mirror holds the bucket in memory, fed by a KV watch: a query reads no
// NATS at all, and each changed row reaches every replica once.
type mirror struct {
	kv  jetstream.KeyValue
	log *zap.Logger
	m   *Metrics

	mu      sync.RWMutex
	rows    map[string]*entry // runId -> entry
	sorted  []*entry          // newest first, while !stale
	stale   bool              // a run came or went since sorted was built
	cursor  uint64            // the log sequence the rows include
	rev     uint64            // highest bucket revision applied
	synced  bool              // the watch delivered what existed when it began
	changed chan struct{}     // closed (and replaced) at every change

	stop context.CancelFunc
	done chan struct{}
}

// entry is a row with its bucket revision and its CreatedAt parsed.
type entry struct {
	row     Row
	rev     uint64
	created int64 // unix nanoseconds
}

func startMirror(kv jetstream.KeyValue, log *zap.Logger, m *Metrics) *mirror {
	ctx, cancel := context.WithCancel(context.Background())
	mr := &mirror{kv: kv, log: log.Named("mirror"), m: m, rows: map[string]*entry{}, changed: make(chan struct{}), stop: cancel, done: make(chan struct{})}
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
		kw, err := mr.kv.WatchAll(ctx)
		if err != nil {
			mr.log.Warn("run list: cannot watch the bucket; retrying", zap.Duration("in", backoff), zap.Error(err))
			if sleep(ctx, backoff) != nil {
				return
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		next := map[string]*entry{}
		var cursor, rev uint64
		building := true
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
				mr.swap(next, cursor, rev)
				building, next = false, nil
				backoff = 250 * time.Millisecond
				continue
			}
			if building {
				cursor, rev = applyEntry(next, cursor, rev, e, mr.log)
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

// applyEntry applies a bucket entry to rows and returns the new cursor
// and revision.
func applyEntry(rows map[string]*entry, cursor, rev uint64, e jetstream.KeyValueEntry, log *zap.Logger) (uint64, uint64) {
	rev = max(rev, e.Revision())
	if e.Key() == keyCursor {
		if e.Operation() != jetstream.KeyValuePut {
			return 0, rev
		}
		if c, err := strconv.ParseUint(string(e.Value()), 10, 64); err == nil {
			cursor = c
		}
		return cursor, rev
	}
	if !strings.HasPrefix(e.Key(), keyRun) {
		return cursor, rev
	}
	if e.Operation() != jetstream.KeyValuePut {
		delete(rows, runIDOfKey(e.Key()))
		return cursor, rev
	}
	var r Row
	if err := json.Unmarshal(e.Value(), &r); err != nil || r.RunID == "" || keyRun+natsstore.RunToken(r.RunID) != e.Key() {
		log.Warn("run list: an entry that is not a row; ignored", zap.String("key", e.Key()), zap.Error(err))
		return cursor, rev
	}
	if cur, ok := rows[r.RunID]; ok && (cur.rev > e.Revision() || cur.row.LastEventSeq > r.LastEventSeq) {
		return cursor, rev
	}
	intern(&r)
	ne := entry{row: r, rev: e.Revision(), created: r.created().UnixNano()}
	if cur, ok := rows[r.RunID]; ok {
		*cur = ne // in place: the sorted order holds this pointer
	} else {
		rows[r.RunID] = &ne
	}
	return cursor, rev
}

func (mr *mirror) swap(rows map[string]*entry, cursor, rev uint64) {
	mr.mu.Lock()
	mr.rows, mr.cursor, mr.rev = rows, max(cursor, mr.cursor), max(rev, mr.rev)
	mr.stale, mr.synced = true, true
	n := len(rows)
	mr.notifyLocked()
	mr.mu.Unlock()
	mr.m.setRows(n)
}

func (mr *mirror) apply(e jetstream.KeyValueEntry) {
	mr.mu.Lock()
	before := len(mr.rows)
	_, had := mr.rows[runIDOfKey(e.Key())]
	mr.cursor, mr.rev = applyEntry(mr.rows, mr.cursor, mr.rev, e, mr.log)
	_, has := mr.rows[runIDOfKey(e.Key())]
	if had != has || len(mr.rows) != before {
		mr.stale = true
	}
	n := len(mr.rows)
	mr.notifyLocked()
	mr.mu.Unlock()
	mr.m.setRows(n)
}

func (mr *mirror) notifyLocked() {
	close(mr.changed)
	mr.changed = make(chan struct{})
}

// waitCursor waits until the rows include the log up to seq.
func (mr *mirror) waitCursor(ctx context.Context, seq uint64) error {
	for {
		mr.mu.RLock()
		cursor, ch := mr.cursor, mr.changed
		mr.mu.RUnlock()
		if cursor >= seq {
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
	for _, p := range []*string{&r.TenantID, &r.ProjectID, &r.EnvironmentID, &r.PlanID, &r.PlanVersion, &r.Status, &r.Substatus, &r.PauseReason} {
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
