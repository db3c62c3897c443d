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

// loop checks the watched runs every Interval and passes over every active
// run every FullScanInterval; while checks fail (the store or the run
// index does not answer) it waits twice as long each time, up to
// MaxScanBackoff.
func (c *Controller) loop(ctx context.Context) {
	defer close(c.done)
	wait := c.opts.Interval
	t := time.NewTimer(wait)
	defer t.Stop()
	lastFull := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case runID := <-c.nudge:
			c.Check(ctx, runID)
		case <-t.C:
			ok := true
			if time.Since(lastFull) >= c.opts.FullScanInterval {
				ok = c.scan(ctx)
				if ok {
					lastFull = time.Now()
				}
			}
			ok = ok && c.checkWatched(ctx)
			if ok {
				wait = c.opts.Interval
			} else {
				wait = min(2*wait, MaxScanBackoff)
			}
			t.Reset(wait)
		}
	}
}

// watch adds runID to the watched runs (on) or removes it.
func (c *Controller) watch(runID string, on bool) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if on {
		c.watched[runID] = struct{}{}
	} else {
		delete(c.watched, runID)
	}
}

// Watched is the number of runs the monitor checks every Interval.
func (c *Controller) Watched() int {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return len(c.watched)
}

// checkWatched checks every watched run (its cost is one snapshot read per
// open drain, whatever the number of active runs) and sets the drain
// gauges. It reports false when the store did not answer.
func (c *Controller) checkWatched(ctx context.Context) bool {
	c.wmu.Lock()
	ids := make([]string, 0, len(c.watched))
	for id := range c.watched {
		ids = append(ids, id)
	}
	c.wmu.Unlock()
	draining, inFlight := 0, 0
	for _, id := range ids {
		snap, err := c.check(ctx, id)
		if err != nil {
			return false
		}
		if snap != nil && snap.Substatus == statestore.SubstatusDraining {
			draining++
			inFlight += len(snap.InFlight())
		}
	}
	c.opts.Metrics.drainGauges(draining, inFlight)
	c.warns.recovered(c.logger, "the drain monitor reads the store again")
	return true
}

// Scan passes over every active run: it ends the drains that are due,
// watches those still open, and sets the runs-by-status gauges.
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
	}
	c.opts.Metrics.statusGauges(byStatus)
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
		c.watch(runID, false)
		return snap, nil
	}
	c.watch(runID, true)
	inflight := snap.InFlight()
	waited := c.waited(snap)
	switch {
	case len(inflight) == 0:
		res, err := c.append(ctx, snap, statestore.RunDrainCompleted, snap.Pause.Cycle, map[string]any{"waitedSeconds": waited.Seconds()})
		if err != nil {
			c.warns.warn(c.logger, "could not record the end of a drain; retrying", zap.String("runId", runID), zap.Error(err))
			return snap, nil
		}
		c.watch(runID, false)
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
		c.watch(runID, false)
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
