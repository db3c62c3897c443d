package taskworkers

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/ratelog"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// replayer is what the outbox replays queued events into. The replay is
// unconditional: a StepStarted that failed open is of a step that the gate
// allowed and that already runs, so it is recorded even if a RunPaused
// reached the log meanwhile (docs/events.md, "Fences").
type replayer interface {
	Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error)
}

// outbox holds StepStarted events that could not be appended within the
// write budget (Execution Semantics Contract v1.1 §5: StepStarted may fail
// open). A background loop replays them with backoff; flush replays one run's
// events synchronously, and the worker calls it before that run's
// StepCompleted or StepFailed, so the log never shows a step finishing before
// it started.
//
// The outbox is in memory. If the process dies with events in it, nothing
// is lost that matters: those steps' tasks were never reported to
// Conductor, so they are delivered again and their StepStarted re-emitted
// (same idempotencyKey).
type outbox struct {
	sink    replayer
	log     *zap.Logger
	metrics *Metrics

	// replayDown bounds the lines of replays that fail while the store is
	// away: one a minute for every run.
	replayDown ratelog.Limiter

	mu     sync.Mutex
	byRun  map[string][]*statestore.RunEventWrite
	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

func newOutbox(sink replayer, log *zap.Logger, m *Metrics) *outbox {
	return &outbox{sink: sink, log: log.Named("outbox"), metrics: m,
		byRun: map[string][]*statestore.RunEventWrite{}, wake: make(chan struct{}, 1)}
}

func (o *outbox) open(ctx context.Context) {
	ctx, o.cancel = context.WithCancel(ctx)
	o.done = make(chan struct{})
	go o.loop(ctx)
}

func (o *outbox) close() {
	if o.cancel != nil {
		o.cancel()
		<-o.done
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := o.sizeLocked(); n > 0 {
		o.log.Warn("closing with events still queued; their tasks will be delivered again", zap.Int("events", n))
	}
}

func (o *outbox) add(ev *statestore.RunEventWrite) {
	o.mu.Lock()
	o.byRun[ev.RunID] = append(o.byRun[ev.RunID], ev)
	o.metrics.outboxSize(o.sizeLocked())
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// flush appends runID's queued events in order and returns the first error.
func (o *outbox) flush(ctx context.Context, runID string) error {
	for {
		o.mu.Lock()
		q := o.byRun[runID]
		if len(q) == 0 {
			o.mu.Unlock()
			return nil
		}
		ev := q[0]
		o.mu.Unlock()
		if _, err := o.sink.Emit(ctx, ev); err != nil {
			return err
		}
		o.mu.Lock()
		if q := o.byRun[runID]; len(q) > 0 && q[0] == ev {
			o.byRun[runID] = q[1:]
			if len(o.byRun[runID]) == 0 {
				delete(o.byRun, runID)
			}
		}
		o.metrics.outboxSize(o.sizeLocked())
		o.mu.Unlock()
	}
}

func (o *outbox) loop(ctx context.Context) {
	defer close(o.done)
	backoff := 200 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.wake:
		case <-time.After(backoff):
		}
		o.mu.Lock()
		runs := make([]string, 0, len(o.byRun))
		for r := range o.byRun {
			runs = append(runs, r)
		}
		o.mu.Unlock()
		failed := false
		for _, r := range runs {
			fctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			if err := o.flush(fctx, r); err != nil && ctx.Err() == nil {
				failed = true
				o.replayDown.Warn(o.log, "replaying queued events failed; will retry", zap.String("runId", r), zap.Error(err))
			}
			cancel()
		}
		if failed {
			backoff = min(2*backoff, 10*time.Second)
		} else {
			backoff = 200 * time.Millisecond
			if len(runs) > 0 {
				o.replayDown.Recovered(o.log, "queued events replayed again")
			}
		}
	}
}

func (o *outbox) sizeLocked() int {
	n := 0
	for _, q := range o.byRun {
		n += len(q)
	}
	return n
}
