package drain

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// BatchEmitter appends the events of many runs in one call, each run's on
// the runSeq it was decided on (registry.Emitter's EmitBatch; the answer
// per run is statestore.BatchAppender's). Bulk control uses it when the
// Controller's Emitter has it.
type BatchEmitter interface {
	EmitBatch(ctx context.Context, runs []statestore.RunBatch) []statestore.BatchResult
}

// logged is one run's log part of a bulk action: part and its workflow
// for the engine call, or the run's answer (a state or an error).
type logged[T any] struct {
	part T
	wf   string
	st   *State
	err  error
}

// eachLog is the log part of a bulk action run by run (the single
// action's log part, bulkWorkers runs at a time).
func eachLog[T any](one func(context.Context, string) (T, string, *State, error)) func(context.Context, []string) []logged[T] {
	return func(ctx context.Context, runIDs []string) []logged[T] {
		out := make([]logged[T], len(runIDs))
		forEach(len(runIDs), func(i int) {
			l := &out[i]
			l.part, l.wf, l.st, l.err = one(ctx, runIDs[i])
		})
		return out
	}
}

// decided is one run's events of a batch, decided on snap.
type decided struct {
	snap   *statestore.RunSnapshot
	events []*statestore.RunEventWrite
}

// logBatch reads every run (bulkWorkers at a time), decides each run's
// events with decide (none: the run goes the single way), appends the
// decided runs' events with one EmitBatch, each run on the runSeq it was
// read at, and hands each run with its answer to done. A run that was not
// decided, or whose batch wrote nothing (it moved on: RUN_CHANGED; or the
// store failed), takes the single action's log part, which reads the run
// again and decides anew. ok is false when the Emitter has no EmitBatch.
func logBatch[T any](ctx context.Context, c *Controller, runIDs []string,
	decide func(*statestore.RunSnapshot) []*statestore.RunEventWrite,
	done func(ctx context.Context, runID string, d decided, r statestore.BatchResult) (T, string, *State, error),
	single func(context.Context, string) (T, string, *State, error)) (out []logged[T], ok bool) {
	be, ok := c.emit.(BatchEmitter)
	if !ok {
		return nil, false
	}
	out = make([]logged[T], len(runIDs))
	ds := make([]decided, len(runIDs))
	forEach(len(runIDs), func(i int) {
		snap, err := knownRuns{c.snaps}.ProjectSnapshot(ctx, runIDs[i])
		if err != nil {
			return
		}
		ds[i] = decided{snap: snap, events: decide(snap)}
	})
	var idx []int
	var in []statestore.RunBatch
	for i, d := range ds {
		if len(d.events) > 0 {
			idx = append(idx, i)
			in = append(in, statestore.RunBatch{LastSeq: d.snap.LastEventSeq, Events: d.events})
		}
	}
	res := make([]statestore.BatchResult, len(runIDs))
	wrote := make([]bool, len(runIDs))
	if len(in) > 0 {
		for j, r := range be.EmitBatch(ctx, in) {
			res[idx[j]] = r
			wrote[idx[j]] = len(r.Results) > 0 && r.Results[0].Persisted
		}
	}
	forEach(len(runIDs), func(i int) {
		l := &out[i]
		if wrote[i] {
			l.part, l.wf, l.st, l.err = done(ctx, runIDs[i], ds[i], res[i])
			return
		}
		l.part, l.wf, l.st, l.err = single(ctx, runIDs[i])
	})
	return out, true
}

// pauseLogs is the log part of PauseMany: each running run's RunPaused
// and, when nothing is in flight, its RunDrainCompleted right after it,
// in one EmitBatch (logBatch); the rest as pauseLog.
func (c *Controller) pauseLogs(ctx context.Context, runIDs []string, req PauseRequest) []logged[*pausing] {
	single := func(ctx context.Context, runID string) (*pausing, string, *State, error) {
		p, err := c.pauseLog(ctx, runID, req)
		if err != nil {
			return nil, "", nil, err
		}
		return p, p.wf, nil, nil
	}
	if req.TimeoutSeconds < 0 {
		return eachLog(single)(ctx, runIDs)
	}
	began := c.opts.Now()
	timeout := req.TimeoutSeconds
	if timeout == 0 {
		timeout = int64(c.opts.DefaultTimeout / time.Second)
	}
	decide := func(s *statestore.RunSnapshot) []*statestore.RunEventWrite {
		if s.Status != statestore.RunStatusRunning || s.CancelRequested || (c.adopted(s) && idleStep(s)) {
			// paused already, or not pausable, or an adopted run read
			// before its pause (syncIdleSteps): the single way answers
			return nil
		}
		cycle := nextCycle(s)
		paused, err := runEvent(s, pausedPayload(req, timeout), cycle, c.opts.Now)
		if err != nil || statestore.CheckTransition(s, paused) != nil {
			return nil
		}
		if len(s.InFlight()) > 0 || c.adopted(s) {
			// An adopted run's drain is decided once Conductor's pause
			// took effect (syncAdopted).
			return []*statestore.RunEventWrite{paused}
		}
		// Nothing in flight: the drain ends with the pause, decided on the
		// run as RunPaused will leave it and appended right after it
		// (endEmptyDrain's fence, in the same batch).
		after := appended(s, paused, statestore.AppendResult{EventID: paused.EventID, RunSeq: s.LastEventSeq + 1,
			PersistedAt: c.opts.Now().UTC().Format(time.RFC3339Nano), Persisted: true})
		if after == nil || after.Status != statestore.RunStatusPaused || len(after.InFlight()) > 0 {
			return []*statestore.RunEventWrite{paused}
		}
		ended, err := runEvent(after, statestore.RunDrainCompletedPayload{WaitedSeconds: seconds(0)}, cycle, c.opts.Now)
		if err != nil || statestore.CheckTransition(after, ended) != nil {
			return []*statestore.RunEventWrite{paused}
		}
		return []*statestore.RunEventWrite{paused, ended}
	}
	done := func(ctx context.Context, runID string, d decided, r statestore.BatchResult) (*pausing, string, *State, error) {
		cycle := d.events[0].LogicalAttemptID
		p := &pausing{runID: runID, wf: workflowOf(d.snap), req: req, snap: d.snap, cycle: cycle}
		c.opts.Metrics.pauseRecorded(c.opts.Now().Sub(began))
		if !req.ResumeAt.IsZero() {
			c.schedule(ctx, runID, cycle, req.ResumeAt)
		}
		p.drained = len(d.events) == 2 && len(r.Results) == 2 && r.Err == nil
		if p.drained && r.Results[1].Persisted {
			c.opts.Metrics.drainEnded("drained", 0)
			c.logger.Info("run paused; no step in flight, drain completed", zap.String("runId", runID), zap.Int64("cycle", cycle))
		}
		if !p.drained && len(d.events) == 2 {
			// RunPaused is in, its drain's end is not: the run moved on in
			// between (a store that is not atomic per run) or the store
			// failed. End it the single way, fenced on the run as it is.
			if r.Err != nil && !errors.Is(r.Err, statestore.ErrRunChanged) {
				c.logger.Warn("run paused; its drain's end was not recorded in the batch", zap.String("runId", runID), zap.Error(r.Err))
			}
			p.drained = c.endEmptyDrain(ctx, runID, cycle, nil)
		}
		if !p.drained && !c.adopted(d.snap) {
			// A step in flight, or a drain the run's changes keep open:
			// the monitor watches it (an adopted run's once its
			// Conductor tasks were read: syncAdopted).
			c.watchDrain(ctx, runID, cycle, len(d.snap.InFlight()), timeout)
		}
		return p, p.wf, nil, nil
	}
	if out, ok := logBatch(ctx, c, runIDs, decide, done, single); ok {
		return out
	}
	return eachLog(single)(ctx, runIDs)
}

