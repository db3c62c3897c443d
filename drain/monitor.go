package drain

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Open starts the drain monitor. It scans once at once, so a deadline that
// passed while no sidecar was running is raised at start.
// A second Open fails (ErrAlreadyOpen).
func (c *Controller) Open(ctx context.Context) error {
	if c.opts.ActiveRuns == nil {
		return errors.New("drain: Options.ActiveRuns is required for the monitor")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		return ErrAlreadyOpen
	}
	ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	c.done = make(chan struct{})
	c.scan(ctx)
	go c.loop(ctx)
	return nil
}

// ErrAlreadyOpen is returned by a second Open of a Controller.
var ErrAlreadyOpen = errors.New("drain: controller already open")

// Close stops the monitor and waits for it.
func (c *Controller) Close(ctx context.Context) error {
	c.mu.Lock()
	cancel, done := c.cancel, c.done
	c.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// MaxScanBackoff caps the wait between the monitor's scans while the store
// does not answer.
const MaxScanBackoff = 10 * time.Second

// Nudge asks the monitor to look at runID now (a step of it finished).
func (c *Controller) Nudge(runID string) {
	select {
	case c.nudge <- runID:
	default: // the next scan sees it
	}
}

// loop scans every Interval; while scans fail (the store or the run index
// does not answer) it waits twice as long each time, up to MaxScanBackoff.
func (c *Controller) loop(ctx context.Context) {
	defer close(c.done)
	wait := c.opts.Interval
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case runID := <-c.nudge:
			c.Check(ctx, runID)
		case <-t.C:
			if c.scan(ctx) {
				wait = c.opts.Interval
			} else {
				wait = min(2*wait, MaxScanBackoff)
			}
			t.Reset(wait)
		}
	}
}

// Scan checks every active run and updates the drain gauges.
func (c *Controller) Scan(ctx context.Context) { c.scan(ctx) }

// scan is Scan; it reports false when the run index or the store did not
// answer, and then stops at the first run it could not read.
func (c *Controller) scan(ctx context.Context) bool {
	ids, err := c.opts.ActiveRuns(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.warns.warn(c.logger, "cannot list active runs; drains are not watched until it works", zap.Error(err))
		}
		return false
	}
	draining, inFlight := 0, 0
	byStatus := map[string]int{}
	for _, id := range ids {
		snap, err := c.check(ctx, id)
		if err != nil {
			return false
		}
		if snap == nil {
			continue
		}
		status := snap.Status
		if snap.CancelRequested && !statestore.IsTerminalRunStatus(status) {
			status = "CANCELLING"
		}
		if !statestore.IsTerminalRunStatus(status) {
			byStatus[status]++
		}
		if snap.Substatus == statestore.SubstatusDraining {
			draining++
			inFlight += len(snap.InFlight())
		}
	}
	c.opts.Metrics.gauges(draining, inFlight, byStatus)
	c.warns.recovered(c.logger, "the drain monitor reads the store again")
	return true
}

// Check ends the drain of runID if it is due: RunDrainCompleted once no
// step is in flight, RunDrainTimedOut (PAUSE_DRAIN_TIMEOUT) once the
// deadline has passed with steps still running. It returns the snapshot it
// saw, or nil.
func (c *Controller) Check(ctx context.Context, runID string) *statestore.RunSnapshot {
	snap, _ := c.check(ctx, runID)
	return snap
}

// check is Check; its error is set when the store did not answer.
func (c *Controller) check(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := c.snaps.ProjectSnapshot(ctx, runID)
	if errors.Is(err, statestore.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		if ctx.Err() == nil {
			c.warns.warn(c.logger, "cannot read a run's state", zap.String("runId", runID), zap.Error(err))
		}
		return nil, err
	}
	if snap.Status != statestore.RunStatusPaused || snap.Pause == nil || snap.Pause.DrainEndedAt != "" {
		return snap, nil
	}
	inflight := snap.InFlight()
	waited := c.waited(snap)
	switch {
	case len(inflight) == 0:
		res, err := c.append(ctx, snap, statestore.RunDrainCompleted, snap.Pause.Cycle, map[string]any{"waitedSeconds": waited.Seconds()})
		if err != nil {
			c.warns.warn(c.logger, "could not record the end of a drain; retrying", zap.String("runId", runID), zap.Error(err))
			return snap, nil
		}
		if res.Persisted {
			c.opts.Metrics.drainEnded("drained", waited)
			c.logger.Info("drain completed: no step in flight", zap.String("runId", runID), zap.Int64("cycle", snap.Pause.Cycle), zap.Duration("waited", waited))
		}
	case waited >= timeoutOf(snap.Pause, c.opts.DefaultTimeout):
		res, err := c.append(ctx, snap, statestore.RunDrainTimedOut, snap.Pause.Cycle, map[string]any{
			"code": statestore.PauseDrainTimeoutCode, "inFlightStepIds": inflight, "waitedSeconds": waited.Seconds(),
		})
		if err != nil {
			c.warns.warn(c.logger, "could not record a drain timeout; retrying", zap.String("runId", runID), zap.Error(err))
			return snap, nil
		}
		if res.Persisted {
			// Counted by the replica whose append persisted: one alert between replicas.
			c.opts.Metrics.drainEnded("timed_out", waited)
			c.opts.Metrics.timeout()
			c.logger.Warn("PAUSE_DRAIN_TIMEOUT: drain deadline passed with steps still running; the run is PAUSED and they keep running",
				zap.String("code", statestore.PauseDrainTimeoutCode), zap.String("runId", runID), zap.Int64("cycle", snap.Pause.Cycle),
				zap.Strings("inFlightStepIds", inflight), zap.Duration("waited", waited))
		}
	}
	return snap, nil
}

// warnLimiter logs a warning at most once a minute, with the number of
// warnings it held back since the last, so that a store that is down for
// an hour costs 60 lines, not one per run every 250 ms.
type warnLimiter struct {
	mu       sync.Mutex
	last     time.Time
	held     int
	degraded bool
}

func (l *warnLimiter) warn(log *zap.Logger, msg string, fields ...zap.Field) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.degraded = true
	if time.Since(l.last) < time.Minute {
		l.held++
		return
	}
	if l.held > 0 {
		fields = append(fields, zap.Int("warningsHeldBack", l.held))
	}
	l.last, l.held = time.Now(), 0
	log.Warn(msg+" (logged at most once a minute)", fields...)
}

// recovered logs msg once after warnings, when things work again.
func (l *warnLimiter) recovered(log *zap.Logger, msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.degraded {
		l.degraded, l.held, l.last = false, 0, time.Time{}
		log.Info(msg)
	}
}
