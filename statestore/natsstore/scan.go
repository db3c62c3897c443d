package natsstore

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Scan reads the log of every run in stream order (which is runSeq order
// within each run) from stream sequence afterSeq+1: at most limit records
// (limit <= 0 or above 1,024: 1,024), with one batch direct get. It returns
// the records and the sequence to scan after next time: that of the last
// message read, record or not (a message that is not a valid record is
// logged and skipped). When nothing follows afterSeq it returns no
// records and afterSeq.
//
// It is for consumers that follow the whole log, such as the run list
// index (package runlist). The stream denies delete and purge, so the
// sequences a scan passes never come back. In a cluster a direct get may
// be answered by a replica that is behind: a scan then ends early, never
// with a hole (a replica applies messages in order).
func (s *Store) Scan(ctx context.Context, afterSeq uint64, limit int) ([]statestore.RunEventRecord, uint64, error) {
	if limit <= 0 || limit > walkBatch {
		limit = walkBatch
	}
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	next := afterSeq
	var out []statestore.RunEventRecord
	eob, err := s.getBatch(ctx, directRequest{Seq: afterSeq + 1, NextFor: s.prefix + ".>", Batch: limit, MaxBytes: fetchMaxBytes}, func(m *storedMsg) {
		if m.seq <= next {
			return // never sent by the server; a scan must not go back
		}
		next = m.seq
		rec, err := s.record(m)
		if err != nil {
			s.log.Warn("scan: skipping a message that is not a record", zap.String("subject", m.subject), zap.Uint64("seq", m.seq), zap.Error(err))
			return
		}
		out = append(out, rec)
	})
	switch {
	case errors.Is(err, errNotFound):
		return out, next, nil
	case err != nil:
		return nil, afterSeq, unavailable("scan", err)
	}
	if eob.lastSeq > next {
		next = eob.lastSeq
	}
	return out, next, nil
}

// LastSeq returns the sequence of the stream's last message: a Scan that
// has reached it has read every event persisted before LastSeq was called.
// It asks the stream leader (stream info), never a replica that is behind.
func (s *Store) LastSeq(ctx context.Context) (uint64, error) {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	st, err := s.js.Stream(ctx, s.name)
	if err != nil {
		return 0, unavailable("stream info", err)
	}
	return st.CachedInfo().State.LastSeq, nil // js.Stream read the info
}
