package taskworkers

import (
	"context"
	"errors"
	"maps"
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
	w.handBackWaking(t, after, why, true)
}

// handBackWaking is handBack; wake says whether a loop of the task's type
// is woken when the callback ends. A task of a run this sidecar does not
// know (another deployment's on the same Conductor, with no task domain)
// wakes none: the loop woken at its callback would take it again before
// the other deployment's loops, backed off, ever polled it.
func (w *Worker) handBackWaking(t *model.Task, after time.Duration, why string, wake bool) {
	w.report(t, w.log.With(zap.String("taskId", t.TaskId), zap.String("reason", why)), &model.TaskResult{
		Status: model.InProgressTask, CallbackAfterSeconds: max(int64(after/time.Second), 1),
		OutputData: carried(t),
	}, true, wake)
}

// carried is what a hand-back keeps of t's output: all of it. Conductor
// keeps only the last update's output, and a hand-back gives the task back
// as it was: with an outcome kept on it (keepOutcome) or a failure held on
// it (holdFailure), which let the worker that gets it next record the
// step's end instead of running it again, and with an outside worker's own
// progress (an SDK worker in progress with a callback keeps its state
// there).
func carried(t *model.Task) map[string]any {
	if len(t.OutputData) == 0 {
		return nil
	}
	return maps.Clone(t.OutputData)
}

// update reports r for t, retrying while Conductor is unavailable (bounded
// by the task's response timeout, after which Conductor retries the task).
func (w *Worker) update(t *model.Task, log *zap.Logger, r *model.TaskResult) {
	w.report(t, log, r, true, true)
}

// report is update; mayEndDrain is OnTaskDone's, callbackWake whether a
// hand-back with a callback wakes a loop of its type when it ends.
func (w *Worker) report(t *model.Task, log *zap.Logger, r *model.TaskResult, mayEndDrain, callbackWake bool) {
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
			} else if r.CallbackAfterSeconds > 0 && callbackWake {
				w.wakeAtCallback(t.TaskType, time.Now().Add(time.Duration(r.CallbackAfterSeconds)*time.Second))
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
			log.Warn("shutdown: the report did not reach Conductor in time; the task stays in progress there until this worker id starts again (which hands it back) or its response timeout passes", zap.Error(err))
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
// retry, or a successor of the same type) and of the task types t's plan
// uses. With Options.Definitions the plan's types are its workflow
// definition's, read from Conductor once per plan version (the first
// outcome of a plan wakes its loops once the definition is read); without
// it, or when the read fails, they are the types polled for the plan
// before, and a plan none was polled for wakes every loop. A task of no
// plan (an adopted workflow's) wakes the types polled for its workflow
// definition before, and no others. So an outside worker's outcome wakes
// no loop of a plan whose steps are all external: waking them would cost
// Conductor a poll per idle task type per gated task.
func (w *Worker) wakePollers(t *model.Task) {
	wake, resolve := w.wakes.typesOf(t, w.opts.Definitions != nil)
	w.nudge(wake)
	if resolve {
		go w.resolvePlan(t.WorkflowType)
	}
}

// wakeAtCallback wakes a loop of taskType at at, when a task of that type
// handed back with a callback is in Conductor's queue again (a paused
// run's task, a held failure, which a RETRY_STEP and a resume run as the
// next attempt): the resume's wake polled before the callback ended. One
// loop of the type is enough: it takes the tasks of its type that came
// back. A type no loop polls (an outside worker's) wakes nothing.
func (w *Worker) wakeAtCallback(taskType string, at time.Time) {
	for _, p := range w.pollers {
		if p.taskType == taskType {
			p.wakeAt(at)
			return
		}
	}
}

// nudge ends the idle wait of the loops of the types in m.
func (w *Worker) nudge(m typeMask) {
	for _, p := range w.pollers {
		if m.has(p.taskType) {
			p.nudge()
		}
	}
}

// Wake ends the idle wait of every poll loop: Conductor may have queued
// a task of any type. It never blocks. The node wakes the loops through
// Options.Wakeup instead, which the components built before the Worker
// hold.
func (w *Worker) Wake() {
	w.nudge(typeMask{all: true})
}

// resolvePlan reads the workflow definition of a plan version (a run's
// workflow, named for its tenant's plan version), records the task types
// its steps use and wakes their loops.
func (w *Worker) resolvePlan(workflowName string) {
	ctx, cancel := context.WithTimeout(w.reportCtx, 10*time.Second)
	def, err := w.opts.Definitions.WorkflowDef(ctx, workflowName, plan.WorkflowVersion)
	cancel()
	if err != nil {
		w.log.Debug("cannot read the plan's workflow definition; waking the loops of the types polled for it", zap.String("workflow", workflowName), zap.Error(err))
	}
	if err == nil && def == nil {
		err = errcode.NotFound
	}
	var names []string
	if def != nil {
		names = workflowTaskNames(def.Tasks, names)
	}
	w.nudge(w.wakes.resolved(workflowName, names, err))
}

// workflowTaskNames appends the names (task types) of the tasks, nested
// ones included (forks, switch cases, loops).
func workflowTaskNames(tasks []model.WorkflowTask, names []string) []string {
	for i := range tasks {
		t := &tasks[i]
		names = append(names, t.Name)
		for _, branch := range t.ForkTasks {
			names = workflowTaskNames(branch, names)
		}
		for _, c := range t.DecisionCases {
			names = workflowTaskNames(c, names)
		}
		names = workflowTaskNames(t.DefaultCase, names)
		names = workflowTaskNames(t.LoopOver, names)
	}
	return names
}

// wakeMaxPlans bounds the plans (and workflow definitions) planTypes
// remembers; past it, an outcome of an unknown plan wakes every poll
// loop, as before any was learned.
const wakeMaxPlans = 10000

// planTypes knows, per plan (planId and planVersion of a task's input),
// the task types its steps use: exactly, from its workflow definition
// (resolved), or as learned from the tasks polled for it. For a task of
// no plan it learns the types polled per workflow definition. It is safe
// for concurrent use.
type planTypes struct {
	mu sync.Mutex
	// index numbers the polled task types, bits of a mask; byPlan holds
	// the mask of each plan's polled types, byWorkflow that of each
	// workflow definition's (tasks of no plan), exact that of each plan
	// whose definition was read.
	index      map[string]uint64
	byPlan     map[string]uint64
	byWorkflow map[string]uint64
	exact      map[string]typeMask
	// resolving holds the plans whose definition is being read;
	// missing those whose definition Conductor does not have (a plan
	// compiled under another workflow name): they are not read again.
	resolving, missing map[string]bool
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
	pt := &planTypes{index: map[string]uint64{}, byPlan: map[string]uint64{}, byWorkflow: map[string]uint64{},
		exact: map[string]typeMask{}, resolving: map[string]bool{}, missing: map[string]bool{}}
	for i, tt := range taskTypes {
		pt.index[tt] = 0 // polled here, past the 64 numbered: its outcome wakes every loop
		if i < 64 {
			pt.index[tt] = 1 << i
		}
	}
	return pt
}

// planOf is the plan key of a task: its workflow's name (a tenant's plan
// version, plan.WorkflowName), or "" for a task of no plan (its input has
// no planId: an adopted workflow's).
func planOf(t *model.Task) string {
	if id, _ := t.InputData[plan.InputPlanID].(string); id == "" {
		return ""
	}
	return t.WorkflowType
}

// learn records the task types of polled tasks for their plans, or for
// their workflow definitions when they have none.
func (pt *planTypes) learn(tasks []model.Task) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	for i := range tasks {
		bit, known := pt.index[tasks[i].TaskType], pt.byPlan
		key := planOf(&tasks[i])
		if key == "" {
			key, known = tasks[i].WorkflowType, pt.byWorkflow
		}
		if key == "" || bit == 0 {
			continue
		}
		if m, ok := known[key]; ok || len(known) < wakeMaxPlans {
			known[key] = m | bit
		}
	}
}

