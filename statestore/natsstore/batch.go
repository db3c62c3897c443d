package natsstore

import (
	"context"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore"
	"golang.org/x/sync/errgroup"
)

var _ statestore.BatchAppender = (*Store)(nil)

// batchInFlight bounds the runs of one AppendBatch whose publishes are in
// flight together on the connection: 32, as many as the bulk actions had
// in flight before; 256 was no faster (BenchmarkAppendBatch).
const batchInFlight = 32

// AppendBatch implements statestore.BatchAppender with pipelined
// conditional publishes: batchInFlight runs at a time, each run's
// events one after the other, each publish carrying the run's expected
// last sequence (AppendIf), so the server checks every run's condition
// with its write. The stream's own atomic batch publish is not used: it
// would need the stream created with atomic publish allowed, and it
// refuses a whole batch when one run's condition fails.
//
// AtomicRuns is false: each event is stored or not on its own. A run
// whose later event is refused (another writer appended between two of
// its events) keeps the events before it, and Results holds them; a crash
// between two events of a run leaves the first ones stored.
func (s *Store) AppendBatch(ctx context.Context, runs []statestore.RunBatch) []statestore.BatchResult {
	began := time.Now()
	out := make([]statestore.BatchResult, len(runs))
	var g errgroup.Group
	g.SetLimit(batchInFlight)
	for i, b := range runs {
		if err := statestore.CheckBatch(b); err != nil {
			out[i].Err = err
			continue
		}
		g.Go(func() error { out[i] = s.appendRun(ctx, b); return nil })
	}
	_ = g.Wait() // each run's outcome is in out
	s.metrics.AppendedBatch(out, time.Since(began))
	return out
}

// AtomicRuns implements statestore.BatchAppender: false.
func (s *Store) AtomicRuns() bool { return false }

func (s *Store) appendRun(ctx context.Context, b statestore.RunBatch) statestore.BatchResult {
	var r statestore.BatchResult
	last := max(b.LastSeq, 0)
	for _, w := range b.Events {
		res, err := s.append(ctx, w, last)
		if err != nil {
			r.Err = err
			return r
		}
		r.Results = append(r.Results, res)
		if res.Persisted {
			last = res.RunSeq
		}
	}
	return r
}
