package adapter

// Settling a plan run before its end: the tasks Conductor ended without
// the step's worker (an update made by hand, a skiptask).

import (
	"context"
	"fmt"
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
	last := map[string]*model.Task{} // each step's latest task
	for i := range wf.Tasks {
		t := &wf.Tasks[i]
		if stepID, ok := plan.StepIDFromRef(t.ReferenceTaskName); ok {
			last[stepID] = t
		}
	}
	ref := statestore.RunRef{RunID: rec.RunID, TenantID: rec.TenantID, ProjectID: rec.ProjectID,
		EnvironmentID: rec.EnvironmentID, PlanID: rec.PlanID, PlanVersion: rec.PlanVersion}
	for i := range wf.Tasks { // in Conductor's order
		t := &wf.Tasks[i]
		stepID, ok := plan.StepIDFromRef(t.ReferenceTaskName)
		if !ok || last[stepID] != t {
			continue
		}
		var recorded bool
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
			return fmt.Errorf("adapter: watcher: record task %s of run %s as Conductor ended it: %w", t.TaskId, rec.RunID, err)
		}
		if recorded {
			w.log.Info("recorded a task of the run as Conductor ended it (not by the step's worker)",
				zap.String("runId", rec.RunID), zap.String("stepId", stepID), zap.String("taskId", t.TaskId), zap.String("status", string(t.Status)))
			w.opts.Metrics.watcherAction(actionSettledTask)
		}
	}
	return nil
}

// mayNeedSettling reports whether the log leaves room for a task ended in
// Conductor that it lacks: a step in flight, or, Conductor having
// completed the run, fewer steps ended than the plan has.
func (w *Watcher) mayNeedSettling(ctx context.Context, rec *Run, snap *statestore.RunSnapshot, engineStatus string) bool {
	ended := 0
	for _, st := range snap.Steps {
		switch st.Status {
		case statestore.StepStatusRunning:
			return true
		case statestore.StepStatusSuccess, statestore.StepStatusFailed, statestore.StepStatusSkipped:
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
// (not retried) while the log has the step in flight, or t was skipped
// while the log never started the step.
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
	case st == nil || st.Status != statestore.StepStatusRunning || t.Retried:
		return nil, nil
	case status == "COMPLETED":
		return statestore.NewEvent(ref, statestore.StepCompleted, stepID, engine, st.LogicalAttemptID,
			statestore.StepCompletedPayload{EngineEndedAt: statestore.EngineTime(t.EndTime), EngineTaskID: t.TaskId})
	case status == "FAILED", status == "FAILED_WITH_TERMINAL_ERROR", status == "COMPLETED_WITH_ERRORS":
		msg := t.ReasonForIncompletion
		if msg == "" {
			msg = "Conductor reported the task " + status
		}
		return statestore.NewEvent(ref, statestore.StepFailed, stepID, engine, st.LogicalAttemptID,
			statestore.StepFailedPayload{EngineEndedAt: statestore.EngineTime(t.EndTime), EngineTaskID: t.TaskId,
				Error: &statestore.StepError{Code: CodeEngineTask + status, Message: msg, Retryable: status == "FAILED"}})
	}
	return nil, nil
}
