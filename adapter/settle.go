package adapter

// Settling a plan run before its end: the tasks Conductor ended without
// the step's worker (an update made by hand, a skiptask).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// maxPlanStepCounts bounds planStepCounts; it starts over beyond.
const maxPlanStepCounts = 1000

// planStepCounts caches the number of steps of each plan version's
// workflow definition (by workflow name): plans are immutable.
type planStepCounts struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *planStepCounts) get(name string) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.counts[name]
	return n, ok
}

func (c *planStepCounts) put(name string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil || len(c.counts) >= maxPlanStepCounts {
		c.counts = map[string]int{}
	}
	c.counts[name] = n
}

// settlePlan records, before a plan run's end, what Conductor did to its
// steps' tasks that the log lacks because no worker of the sidecar
// reported it: a task Conductor shows ended (an update made in Conductor
// by hand) while the log has its step in flight is recorded as Conductor
// ended it, and a task Conductor skipped (skiptask) of a step the log
// never started is recorded StepSkipped. The sidecar's own workers and the
// task proxy record an outcome before Conductor has it, so such a task is
// someone else's doing. Conductor's tasks are read only when the log
// leaves room for it: a step in flight, or, for a run Conductor
// completed, fewer steps ended than the plan has. A task Conductor ended
// that the log never started (a worker that polled and reported to
// Conductor directly) is left as it is.
func (w *Watcher) settlePlan(ctx context.Context, rec *Run, snap *statestore.RunSnapshot, engineStatus string) error {
	if snap == nil || !w.mayNeedSettling(ctx, rec, snap, engineStatus) {
		return nil
	}
	wf, err := w.conductor.WorkflowTasks(ctx, rec.WorkflowID)
	if err != nil {
		return err
	}
	_, err = w.settleTasks(ctx, rec, snap, wf.Tasks, "")
	return err
}

// SettleTasks records what the log lacks of Conductor's end of plan run
// runID's tasks (drain.PlanTasks): a cancel through the sidecar calls it
// once Conductor terminated the workflow, before RunCancelled, so that a
// step Conductor ended then (CANCELED: an outside worker's, or one of a
// worker on another replica) does not stay in flight in the ended run.
// An adopted run, or one the index does not know, records nothing; nor
// do the tasks in skip (steps this process interrupted, whose workers
// record their own ends, with their output).
func (w *Watcher) SettleTasks(ctx context.Context, runID string, skip []string) error {
	rec, _, err := w.runs.get(ctx, runID)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if rec.IsAdopted() || rec.WorkflowID == "" {
		return nil
	}
	wf, err := w.conductor.WorkflowTasks(ctx, rec.WorkflowID)
	if err != nil {
		return err
	}
	tasks := slices.DeleteFunc(wf.Tasks, func(t model.Task) bool { return slices.Contains(skip, t.TaskId) })
	_, err = w.settleTasks(ctx, rec, nil, tasks, "")
	return err
}

// SettleRetriedStep records, at a RETRY_STEP of plan run runID's held step
// stepID (drain.HeldTasks), what Conductor made of the step's task that
// the log lacks. A held task completed in Conductor by hand is never
// polled again, so the retried attempt would never run: it is recorded as
// the attempt Conductor completed (StepStarted and StepCompleted naming
// the task, with Conductor's times). A held task Conductor still holds,
// an adopted run and a run the index does not know record nothing. It
// reports whether it recorded anything.
func (w *Watcher) SettleRetriedStep(ctx context.Context, runID, stepID string) (bool, error) {
	rec, _, err := w.runs.get(ctx, runID)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if rec.IsAdopted() || rec.WorkflowID == "" {
		return false, nil
	}
	wf, err := w.conductor.WorkflowTasks(ctx, rec.WorkflowID)
	if err != nil {
		return false, err
	}
	// Only a completed task: one failed by hand in a paused workflow is
	// retried by Conductor at the resume while it has an engine retry
	// left, and that retry is the attempt to run (at the run's end the
	// watcher records a failure Conductor did not retry).
	var last *model.Task
	for i := range wf.Tasks {
		if id, ok := plan.StepIDFromRef(wf.Tasks[i].ReferenceTaskName); ok && id == stepID {
			last = &wf.Tasks[i]
		}
	}
	if last == nil || last.Status != model.CompletedTask {
		return false, nil
	}
	return w.settleTasks(ctx, rec, nil, wf.Tasks, stepID)
}

