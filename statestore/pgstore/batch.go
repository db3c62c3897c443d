package pgstore

import (
	"context"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conductor-sidecar/sidecar/statestore"
)

var _ statestore.BatchAppender = (*Store)(nil)

// batchRunsPerTimeout is how many runs of an AppendBatch get one of the
// store's bounds (Options.Timeout without a deadline of the caller's,
// MaxWait with one): a batch of 1,000 runs has five.
const batchRunsPerTimeout = 250

// AppendBatch implements statestore.BatchAppender in one transaction: the
// first event of every run is sent in one pipelined round of append_event
// calls, each conditional on its run's LastSeq, then the second events on
// the runSeq the first got, and so on; one commit ends it. An appended
// event holds its run's counter row locked until the commit, so a run's
// later events cannot be refused once one of its events was written, and
// a crash before the commit leaves every run of the batch as it was. The
// runs are locked in runId order, so two batches sharing runs do not
// deadlock. A failed transaction (the database went away, a deadlock with
// a caller that locks in another order) answers every run that was not
// refused with an error matching ErrUnavailable: none of them was written.
func (s *Store) AppendBatch(ctx context.Context, runs []statestore.RunBatch) []statestore.BatchResult {
	began := time.Now()
	out := make([]statestore.BatchResult, len(runs))
	var order []int
	for i, b := range runs {
		if err := statestore.CheckBatch(b); err != nil {
			out[i].Err = err
			continue
		}
		order = append(order, i)
	}
	sort.SliceStable(order, func(a, b int) bool {
		return runs[order[a]].Events[0].RunID < runs[order[b]].Events[0].RunID
	})
	if len(order) > 0 {
		if err := s.appendBatch(ctx, runs, order, out); err != nil {
			for _, i := range order {
				if out[i].Err == nil || len(out[i].Results) > 0 {
					out[i] = statestore.BatchResult{Err: unavailable("append batch", err)}
				}
			}
		}
	}
	s.metrics.AppendedBatch(out, time.Since(began))
	return out
}

// AtomicRuns implements statestore.BatchAppender: true.
func (s *Store) AtomicRuns() bool { return true }

func (s *Store) appendBatch(ctx context.Context, runs []statestore.RunBatch, order []int, out []statestore.BatchResult) error {
	bodies := make([][]string, len(runs))
	for _, i := range order {
		for _, w := range runs[i].Events {
			body, err := statestore.EncodeWrite(w)
			if err != nil {
				out[i].Err = err
				break
			}
			bodies[i] = append(bodies[i], string(body))
		}
	}
	// The store's bounds (callContext) for every batchRunsPerTimeout runs.
	per := time.Duration(1 + len(order)/batchRunsPerTimeout)
	ctx, cancel := CallContext(ctx, s.timeout*per, s.maxWait*per)
	defer cancel()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	last := make([]int64, len(runs))
	for _, i := range order {
		last[i] = max(runs[i].LastSeq, 0)
	}
	for k := 0; ; k++ {
		var round []int
		batch := &pgx.Batch{}
		for _, i := range order {
			if out[i].Err != nil || k >= len(runs[i].Events) {
				continue
			}
			w := runs[i].Events[k]
			round = append(round, i)
			batch.Queue("SELECT o_event_id, o_run_seq, o_persisted_at, o_idempotent, o_changed_last FROM append_event($1, $2, $3, $4, $5, $6)",
				w.RunID, w.IdempotencyKey, w.EventID, w.EventType, bodies[i][k], last[i])
		}
		if len(round) == 0 {
			break
		}
		br := tx.SendBatch(ctx, batch)
		for _, i := range round {
			var (
				eventID    *string
				seq        *int64
				at         *time.Time
				idempotent *bool
				changed    *int64
			)
			if err := br.QueryRow().Scan(&eventID, &seq, &at, &idempotent, &changed); err != nil {
				br.Close()
				return err
			}
			switch {
			case changed != nil:
				// Nothing of the run is written: an event before this one
				// would hold the run's row, so it was a duplicate.
				out[i] = statestore.BatchResult{Err: statestore.RunChanged(runs[i].Events[0].RunID, runs[i].LastSeq, *changed)}
			case eventID == nil || seq == nil || at == nil || idempotent == nil:
				br.Close()
				return damaged("append_event answered without a record", nil)
			default:
				out[i].Results = append(out[i].Results, statestore.AppendResult{EventID: *eventID, RunSeq: *seq,
					PersistedAt: statestore.FormatPersistedAt(*at), Idempotent: *idempotent, Persisted: !*idempotent})
				if !*idempotent {
					last[i] = *seq
				}
			}
		}
		if err := br.Close(); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}