// resumeLogs is the log part of ResumeMany: each paused run's RunResumed
// in one EmitBatch (logBatch); the rest as resumeLog.
func (c *Controller) resumeLogs(ctx context.Context, runIDs []string, req ResumeRequest) []logged[*resuming] {
	single := func(ctx context.Context, runID string) (*resuming, string, *State, error) {
		r, err := c.resumeLog(ctx, runID, req)
		if err != nil {
			return nil, "", nil, err
		}
		return r, r.wf, nil, nil
	}
	decide := func(s *statestore.RunSnapshot) []*statestore.RunEventWrite {
		if s.Status != statestore.RunStatusPaused || s.Pause == nil || len(s.HeldSteps()) > 0 || s.CancelRequested {
			return nil // the single way answers
		}
		w, err := runEvent(s, resumedPayload(req), s.Pause.Cycle, c.opts.Now)
		if err != nil || statestore.CheckTransition(s, w) != nil {
			return nil
		}
		return []*statestore.RunEventWrite{w}
	}
	done := func(_ context.Context, runID string, d decided, _ statestore.BatchResult) (*resuming, string, *State, error) {
		r := &resuming{runID: runID, wf: workflowOf(d.snap), snap: d.snap}
		if d.snap.Substatus == statestore.SubstatusDraining {
			c.opts.Metrics.drainEnded("resumed", c.waited(d.snap))
		}
		c.logger.Info("run resumed", zap.String("runId", runID), zap.Int64("cycle", d.snap.Pause.Cycle))
		return r, r.wf, nil, nil
	}
	out, ok := logBatch(ctx, c, runIDs, decide, done, single)
	if !ok {
		out = eachLog(single)(ctx, runIDs)
	}
	for _, l := range out {
		if l.part != nil {
			c.settleRetriedAdopted(ctx, l.part)
		}
	}
	return out
}

// cancelLogs is the first log part of CancelMany: each cancellable run's
// RunCancelRequested in one EmitBatch (logBatch); the rest as cancelLog
// (a run cancelled already, queued, ended or moved on). Each run's
// RunCancelled follows Conductor's terminate the single way.
func (c *Controller) cancelLogs(ctx context.Context, runIDs []string, reason, requestedBy string) []logged[*cancelling] {
	single := func(ctx context.Context, runID string) (*cancelling, string, *State, error) {
		cl, st, err := c.cancelLog(ctx, runID, reason, requestedBy)
		if cl == nil {
			return nil, "", st, err
		}
		return cl, cl.wf, nil, nil
	}
	decide := func(s *statestore.RunSnapshot) []*statestore.RunEventWrite {
		if s.Status == statestore.RunStatusCancelled || s.CancelRequested || s.Status == statestore.RunStatusQueued || statestore.IsTerminalRunStatus(s.Status) {
			return nil // the single way answers
		}
		w, err := runEvent(s, statestore.RunCancelRequestedPayload{Reason: reason, RequestedBy: requestedBy}, 1, c.opts.Now)
		if err != nil || statestore.CheckTransition(s, w) != nil {
			return nil
		}
		return []*statestore.RunEventWrite{w}
	}
	done := func(_ context.Context, runID string, d decided, r statestore.BatchResult) (*cancelling, string, *State, error) {
		cl := &cancelling{runID: runID, wf: workflowOf(d.snap), cancelled: statestore.RunCancelledPayload{Reason: reason, RequestedBy: requestedBy},
			after: appended(d.snap, d.events[0], r.Results[0])}
		return cl, cl.wf, nil, nil
	}
	if out, ok := logBatch(ctx, c, runIDs, decide, done, single); ok {
		return out
	}
	return eachLog(single)(ctx, runIDs)
}
