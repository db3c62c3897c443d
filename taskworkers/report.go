package taskworkers

import (
	"context"
	"errors"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/errcode"
)

// Reports to Conductor: a task's outcome, or its hand-back unstarted.

// handBack returns a task to Conductor unstarted: IN_PROGRESS with a
// callback, so Conductor hands it out again after the delay. The delay is
// at least 1s: the SDK omits a zero callbackAfterSeconds, and IN_PROGRESS
// without one is a plain progress report that leaves the task with us.
func (w *Worker) handBack(t *model.Task, after time.Duration, why string) {
	w.update(t, w.log.With(zap.String("taskId", t.TaskId), zap.String("reason", why)), &model.TaskResult{
		Status: model.InProgressTask, CallbackAfterSeconds: max(int64(after/time.Second), 1),
	})
}

// update reports r for t, retrying while Conductor is unavailable (bounded
// by the task's response timeout, after which Conductor retries the task).
func (w *Worker) update(t *model.Task, log *zap.Logger, r *model.TaskResult) {
	defer w.forgetTaken(t.TaskId)
	r.TaskId, r.WorkflowInstanceId, r.WorkerId = t.TaskId, t.WorkflowInstanceId, w.opts.WorkerID
	deadline := time.Now().Add(max(time.Duration(t.ResponseTimeoutSeconds)*time.Second, 30*time.Second))
	backoff := 100 * time.Millisecond
	for {
		// Reports use a context of their own: a result must reach
		// Conductor while the worker shuts down, until the grace period
		// is over (Close).
		ctx, cancel := context.WithTimeout(w.reportCtx, 10*time.Second)
		err := w.tasks.UpdateTask(ctx, r)
		cancel()
		if err == nil {
			if r.Status != model.InProgressTask {
				w.wakePollers()
			}
			if r.Status != model.InProgressTask && w.opts.OnTaskDone != nil {
				if runID, ok := t.InputData[plan.InputRunID].(string); ok {
					w.opts.OnTaskDone(runID, r.Status != model.CompletedTask || plan.IsSink(t.InputData))
				}
			}
			return
		}
		w.opts.Metrics.updateError()
		switch {
		case errors.Is(err, errcode.NotFound):
			// Conductor no longer knows the workflow (it was restarted on
			// an in-memory store, or the workflow was removed): no retry
			// can succeed, and the slot is needed.
			log.Warn("WORKFLOW_NOT_FOUND: Conductor no longer knows the task's workflow; the report is dropped", zap.Error(err))
			return
		case w.reportCtx.Err() != nil:
			log.Warn("shutdown: the report did not reach Conductor within the grace period; Conductor times the task out and retries it", zap.Error(err))
			return
		case time.Now().After(deadline):
			log.Error("could not report the task to Conductor; it will time out and be retried", zap.Error(err))
			return
		}
		log.Warn("reporting the task failed; retrying", zap.Error(err), zap.Duration("backoff", backoff))
		select {
		case <-time.After(backoff):
		case <-w.reportCtx.Done():
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// wakePollers ends the idle wait of every poll loop.
func (w *Worker) wakePollers() {
	for _, p := range w.pollers {
		p.nudge()
	}
}
