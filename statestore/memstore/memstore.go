// Package memstore is the in-memory statestore backend: the reference
// implementation of the conformance suite and the test double of the other
// packages. Its runSeq is contiguous per run (1, 2, 3, ...).
package memstore

import (
	"context"
	"sync"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore"
)

var (
	_ statestore.Store     = (*Store)(nil)
	_ statestore.KeyLookup = (*Store)(nil)
)

// Store keeps every run's records in memory. It is safe for concurrent use.
type Store struct {
	// Now is the append authority's clock (default time.Now).
	Now func() time.Time

	mu   sync.RWMutex
	runs map[string]*run
	proj *statestore.Projector
}

type run struct {
	recs  []statestore.RunEventRecord
	byKey map[string]int
}

// New returns an empty Store whose snapshots are projected with opts
// (Contiguous is forced on: memstore sequences have no gaps).
func New(opts statestore.ProjectorOptions) *Store {
	s := &Store{Now: time.Now, runs: make(map[string]*run)}
	opts.Contiguous = true
	s.proj = statestore.NewProjector(s, opts)
	return s
}

// Append implements statestore.Store.
func (s *Store) Append(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	return s.append(ctx, w, -1)
}

// AppendIf implements statestore.Store.
func (s *Store) AppendIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	return s.append(ctx, w, max(lastSeq, 0))
}

// append appends w; lastSeq >= 0 makes it conditional.
func (s *Store) append(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	if err := statestore.ValidateWrite(w); err != nil {
		return statestore.AppendResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return statestore.AppendResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[w.RunID]
	if r == nil {
		r = &run{byKey: make(map[string]int)}
		s.runs[w.RunID] = r
	}
	if i, ok := r.byKey[w.IdempotencyKey]; ok {
		rec := &r.recs[i]
		return statestore.AppendResult{EventID: rec.EventID, RunSeq: rec.RunSeq, PersistedAt: rec.PersistedAt, Idempotent: true}, nil
	}
	if have := int64(len(r.recs)); lastSeq >= 0 && have != lastSeq {
		if have == 0 {
			delete(s.runs, w.RunID)
		}
		return statestore.AppendResult{}, statestore.RunChanged(w.RunID, lastSeq, have)
	}
	rec := statestore.RunEventRecord{
		RunEventWrite: *w,
		RunSeq:        int64(len(r.recs)) + 1,
		PersistedAt:   s.Now().UTC().Format(time.RFC3339Nano),
	}
	rec.Payload = append([]byte(nil), w.Payload...)
	if len(rec.Payload) == 0 {
		rec.Payload = nil
	}
	r.byKey[w.IdempotencyKey] = len(r.recs)
	r.recs = append(r.recs, rec)
	return statestore.AppendResult{EventID: rec.EventID, RunSeq: rec.RunSeq, PersistedAt: rec.PersistedAt, Persisted: true}, nil
}

// AppendBatch implements statestore.BatchAppender: each run is checked
// and written under the store's lock, all of its events or none.
func (s *Store) AppendBatch(ctx context.Context, runs []statestore.RunBatch) []statestore.BatchResult {
	out := make([]statestore.BatchResult, len(runs))
	for i, b := range runs {
		if err := statestore.CheckBatch(b); err != nil {
			out[i].Err = err
			continue
		}
		if err := ctx.Err(); err != nil {
			out[i].Err = err
			continue
		}
		out[i] = s.appendRun(b)
	}
	return out
}

// AtomicRuns implements statestore.BatchAppender.
func (s *Store) AtomicRuns() bool { return true }

// appendRun writes b's events, all or none, under the lock.
func (s *Store) appendRun(b statestore.RunBatch) statestore.BatchResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	runID := b.Events[0].RunID
	r := s.runs[runID]
	have := int64(0)
	if r != nil {
		have = int64(len(r.recs))
	}
	// The events the run holds are answered as duplicates; the others must
	// follow LastSeq.
	res := make([]statestore.AppendResult, len(b.Events))
	fresh := false
	for i, w := range b.Events {
		if r != nil {
			if j, ok := r.byKey[w.IdempotencyKey]; ok {
				rec := &r.recs[j]
				res[i] = statestore.AppendResult{EventID: rec.EventID, RunSeq: rec.RunSeq, PersistedAt: rec.PersistedAt, Idempotent: true}
				continue
			}
		}
		fresh = true
	}
	if fresh && have != max(b.LastSeq, 0) {
		return statestore.BatchResult{Err: statestore.RunChanged(runID, b.LastSeq, have)}
	}
	if r == nil {
		r = &run{byKey: make(map[string]int)}
		s.runs[runID] = r
	}
	at := s.Now().UTC().Format(time.RFC3339Nano)
	for i, w := range b.Events {
		if res[i].Idempotent {
			continue
		}
		if _, ok := r.byKey[w.IdempotencyKey]; ok { // twice in one batch
			j := r.byKey[w.IdempotencyKey]
			res[i] = statestore.AppendResult{EventID: r.recs[j].EventID, RunSeq: r.recs[j].RunSeq, PersistedAt: r.recs[j].PersistedAt, Idempotent: true}
			continue
		}
		rec := statestore.RunEventRecord{RunEventWrite: *w, RunSeq: int64(len(r.recs)) + 1, PersistedAt: at}
		rec.Payload = append([]byte(nil), w.Payload...)
		if len(rec.Payload) == 0 {
			rec.Payload = nil
		}
		r.byKey[w.IdempotencyKey] = len(r.recs)
		r.recs = append(r.recs, rec)
		res[i] = statestore.AppendResult{EventID: rec.EventID, RunSeq: rec.RunSeq, PersistedAt: rec.PersistedAt, Persisted: true}
	}
	return statestore.BatchResult{Results: res}
}

// Fetch implements statestore.Store.
func (s *Store) Fetch(ctx context.Context, runID string, afterSeq int64, limit int) ([]statestore.RunEventRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	r := s.runs[runID]
	if r == nil {
		return []statestore.RunEventRecord{}, nil
	}
	start := afterSeq
	if start < 0 {
		start = 0
	}
	if start > int64(len(r.recs)) {
		start = int64(len(r.recs))
	}
	recs := r.recs[start:]
	if limit > 0 && len(recs) > limit {
		recs = recs[:limit]
	}
	out := make([]statestore.RunEventRecord, len(recs))
	for i, rec := range recs {
		rec.Payload = append([]byte(nil), rec.Payload...)
		if len(rec.Payload) == 0 {
			rec.Payload = nil
		}
		out[i] = rec
	}
	return out, nil
}

// Lookup implements statestore.KeyLookup.
func (s *Store) Lookup(ctx context.Context, runID, idempotencyKey string) (*statestore.RunEventRecord, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r := s.runs[runID]
	if r == nil {
		return nil, statestore.ErrNotFound
	}
	i, ok := r.byKey[idempotencyKey]
	if !ok {
		return nil, statestore.ErrNotFound
	}
	rec := r.recs[i]
	rec.Payload = append([]byte(nil), rec.Payload...)
	return &rec, nil
}

// GetSnapshot implements statestore.Store.
func (s *Store) GetSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	return s.proj.Snapshot(ctx, runID)
}

// ProjectSnapshot implements statestore.Store.
func (s *Store) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	return s.proj.Project(ctx, runID)
}
