package pgstore

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

var _ statestore.Follower = (*Store)(nil)

// Follow implements statestore.Follower: the records in log_seq order
// (migrations/0001), after afterSeq. log_seq comes from a sequence, which
// is not transactional: a number taken by an append that has not committed
// yet is a hole for a moment, and one taken by an append that failed is a
// hole for good, and so is a removed run's (retention, Remover). The tail
// stops at a hole and passes it once no statement can fill it any more:
// at once when the record after the hole was stored more than
// Options.HoleGrace ago (the append that took the hole's number began
// before that record's number was taken, and statement_timeout, shorter
// than the grace, ended it since), else once the tail has waited the
// grace at it.
func (s *Store) Follow(ctx context.Context, afterSeq uint64) (statestore.LogTail, error) {
	return &tail{s: s, next: afterSeq}, nil
}

// LastSeq implements statestore.Follower.
func (s *Store) LastSeq(ctx context.Context) (uint64, error) {
	ctx, cancel := s.callContext(ctx)
	defer cancel()
	var last int64
	if err := s.pool.QueryRow(ctx, "SELECT coalesce(max(log_seq), 0) FROM run_events").Scan(&last); err != nil {
		return 0, unavailable("last sequence", err)
	}
	return uint64(last), nil
}

// tail is a statestore.LogTail on run_events.log_seq.
type tail struct {
	s    *Store
	next uint64 // the sequence read through
	// holeAt is the first missing sequence the tail waits at, since
	// holeSince.
	holeAt    uint64
	holeSince time.Time
}

// idleWait is how long Next waits when nothing is new, so that an idle
// follower queries about ten times a second.
const idleWait = 100 * time.Millisecond

// Next implements statestore.LogTail.
func (t *tail) Next(ctx context.Context, limit int) ([]statestore.RunEventRecord, uint64, error) {
	if limit <= 0 {
		limit = 1000
	}
	qctx, cancel := t.s.callContext(ctx)
	defer cancel()
	// settled: the record was stored more than the grace ago, by the
	// database's clock, so every hole before it is for good.
	rows, err := t.s.pool.Query(qctx, `SELECT log_seq, run_seq, persisted_at, body,
		persisted_at < clock_timestamp() - make_interval(secs => $3) FROM run_events WHERE log_seq > $1 ORDER BY log_seq LIMIT $2`,
		int64(t.next), limit, t.s.holeGrace.Seconds())
	if err != nil {
		return nil, t.next, unavailable("follow", err)
	}
	defer rows.Close()
	var out []statestore.RunEventRecord
	for rows.Next() {
		var logSeq, runSeq int64
		var at time.Time
		var body string
		var settled bool
		if err := rows.Scan(&logSeq, &runSeq, &at, &body, &settled); err != nil {
			return out, t.next, unavailable("follow", err)
		}
		if uint64(logSeq) != t.next+1 && !settled {
			if t.holeAt != t.next+1 {
				t.holeAt, t.holeSince = t.next+1, time.Now()
			}
			if time.Since(t.holeSince) < t.s.holeGrace {
				break // an append still in flight, most likely: wait for it
			}
			t.s.log.Warn("follow: passing log sequences no append filled within the grace (appends that failed after taking them)",
				zap.Uint64("from", t.next+1), zap.Int64("to", logSeq-1), zap.Duration("grace", t.s.holeGrace))
		}
		rec, err := record(runSeq, at, body)
		if err != nil {
			return out, t.next, err
		}
		rec.LogSeq = uint64(logSeq)
		out = append(out, rec)
		t.next = uint64(logSeq)
	}
	if err := rows.Err(); err != nil {
		return out, t.next, unavailable("follow", err)
	}
	if len(out) == 0 {
		timer := time.NewTimer(idleWait)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		timer.Stop()
	}
	return out, t.next, nil
}

// Close implements statestore.LogTail.
func (t *tail) Close() {}
