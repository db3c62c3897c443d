package drain

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Open starts the drain monitor. It scans once at once, so a deadline that
// passed while no sidecar was running is raised at start.
func (c *Controller) Open(ctx context.Context) error {
	if c.opts.ActiveRuns == nil {
		return errors.New("drain: Options.ActiveRuns is required for the monitor")
	}
	ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	c.done = make(chan struct{})
	c.Scan(ctx)
	go c.loop(ctx)
	return nil
}

// Close stops the monitor and waits for it.
func (c *Controller) Close(ctx context.Context) error {
	if c.cancel == nil {
		return nil
	}
	c.cancel()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Nudge asks the monitor to look at runID now (a step of it finished).
func (c *Controller) Nudge(runID string) {
	select {
	case c.nudge <- runID:
	default: // the next scan sees it
	}
}

func (c *Controller) loop(ctx context.Context) {
	defer close(c.done)
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case runID := <-c.nudge:
			c.Check(ctx, runID)
		case <-t.C:
			c.Scan(ctx)
		}
	}
}

// Scan checks every active run and updates the drain gauges.
func (c *Controller) Scan(ctx context.Context) {
	ids, err := c.opts.ActiveRuns(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.logger.Warn("cannot list active runs; drains are not watched until it works", zap.Error(err))
		}
		return
	}
	draining, inFlight := 0, 0
	byStatus := map[string]int{}
	for _, id := range ids {
		snap := c.Check(ctx, id)
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
}

// Check ends the drain of runID if it is due: RunDrainCompleted once no
// step is in flight, RunDrainTimedOut (PAUSE_DRAIN_TIMEOUT) once the
// deadline has passed with steps still running. It returns the snapshot it
// saw, or nil.
func (c *Controller) Check(ctx context.Context, runID string) *statestore.RunSnapshot {
	snap, err := c.log.ProjectSnapshot(ctx, runID)
	if err != nil {
		if !errors.Is(err, statestore.ErrNotFound) && ctx.Err() == nil {
			c.logger.Warn("cannot read a run's state", zap.String("runId", runID), zap.Error(err))
		}
		return nil
	}
	if snap.Status != statestore.RunStatusPaused || snap.Pause == nil || snap.Pause.DrainEndedAt != "" {
		return snap
	}
	inflight := snap.InFlight()
	waited := c.waited(snap)
	switch {
	case len(inflight) == 0:
		res, err := c.append(ctx, snap, statestore.RunDrainCompleted, snap.Pause.Cycle, map[string]any{"waitedSeconds": waited.Seconds()})
		if err != nil {
			c.logger.Warn("could not record the end of a drain; retrying", zap.String("runId", runID), zap.Error(err))
			return snap
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
			c.logger.Warn("could not record a drain timeout; retrying", zap.String("runId", runID), zap.Error(err))
			return snap
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
	return snap
}
