package taskworkers

import (
	"context"
	"errors"
	"sync"
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
	w.report(t, log, r, true)
}

// report is update; mayEndDrain is OnTaskDone's.
func (w *Worker) report(t *model.Task, log *zap.Logger, r *model.TaskResult, mayEndDrain bool) {
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
				w.wakePollers(t)
			}
			if r.Status != model.InProgressTask && w.opts.OnTaskDone != nil {
				if runID, ok := t.InputData[plan.InputRunID].(string); ok {
					w.opts.OnTaskDone(runID, r.Status != model.CompletedTask || plan.IsSink(t.InputData), mayEndDrain)
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

// wakePollers ends the idle wait of the poll loops that may have work
// now that t's outcome reached Conductor: those of t's own task type (a
// retry, or a successor of the same type) and of the task types polled
// for t's plan before (its other steps' types). Waking every loop made an
// idle task type poll once per step of any other type; a successor of a
// type not seen for the plan yet waits for its loop's PollInterval.
func (w *Worker) wakePollers(t *model.Task) {
	wake := w.wakes.typesOf(t)
	for _, p := range w.pollers {
		if wake.has(p.taskType) {
			p.nudge()
		}
	}
}

// wakeMaxPlans bounds the plans planTypes remembers; past it, an outcome of
// an unknown plan wakes every poll loop, as before any was learned.
const wakeMaxPlans = 10000

// planTypes learns, per plan (planId and planVersion of a task's input),
// the task types polled for it, so that an outcome wakes only the poll
// loops of the types its plan uses. It is safe for concurrent use.
type planTypes struct {
	mu sync.Mutex
	// index numbers the polled task types, bits of a mask; byPlan holds
	// the mask of each plan's types.
	index  map[string]uint64
	byPlan map[string]uint64
}

// typeMask is a set of task types (bits of planTypes.index); all is
// every type.
type typeMask struct {
	all   bool
	bits  uint64
	index map[string]uint64
}

// has reports whether taskType is in the set.
func (m typeMask) has(taskType string) bool {
	return m.all || m.bits&m.index[taskType] != 0
}

func newPlanTypes(taskTypes []string) *planTypes {
	pt := &planTypes{index: map[string]uint64{}, byPlan: map[string]uint64{}}
	for i, tt := range taskTypes {
		pt.index[tt] = 0 // polled here, past the 64 numbered: its outcome wakes every loop
		if i < 64 {
			pt.index[tt] = 1 << i
		}
	}
	return pt
}

// planOf is the plan key of a task: "planId|planVersion" ('|' is not
// allowed in either), or "" for a task whose input has neither.
func planOf(t *model.Task) string {
	id, _ := t.InputData[plan.InputPlanID].(string)
	v, _ := t.InputData[plan.InputPlanVersion].(string)
	if id == "" {
		return ""
	}
	return id + "|" + v
}

// learn records the task types of polled tasks for their plans.
func (pt *planTypes) learn(tasks []model.Task) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	for i := range tasks {
		key, bit := planOf(&tasks[i]), pt.index[tasks[i].TaskType]
		if key == "" || bit == 0 {
			continue
		}
		if m, ok := pt.byPlan[key]; ok || len(pt.byPlan) < wakeMaxPlans {
			pt.byPlan[key] = m | bit
		}
	}
}

// typesOf returns the task types to wake for t's outcome: t's own and its
// plan's, or every type for a task of no known plan or of an unnumbered
// type this worker polls. A type no loop polls (an outside worker's,
// whose outcome the task proxy forwarded) adds nothing: waking every loop
// for it would cost Conductor a poll per idle task type per gated task.
func (pt *planTypes) typesOf(t *model.Task) typeMask {
	own, polled := pt.index[t.TaskType]
	key := planOf(t)
	pt.mu.Lock()
	m, ok := pt.byPlan[key]
	pt.mu.Unlock()
	if !ok || key == "" || (polled && own == 0) {
		return typeMask{all: true}
	}
	return typeMask{bits: m | own, index: pt.index}
}
