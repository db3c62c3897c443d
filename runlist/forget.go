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
// watch, from every replica's memory. It does not wait for the list to
// include the log: it leaves a marker on the run's key whether the list
// has a row of the run yet or not, and the follower never writes a row
// over a marker (writeRow). A follower that is behind therefore cannot
// write the row again from records it read before they were removed, and
// once they are removed it does not meet them at all: on a log the list
// has not read yet (a generator's, a restored one, a new replica's),
// retention removes runs while the list is still being built.
//
// The marker is a purge marker that every watching replica receives and
// that the bucket drops after Options.MarkerTTL, so a forgotten run leaves
// nothing in the bucket for good (a bucket created before marker TTLs
// keeps a delete marker per forgotten run). The step durations the run
// added to stay: they are aggregates of its plan. Forgetting a run again,
// or one the list never had, writes the marker again and is harmless.
func (l *List) ForgetRun(ctx context.Context, runID string) error {
	key := keyRun + natsstore.RunToken(runID)
	ctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	defer cancel()
	var err error
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

// forgotten reports whether runID's row was forgotten: its key's last
// entry is ForgetRun's marker (until the marker expires). KeyValue.Get
// answers "not found" for a marker and for nothing alike; the key's
// history tells them apart.
func forgotten(ctx context.Context, kv jetstream.KeyValue, timeout time.Duration, runID string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	es, err := kv.History(ctx, keyRun+natsstore.RunToken(runID))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%w: read the row of %s: %w", ErrUnavailable, runID, err)
	case len(es) == 0:
		return false, nil
	}
	return es[len(es)-1].Operation() != jetstream.KeyValuePut, nil
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
