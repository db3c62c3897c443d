package adapter

import (
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"
)

// A run waits for a worker when Conductor keeps a worker task of its
// RUNNING workflow SCHEDULED, handed to no poll, for WaitingAfter or more:
// no worker polls the task's type (or its domain), the workers are too few
// for the backlog (or the definition's rate limit holds it), or Conductor's
// queue lost the task (a stalled store). The run stays RUNNING with nothing
// in flight and no event; only a read of its tasks shows why. The scan's
// full reads (each run in its turn, FullReadRate a second) look for such a
// task, so seeing it costs no read of its own; what is kept is one entry
// per waiting run.

// waitingRun is what the watcher keeps of a run that waits: the task it
// was last seen waiting on.
type waitingRun struct {
	taskID, taskType string
}

// waitingTask returns the worker task of tasks that Conductor has kept
// SCHEDULED the longest, if that is after or more: since its scheduled
// time, or since the delay Conductor put on it (a retry's delay, a start
// delay: callbackAfterSeconds) ran out. System tasks are Conductor's to run
// (3.21 shows an HTTP task SCHEDULED while it makes the call) and control
// tasks wait by design; neither counts.
func waitingTask(tasks []model.Task, now time.Time, after time.Duration) *model.Task {
	var out *model.Task
	var oldest int64
	for i := range tasks {
		t := &tasks[i]
		if t.Status != "SCHEDULED" || t.ScheduledTime <= 0 || !IsWorkerTask(t.TaskType) {
			continue
		}
		due := t.ScheduledTime + 1000*t.CallbackAfterSeconds
		if now.Sub(time.UnixMilli(due)) < after {
			continue
		}
		if out == nil || due < oldest {
			out, oldest = t, due
		}
	}
	return out
}

// noteWaiting records what a full read of rec's RUNNING workflow showed:
// t, the task it waits on, or nil. A run found waiting is logged once
// (per task), and counted in sidecar_run_watcher_waiting_runs until a
// read shows it no longer waits, it ends, or another replica takes it.
func (w *Watcher) noteWaiting(rec *Run, t *model.Task) {
	w.mu.Lock()
	defer w.mu.Unlock()
	old, was := w.waiting[rec.RunID]
	if t == nil {
		if was {
			delete(w.waiting, rec.RunID)
			w.opts.Metrics.setWaitingRuns(len(w.waiting))
		}
		return
	}
	w.waiting[rec.RunID] = waitingRun{taskID: t.TaskId, taskType: t.TaskType}
	w.opts.Metrics.setWaitingRuns(len(w.waiting))
	if !was || old.taskID != t.TaskId {
		w.log.Warn("a task of the run has waited for a worker for a long time: no worker polls its type, too few do, or Conductor's queue lost it (docs/operations.md, TASK_WAITING_FOR_WORKER)",
			zap.String("runId", rec.RunID), zap.String("workflowId", rec.WorkflowID), zap.String("taskId", t.TaskId),
			zap.String("taskType", t.TaskType), zap.String("domain", rec.TaskDomain),
			zap.Duration("waiting", time.Since(time.UnixMilli(t.ScheduledTime+1000*t.CallbackAfterSeconds)).Round(time.Second)))
	}
}

// clearWaiting forgets runID (it ended, or is paused).
func (w *Watcher) clearWaiting(runID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.waiting[runID]; ok {
		delete(w.waiting, runID)
		w.opts.Metrics.setWaitingRuns(len(w.waiting))
	}
}

// pruneWaiting forgets the waiting runs that are not among owned (the
// open runs this replica owns, as its scan saw them): ended meanwhile, or
// taken by another replica. It looks at owned only when a run waits.
func (w *Watcher) pruneWaiting(owned []cachedRun) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waiting) == 0 {
		return
	}
	open := make(map[string]bool, len(owned))
	for _, r := range owned {
		open[r.rec.RunID] = true
	}
	for id := range w.waiting {
		if !open[id] {
			delete(w.waiting, id)
		}
	}
	w.opts.Metrics.setWaitingRuns(len(w.waiting))
}
