package taskworkers

// The watch of a step the sidecar's own worker runs: its task read back
// from Conductor while it runs, so that an action taken in Conductor (the
// task completed or failed by hand, the workflow terminated or removed)
// ends it.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// engineReadTimeout bounds one read of a running step's task.
const engineReadTimeout = 2 * time.Second

// engineWatch reads a running step's task back from Conductor every
// period, first once the step has run that long (a step that ends sooner
// costs nothing but a timer), and interrupts the step when Conductor shows
// the task ended, or has it no more.
type engineWatch struct {
	mu    sync.Mutex
	timer *time.Timer
	ended *model.Task // the task as Conductor ended it
	gone  bool        // Conductor has the task no more (workflow removed)
	done  bool
}

// watchEngineTask starts the watch of t, run under interrupt; stop ends
// it. A nil watch (no Tasks, or the watch off) watches nothing.
func (w *Worker) watchEngineTask(t *model.Task, interrupt context.CancelFunc, log *zap.Logger) *engineWatch {
	if w.opts.Tasks == nil || w.opts.EngineTaskCheck < 0 {
		return nil
	}
	ew := &engineWatch{}
	var check func()
	check = func() {
		ctx, cancel := context.WithTimeout(w.workCtx, engineReadTimeout)
		cur, err := w.opts.Tasks.Task(ctx, t.TaskId)
		cancel()
		ew.mu.Lock()
		defer ew.mu.Unlock()
		if ew.done {
			return
		}
		switch {
		case errors.Is(err, errcode.NotFound):
			ew.gone = true
		case err != nil:
			log.Debug("could not read the running step's task back from Conductor; read again later", zap.Error(err))
		case endedInConductor(cur.Status):
			ew.ended = cur
		}
		if ew.gone || ew.ended != nil {
			ew.done = true
			log.Info("Conductor ended the running step's task (an action taken in Conductor); interrupting the step",
				zap.String("status", statusOf(cur)), zap.Bool("taskGone", ew.gone))
			interrupt()
			return
		}
		ew.timer.Reset(w.opts.EngineTaskCheck)
	}
	ew.mu.Lock()
	ew.timer = time.AfterFunc(w.opts.EngineTaskCheck, check)
	ew.mu.Unlock()
	return ew
}

// engineFinalCheckAfter is how long a step must have run for its task to
// be read back once more when it ends on its own, before its outcome is
// recorded: an action taken in Conductor after the last periodic read is
// found then. A step that ends sooner costs no read.
const engineFinalCheckAfter = time.Second

// stop ends the watch; it reports the task as Conductor ended it (nil:
// it did not, as far as the watch saw) and whether Conductor had it no
// more.
func (ew *engineWatch) stop() (ended *model.Task, gone bool) {
	if ew == nil {
		return nil, false
	}
	ew.mu.Lock()
	defer ew.mu.Unlock()
	ew.done = true
	ew.timer.Stop()
	return ew.ended, ew.gone
}

// finalCheck reads t back from Conductor once more, for a step that ran
// at least engineFinalCheckAfter and ended on its own (not interrupted),
// unless the watch already saw its end. A read that fails says nothing.
func (w *Worker) finalCheck(t *model.Task, ew *engineWatch, ran time.Duration, ended engineEnd) engineEnd {
	if ew == nil || ended.task != nil || ended.gone || ran < engineFinalCheckAfter {
		return ended
	}
	ctx, cancel := context.WithTimeout(w.workCtx, engineReadTimeout)
	defer cancel()
	cur, err := w.opts.Tasks.Task(ctx, t.TaskId)
	switch {
	case errors.Is(err, errcode.NotFound):
		ended.gone = true
	case err == nil && endedInConductor(cur.Status):
		ended.task = cur
	}
	return ended
}

func statusOf(t *model.Task) string {
	if t == nil {
		return ""
	}
	return string(t.Status)
}

// endedInConductor reports whether a task status is one Conductor ends a
// task with.
func endedInConductor(s model.TaskResultStatus) bool {
	switch s {
	case "COMPLETED", "COMPLETED_WITH_ERRORS", "FAILED", "FAILED_WITH_TERMINAL_ERROR", "TIMED_OUT", "CANCELED", "SKIPPED":
		return true
	}
	return false
}

// recordEngineEnd records the step's try as Conductor ended it, instead
// of the step's own outcome, which Conductor would not take: COMPLETED is
// the step's StepCompleted; a failure Conductor retries, or a timeout,
// ends the try (RunStepTryEnded; when Conductor's retry started first,
// its RunStepTryStarted already stands for it); a final failure is the
// step's StepFailed (ENGINE_TASK_<status>, Conductor's reason), and so is
// a task cancelled with its workflow (terminated: ENGINE_TASK_CANCELED)
// or gone with it (removed, cur nil: WORKFLOW_NOT_FOUND), so that the
// ended run keeps no step in flight. Nothing is reported to Conductor.
func (w *Worker) recordEngineEnd(log *zap.Logger, a *Assignment, cur *model.Task, engine, logical int64) {
	if cur == nil {
		_, err := w.record(log, a, engine, logical, statestore.StepFailedPayload{
			Error: &statestore.StepError{Code: CodeWorkflowNotFound, Message: "Conductor no longer has the step's task: its workflow was removed, or lost"}}, nil)
		w.recordedEngineEnd(log, "removed", err)
		return
	}
	status := string(cur.Status)
	switch status {
	case "COMPLETED":
		_, err := w.record(log, a, engine, logical, statestore.StepCompletedPayload{EngineTaskID: cur.TaskId, EngineEndedAt: statestore.EngineTime(cur.EndTime)}, nil)
		w.recordedEngineEnd(log, status, err)
	case "FAILED", "TIMED_OUT":
		if status == "TIMED_OUT" || engine < int64(max(a.EngineTries, 1)) {
			reason := statestore.TryEndedEngineTryFailed
			if status == "TIMED_OUT" {
				reason = statestore.TryEndedTaskTimedOut
			}
			w.endTry(log, a, engine, logical, reason, statestore.EngineTaskFailure(status, cur.ReasonForIncompletion))
			return
		}
		fallthrough
	case "FAILED_WITH_TERMINAL_ERROR", "COMPLETED_WITH_ERRORS", "CANCELED":
		_, err := w.record(log, a, engine, logical, statestore.StepFailedPayload{EngineTaskID: cur.TaskId, EngineEndedAt: statestore.EngineTime(cur.EndTime),
			Error: statestore.EngineTaskFailure(status, cur.ReasonForIncompletion)}, nil)
		w.recordedEngineEnd(log, status, err)
	}
}

func (w *Worker) recordedEngineEnd(log *zap.Logger, status string, err error) {
	switch {
	case errors.Is(err, statestore.ErrInvalidTransition):
		log.Info("the log has the step settled already; Conductor's end of its task not recorded", zap.String("status", status))
	case err != nil:
		log.Warn("could not record the step's task as Conductor ended it; the run's end records it", zap.String("status", status), zap.Error(err))
	}
}