// typesOf returns the task types to wake for t's outcome now: t's own and
// its plan's, or every type for a task of a plan not known or of an
// unnumbered type this worker polls. A type no loop polls (an outside
// worker's, whose outcome the task proxy forwarded) adds nothing. With
// resolve (definitions can be read), a plan not resolved yet wakes t's own
// type now and resolveNow asks the caller to read its definition (once
// per plan while a read is under way: that read's wake comes after this
// outcome reached Conductor, so it covers it).
func (pt *planTypes) typesOf(t *model.Task, resolve bool) (m typeMask, resolveNow bool) {
	own, polled := pt.index[t.TaskType]
	if polled && own == 0 {
		return typeMask{all: true}, false
	}
	key := planOf(t)
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if key == "" {
		return typeMask{bits: pt.byWorkflow[t.WorkflowType] | own, index: pt.index}, false
	}
	if m, ok := pt.exact[key]; ok {
		m.bits |= own
		return m, false
	}
	if resolve && !pt.missing[key] && len(pt.exact)+len(pt.resolving)+len(pt.missing) < wakeMaxPlans {
		first := !pt.resolving[key]
		pt.resolving[key] = true
		return typeMask{bits: own, index: pt.index}, first
	}
	learned, ok := pt.byPlan[key]
	if !ok {
		return typeMask{all: true}, false
	}
	return typeMask{bits: learned | own, index: pt.index}, false
}

// resolved records the task types of a plan's workflow definition (names)
// and returns the types to wake: the plan's, or, when it could not be read
// (err), those polled for it before (every type if none was). After a
// definition Conductor does not have (errcode.NotFound) the plan is not
// read again; after another error the next outcome tries again.
func (pt *planTypes) resolved(key string, names []string, err error) typeMask {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	delete(pt.resolving, key)
	if err != nil {
		if errors.Is(err, errcode.NotFound) {
			pt.missing[key] = true
		}
		learned, known := pt.byPlan[key]
		if !known {
			return typeMask{all: true}
		}
		return typeMask{bits: learned, index: pt.index}
	}
	m := typeMask{index: pt.index}
	for _, name := range names {
		bit, polled := pt.index[name]
		m.bits |= bit
		m.all = m.all || (polled && bit == 0)
	}
	pt.exact[key] = m
	return m
}
