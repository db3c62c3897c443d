package adapter

import (
	"context"
	"errors"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"
)

// suspect is a run whose workflow Conductor still showed RUNNING right
// after a task that may end it was reported (a nudge).
type suspect struct {
	since time.Time
	// next is when it is checked (again).
	next time.Time
	// stuck is set once a check found it RUNNING with every task terminal.
	stuck bool
	// wait doubles after each check that found it stuck, up to maxStuckWait.
	wait time.Duration
}

// maxStuckWait caps the time between two decides of a stuck workflow.
const maxStuckWait = 5 * time.Minute

// suspectRun notes a run whose workflow was RUNNING after a nudge. It is
// checked StuckAfter later (checkSuspects).
func (w *Watcher) suspectRun(runID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.suspects[runID]; !ok {
		now := time.Now()
		w.suspects[runID] = &suspect{since: now, next: now.Add(w.opts.StuckAfter), wait: w.opts.StuckAfter}
	}
}

// clearSuspect forgets a run (it ended, or Conductor goes on with it).
func (w *Watcher) clearSuspect(runID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.suspects, runID)
	w.setStuckGauge()
}

// setStuckGauge exports the number of stuck runs; w.mu is held.
func (w *Watcher) setStuckGauge() {
	n := 0
	for _, s := range w.suspects {
		if s.stuck {
			n++
		}
	}
	w.opts.Metrics.setStuck(n)
}

// checkSuspects looks again at the suspects whose time has come: a
// workflow that is still RUNNING with every task terminal is one Conductor
// forgot to decide (its decider queue lost it, or two decides raced;
// JOINs still in progress over finished branches count as done, allDone); the
// watcher asks Conductor to decide it (PUT /workflow/decide/{id}), counts
// sidecar_run_watcher_actions_total{action="decide"} and keeps it in
// sidecar_run_watcher_stuck_runs until it moves, deciding again with a
// doubling wait. A workflow with a task still to run is Conductor's to go
// on with, and is forgotten. Its cost is one workflow read per suspect,
// and suspects come only from nudges: it grows with what changed.
func (w *Watcher) checkSuspects(ctx context.Context) error {
	now := time.Now()
	w.mu.Lock()
	var due []string
	for id, s := range w.suspects {
		if !now.Before(s.next) {
			due = append(due, id)
		}
	}
	w.mu.Unlock()
	var errs []error
	for _, runID := range due {
		errs = append(errs, w.checkSuspect(ctx, runID))
	}
	return errors.Join(errs...)
}

func (w *Watcher) checkSuspect(ctx context.Context, runID string) error {
	rec, _, err := w.runs.get(ctx, runID)
	if errors.Is(err, ErrNotFound) || (err == nil && rec.State != RunStateStarted) {
		w.clearSuspect(runID)
		return nil
	}
	if err != nil {
		return err
	}
	wf, err := w.conductor.Workflow(ctx, rec.WorkflowID, true)
	if errors.Is(err, ErrNotFound) {
		w.clearSuspect(runID)
		return nil
	}
	if err != nil {
		return err
	}
	if wf.Status != model.RunningWorkflow || !allDone(wf.Tasks) {
		// Ended (the next check records it), paused, or work to do.
		w.clearSuspect(runID)
		if wf.Status != model.RunningWorkflow && wf.Status != model.PausedWorkflow {
			return w.Check(ctx, runID)
		}
		return nil
	}
	err = w.conductor.Decide(ctx, rec.WorkflowID)
	w.mu.Lock()
	s := w.suspects[runID]
	if s != nil {
		s.stuck = true
		s.next = time.Now().Add(s.wait)
		s.wait = min(2*s.wait, maxStuckWait)
		w.setStuckGauge()
	}
	w.mu.Unlock()
	if err != nil {
		return err
	}
	w.opts.Metrics.watcherAction(actionDecide)
	w.log.Warn("workflow RUNNING in Conductor with every task done; asked Conductor to decide it",
		zap.String("runId", runID), zap.String("workflowId", rec.WorkflowID), zap.Int("tasks", len(wf.Tasks)))
	return nil
}

// allDone reports whether a workflow has nothing left to do but be
// decided: every task is terminal, or only JOINs (EXCLUSIVE_JOINs) are
// still in progress over tasks that are all terminal (a JOIN completes
// when Conductor decides the workflow: one left in progress over finished
// branches is a decide Conductor lost). At least one task that is not a
// JOIN is needed.
func allDone(tasks []model.Task) bool {
	done := 0
	for _, t := range tasks {
		switch {
		case terminalTask(t.Status):
			done++
		case (t.TaskType == "JOIN" || t.TaskType == "EXCLUSIVE_JOIN") && t.Status == model.InProgressTask:
		default:
			return false
		}
	}
	return done > 0
}

// terminalTask reports whether a task in status s has ended.
func terminalTask(s model.TaskResultStatus) bool {
	switch s {
	case model.CompletedTask, model.FailedTask, model.FailedWithTerminalErrorTask, "CANCELED", "SKIPPED", "TIMED_OUT", "COMPLETED_WITH_ERRORS":
		return true
	}
	return false
}
