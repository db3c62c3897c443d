package runlist

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// DefaultMarkerTTL is how long the bucket keeps the marker of a forgotten
// row (Options.MarkerTTL).
const DefaultMarkerTTL = 15 * time.Minute

// ForgetRun removes runID's row from the list, for a run that leaves hot
// state (retention.Forgetter): from the bucket and, through the bucket's
// watch, from every replica's memory. It first waits until the list
// includes the whole log as it is now, so that the follower, behind, does
// not write the row again from the run's records while they are still in
// the log; it fails with ErrUnavailable when the list does not get there
// within Options.Timeout (retention tries again on its next pass).
//
// The row is purged with a marker that every watching replica receives
// and that the bucket drops after Options.MarkerTTL, so a forgotten run
// leaves nothing in the bucket for good (a bucket created before marker
// TTLs keeps a delete marker per forgotten run). The step durations the
// run added to stay: they are aggregates of its plan. A run the list does
// not have, or forgot before, is nothing to do.
func (l *List) ForgetRun(ctx context.Context, runID string) error {
	wctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	_, err := l.WaitIndexed(wctx)
	cancel()
	if err != nil {
		return fmt.Errorf("%w: forget run %q: the list does not include the log yet: %w", ErrUnavailable, runID, err)
	}
	key := keyRun + natsstore.RunToken(runID)
	ctx, cancel = context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	switch _, err := l.kv.Get(ctx, key); {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return nil
	case err != nil:
		return fmt.Errorf("%w: forget run %q: read its row: %w", ErrUnavailable, runID, err)
	}
	if l.markerTTL > 0 {
		err = l.kv.Purge(ctx, key, jetstream.PurgeTTL(l.markerTTL))
	} else {
		err = l.kv.Delete(ctx, key)
	}
	if err != nil {
		return fmt.Errorf("%w: forget run %q: %w", ErrUnavailable, runID, err)
	}
	l.opts.Metrics.forgot()
	return nil
}

// markerTTLOf is the marker TTL the bucket allows: opts' when the bucket
// was created with it, else 0 (an older bucket, which refuses a message
// TTL and keeps delete markers).
func markerTTLOf(ctx context.Context, kv jetstream.KeyValue, want time.Duration, log *zap.Logger) time.Duration {
	st, err := kv.Status(ctx)
	if err != nil {
		log.Warn("run list: cannot read the bucket's status; forgotten runs leave a delete marker", zap.Error(err))
		return 0
	}
	have := st.LimitMarkerTTL()
	if have <= 0 {
		log.Warn("run list: the bucket was created without marker TTLs; each run that leaves hot state keeps a small delete marker in it (recreate the bucket to drop them)", zap.String("bucket", kv.Bucket()))
		return 0
	}
	return want
}

// HasRow reports whether the list holds a row of runID: in this replica's
// memory, or else in the bucket (a finished run beyond the window).
func (l *List) HasRow(ctx context.Context, runID string) (bool, error) {
	l.mirror.mu.RLock()
	_, ok := l.mirror.st.rows[runID]
	l.mirror.mu.RUnlock()
	if ok {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	switch _, err := l.kv.Get(ctx, keyRun+natsstore.RunToken(runID)); {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%w: read the row of %s: %w", ErrUnavailable, runID, err)
	}
	return true, nil
}