// settleTasks records what Conductor made of the plan run's tasks that
// the log lacks (endedInConductor), step by step in Conductor's order of
// the tasks, each step's latest task only; only, when set, limits it to
// that step. snap, when set, is the run as last read. It reports whether
// it recorded anything.
func (w *Watcher) settleTasks(ctx context.Context, rec *Run, snap *statestore.RunSnapshot, tasks []model.Task, only string) (bool, error) {
	last := map[string]*model.Task{} // each step's latest task
	for i := range tasks {
		t := &tasks[i]
		if stepID, ok := plan.StepIDFromRef(t.ReferenceTaskName); ok {
			last[stepID] = t
		}
	}
	ref := statestore.RunRef{RunID: rec.RunID, TenantID: rec.TenantID, ProjectID: rec.ProjectID,
		EnvironmentID: rec.EnvironmentID, PlanID: rec.PlanID, PlanVersion: rec.PlanVersion}
	recordedAny := false
	for i := range tasks { // in Conductor's order
		t := &tasks[i]
		stepID, ok := plan.StepIDFromRef(t.ReferenceTaskName)
		if !ok || last[stepID] != t || (only != "" && stepID != only) {
			continue
		}
		// At most two events a task: a retried attempt Conductor
		// completed is started, then completed.
		for range 2 {
			var recorded bool
			var err error
			snap, _, err = statestore.Fenced(ctx, statestore.ReadFirst(snap, w.snaps), w.emitter, rec.RunID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
				ev, err := endedInConductor(ref, s, stepID, t)
				if ev == nil || err != nil {
					return nil, err
				}
				if statestore.Decide(s, ev.EventType, stepID, ev.LogicalAttemptID).Outcome != statestore.Apply {
					return nil, nil // the log moved on (the worker's outcome came first)
				}
				recorded = true
				return ev, nil
			})
			if err != nil {
				return recordedAny, fmt.Errorf("adapter: watcher: record task %s of run %s as Conductor ended it: %w", t.TaskId, rec.RunID, err)
			}
			if !recorded {
				break
			}
			// snap is the run before the append: read the next decision
			// afresh (the same event decided again would be deduplicated).
			snap, recordedAny = nil, true
			w.log.Info("recorded a task of the run as Conductor ended it (not by the step's worker)",
				zap.String("runId", rec.RunID), zap.String("stepId", stepID), zap.String("taskId", t.TaskId), zap.String("status", string(t.Status)))
			w.opts.Metrics.watcherAction(actionSettledTask)
		}
	}
	return recordedAny, nil
}

// mayNeedSettling reports whether the log leaves room for a task ended in
// Conductor that it lacks: a step in flight or retried and not started,
// or, Conductor having completed the run, fewer steps ended than the plan
// has.
func (w *Watcher) mayNeedSettling(ctx context.Context, rec *Run, snap *statestore.RunSnapshot, engineStatus string) bool {
	ended := 0
	for _, st := range snap.Steps {
		switch {
		case st.Status == statestore.StepStatusRunning, st.Status == statestore.StepStatusPending && st.RetryRequested:
			return true
		case st.Status == statestore.StepStatusSuccess, st.Status == statestore.StepStatusFailed, st.Status == statestore.StepStatusSkipped:
			ended++
		}
	}
	if engineStatus != string(model.CompletedWorkflow) {
		return false
	}
	n, ok := w.stepCounts.get(rec.WorkflowName)
	if !ok {
		def, err := w.conductor.WorkflowDef(ctx, rec.WorkflowName, rec.WorkflowVersion)
		if err != nil {
			return true // read the tasks: they say what ran
		}
		n = len(plan.StepsOf(def))
		w.stepCounts.put(rec.WorkflowName, n)
	}
	return ended < n
}

// endedInConductor is the event that records step stepID's task t as
// Conductor ended it, or nil when the log has nothing to add: t ended
// (not retried), or was CANCELED with its workflow, while the log has the
// step in flight, t was skipped
// while the log never started the step, or t was completed while the log
// has the step's retry requested (a held task completed by hand: its
// StepStarted first).
func endedInConductor(ref statestore.RunRef, s *statestore.RunSnapshot, stepID string, t *model.Task) (*statestore.RunEventWrite, error) {
	st := s.Step(stepID)
	engine := int64(t.RetryCount) + 1
	status := string(t.Status)
	switch {
	case status == "SKIPPED" && (st == nil || st.Status == statestore.StepStatusPending):
		logical := int64(1)
		if st != nil {
			logical = st.LogicalAttemptID
		}
		return statestore.NewEvent(ref, statestore.StepSkipped, stepID, engine, logical, statestore.StepSkippedPayload{Reason: "Conductor skipped the task"})
	case st != nil && st.Status == statestore.StepStatusPending && st.RetryRequested && !t.Retried && endedTask(status):
		// A held task ended in Conductor by hand, then retried: no
		// worker polls it again, so the retried attempt is the one
		// Conductor ended. Started here, ended by the next call.
		return statestore.NewEvent(ref, statestore.StepStarted, stepID, engine, st.LogicalAttemptID,
			statestore.StepStartedPayload{EngineStartedAt: statestore.EngineTime(t.StartTime), EngineTaskID: t.TaskId})
	case st == nil || st.Status != statestore.StepStatusRunning || t.Retried:
		return nil, nil
	case status == "COMPLETED":
		return statestore.NewEvent(ref, statestore.StepCompleted, stepID, engine, st.LogicalAttemptID,
			statestore.StepCompletedPayload{EngineEndedAt: statestore.EngineTime(t.EndTime), EngineTaskID: t.TaskId})
	case endedTask(status), status == "CANCELED":
		return statestore.NewEvent(ref, statestore.StepFailed, stepID, engine, st.LogicalAttemptID,
			statestore.StepFailedPayload{EngineEndedAt: statestore.EngineTime(t.EndTime), EngineTaskID: t.TaskId,
				Error: statestore.EngineTaskFailure(status, t.ReasonForIncompletion)})
	}
	return nil, nil
}

// endedTask reports whether Conductor's task status is an end the log can
// record: COMPLETED, or a failure.
func endedTask(status string) bool {
	switch status {
	case "COMPLETED", "FAILED", "FAILED_WITH_TERMINAL_ERROR", "COMPLETED_WITH_ERRORS":
		return true
	}
	return false
}
