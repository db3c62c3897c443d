package taskworkers

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Steps an outside worker runs (plan.ExecutorExternal): the task proxy
// (package proxy) hands their polled tasks to Admit and their updates to
// Record, so they pass the same gate, fence and outcome recording as the
// steps this worker runs. The worker itself never polls their task types.

// CodeExternalFailed is the error code of a StepFailed recorded from an
// outside worker's FAILED update; its message is the worker's
// reasonForIncompletion.
const CodeExternalFailed = "EXTERNAL_WORKER_FAILED"

// TaskReader reads a task back from Conductor, and has Conductor decide
// its workflow.
type TaskReader interface {
	// Task returns the task; an unknown task is an error matching
	// errcode.NotFound.
	Task(ctx context.Context, taskID string) (*model.Task, error)
	// Decide has Conductor evaluate the workflow now: among others it
	// times out a task past its response timeout, which its sweeper may
	// do minutes late on a busy server.
	Decide(ctx context.Context, workflowID string) error
}

// ExternalStep decodes t as a step an outside worker runs. ok is false for
// any other task: one of no run of the log, or of a step the sidecar runs
// itself.
func ExternalStep(t *model.Task) (*Assignment, bool) {
	if t == nil || t.InputData[plan.InputStep] == nil {
		return nil, false
	}
	a, err := plan.DecodeTaskInput(t.InputData)
	if err != nil || a.Step.Executor.Type != plan.ExecutorExternal {
		return nil, false
	}
	return a, true
}

// AdoptedSteps gives the assignment of a worker task of an adopted
// workflow (adapter.Adopter): ok false for a task of any other workflow.
type AdoptedSteps interface {
	Step(t *model.Task) (*Assignment, bool)
	// Sync records, before t's step starts, what the log lacks of the
	// tasks Conductor ran before it in its workflow (system tasks), so
	// that the log keeps Conductor's order.
	Sync(ctx context.Context, t *model.Task) error
	// AdoptsName reports whether some version of the definition of that
	// name is adopted: Step is false for the tasks of any other.
	AdoptsName(name string) bool
}

// External decodes t as a step an outside worker runs: an external plan
// step (ExternalStep), or a worker task of an adopted workflow
// (Options.Adopted). ok is false for any other task, which the task proxy
// passes through untouched.
func (w *Worker) External(t *model.Task) (*Assignment, bool) {
	if a, ok := ExternalStep(t); ok {
		return a, true
	}
	if w.opts.Adopted == nil || t == nil || t.InputData[plan.InputStep] != nil {
		return nil, false
	}
	return w.opts.Adopted.Step(t)
}

// MayAdopt reports whether External may take a task of a workflow of
// definition workflowType whose input holds no plan step (a worker task
// of an adopted workflow): false when no definition of that name is
// adopted (Options.Adopted). The task proxy passes the tasks of any other
// workflow through without decoding them.
func (w *Worker) MayAdopt(workflowType string) bool {
	return w.opts.Adopted != nil && w.opts.Adopted.AdoptsName(workflowType)
}

// Admit takes a polled task of an external step through the gate: when it
// returns true, StepStarted (or RunStepTryStarted for a later try) is in
// the log, appended on the runSeq the gate decided on, and the task may be
// handed to the outside worker. When it returns false the task was
// answered to Conductor here (handed back while the run is paused or not
// started, refused when it ended, or reported from the log) and must not
// reach the worker. a is External's assignment of t (decoded once by the
// caller); a nil a (a task that is not an external step) returns false and
// leaves the task alone.
func (w *Worker) Admit(t *model.Task, a *Assignment) bool {
	if a == nil || w.workCtx == nil {
		return false
	}
	log := w.log.With(zap.String("taskId", t.TaskId), zap.String("workflowId", t.WorkflowInstanceId),
		zap.String("runId", a.RunID), zap.String("stepId", a.Step.StepID), zap.String("taskType", t.TaskDefName))
	if f, held := heldFailureOf(t); held {
		w.reportHeldFailure(t, log, a, f)
		return false
	}
	if t.InputData[plan.InputStep] == nil && w.opts.Adopted != nil {
		ctx, cancel := context.WithTimeout(w.workCtx, w.opts.WriteBudget)
		if err := w.opts.Adopted.Sync(ctx, t); err != nil {
			log.Debug("could not record the adopted workflow's earlier tasks first; they are recorded later", zap.Error(err))
		}
		cancel()
	}
	engine, logical := a.Attempts(int(t.RetryCount))
	d, ok := w.begin(t, log, a, engine, logical)
	if !ok {
		return false
	}
	w.external.watch(t, a, d.engine, d.logical)
	return true
}

// Undelivered hands back t, an external step's task from a poll answer
// its worker never received (the worker hung up while the proxy waited
// for Conductor): Conductor offers it again after a second instead of at
// its response timeout. Nothing is recorded. It does not block.
func (w *Worker) Undelivered(t *model.Task) {
	if w.workCtx == nil {
		return
	}
	w.opts.Metrics.handedBack(handBackLost)
	go w.handBackWaking(t, time.Second, "its poll's worker hung up before the answer came", false)
}

// Record records an outside worker's update r of t (the task as Conductor
// has it, with its input) before it is forwarded: StepCompleted, or
// StepFailed with the logical and engine attempts when the failure is
// final for the logical attempt (RunStepTryEnded when Conductor retries
// it). forward is true when the caller must now send r to Conductor
// (and call Reported once Conductor took it); false when Record answered
// Conductor itself (a failure held while the run is paused, a step held
// after a failure, or an outcome the log already had). An error means the
// outcome could not be recorded within the write budget: nothing is
// forwarded, and the worker should retry its update. A status other than
// COMPLETED, FAILED or FAILED_WITH_TERMINAL_ERROR (IN_PROGRESS: a progress
// report or a lease extension) records nothing and is forwarded. a is
// External's assignment of t; nil (not an external step) records nothing.
func (w *Worker) Record(t *model.Task, a *Assignment, r *model.TaskResult) (forward bool, err error) {
	if a == nil || w.workCtx == nil {
		return true, nil
	}
	var stepErr *statestore.StepError
	switch r.Status {
	case model.CompletedTask:
	case model.FailedTask, model.FailedWithTerminalErrorTask:
		stepErr = &statestore.StepError{Code: CodeExternalFailed, Message: r.ReasonForIncompletion, Retryable: r.Status == model.FailedTask}
		if stepErr.Message == "" {
			stepErr.Message = "the outside worker reported " + string(r.Status)
		}
	default:
		return true, nil
	}
	log := w.log.With(zap.String("taskId", t.TaskId), zap.String("workflowId", t.WorkflowInstanceId),
		zap.String("runId", a.RunID), zap.String("stepId", a.Step.StepID))
	engine, logical := a.Attempts(int(t.RetryCount))
	ctx, cancel := context.WithTimeout(w.workCtx, w.opts.WriteBudget)
	defer cancel()
	if !w.external.inTime(t.TaskId, time.Now()) {
		// Past the try's response timeout, or a try this process did not
		// hand out (before a restart, or through another replica):
		// Conductor may have ended the task (timed it out) while nobody
		// watched, and it takes no report of it then.
		if err := w.checkNotTimedOut(ctx, log, t, a, engine, logical); err != nil {
			if errors.Is(err, ErrTryTimedOut) && r.Status == model.CompletedTask {
				w.keepLoggedOutput(ctx, log, a, engine, logical, r)
			}
			return false, err
		}
	}
	w.external.forget(t.TaskId)
	snap, inLog, err := w.outcomeState(ctx, log, a.RunID)
	if err != nil {
		w.external.watch(t, a, engine, logical)
		return false, err
	}
	if !inLog || (snap != nil && !startedBefore(snap, a.Step.StepID, logical)) {
		// Polled from Conductor directly, not through the gate (of a
		// run the log may not have yet: an adopted workflow no poll or
		// read adopted): the gate decides now, as for a poll, adopting
		// the workflow and recording the start before the outcome; a
		// run that may not start it (paused, cancelled, ended) refuses
		// the update, and the task is answered to Conductor as that
		// poll's would be.
		log.Warn("update of a task the gate never handed out (polled from Conductor directly?); deciding its start now")
		if !w.Admit(t, a) {
			// The gate answered the task to Conductor (handed it back,
			// refused it). A start of this try another writer recorded
			// meanwhile (the adopter's mid-flight rule, which read this
			// very task in progress) is of a try nobody holds now: ended,
			// so that no drain waits for it.
			w.endTry(log, a, engine, logical, statestore.TryEndedHandedBack, nil)
			if snap, _, err := w.outcomeState(ctx, log, a.RunID); err == nil && snap != nil && w.recordedBefore(ctx, log, snap, a, engine, logical, r.Status) {
				// A concurrent update of the same task (the worker's
				// retry) recorded this very outcome and forwarded it:
				// this one is answered as taken, not refused.
				return false, nil
			}
			return false, ErrNotAdmitted
		}
		w.external.forget(t.TaskId)
		if snap, _, err = w.outcomeState(ctx, log, a.RunID); err != nil {
			w.external.watch(t, a, engine, logical)
			return false, err
		}
	}
	if snap != nil {
		if st := snap.Step(a.Step.StepID); st != nil && st.Idle && st.IdleReason == statestore.TryEndedTaskTimedOut &&
			st.LogicalAttemptID == logical && st.EngineAttemptID == engine {
			// The watch ended this try by its response timeout: Conductor
			// timed the task out (and ignores a report now), or times it
			// out as its paused workflow resumes. Forwarding the report
			// would let a paused run's task end otherwise than the timeout
			// it met.
			log.Warn("update of a try that ended by its response timeout; not recorded or forwarded")
			return false, ErrTryTimedOut
		}
	}
	operatorAttempt := false
	if snap != nil {
		if st := snap.Step(a.Step.StepID); st != nil && st.LogicalAttemptID > logical {
			// Admitted as an operator's RETRY_STEP (gate): one try.
			logical, engine, operatorAttempt = st.LogicalAttemptID, 1, true
		}
	}
	log = log.With(zap.Int64("logicalAttemptId", logical), zap.Int64("engineAttemptId", engine))
	kind := plan.ExecutorExternal
	if stepErr == nil {
		err := w.recordOutcome(ctx, log, a, snap, engine, logical, statestore.StepCompletedPayload{})
		switch {
		case errors.Is(err, statestore.ErrInvalidTransition) && w.recordedBefore(ctx, log, snap, a, engine, logical, r.Status):
			return true, nil
		case errors.Is(err, statestore.ErrInvalidTransition):
			w.reportLogged(t, log, a, engine, logical)
			return false, nil
		case err != nil:
			w.external.watch(t, a, engine, logical)
			return false, err
		}
		w.opts.Metrics.stepDone(kind, "completed", 0)
		return true, nil
	}
	final := !stepErr.Retryable || engine >= int64(max(a.EngineTries, 1)) || operatorAttempt
	if !final {
		log.Warn("outside worker's try failed; Conductor retries it", zap.String("error", stepErr.Message))
		w.endTry(log, a, engine, logical, statestore.TryEndedEngineTryFailed, stepErr)
		w.opts.Metrics.stepDone(kind, "retried", 0)
		return w.forwardFailure(t, log, a, r), nil
	}
	held := a.OnStepFailure == plan.OnFailurePause &&
		(!stepErr.Retryable || logical >= int64(max(a.LogicalAttempts, 1)) || operatorAttempt)
	payload := statestore.StepFailedPayload{Error: stepErr}
	if held {
		payload.OnStepFailure = statestore.OnStepFailurePause
	}
	err = w.recordOutcome(ctx, log, a, snap, engine, logical, payload)
	switch {
	case errors.Is(err, statestore.ErrInvalidTransition) && w.recordedBefore(ctx, log, snap, a, engine, logical, r.Status):
		return w.forwardFailure(t, log, a, r), nil
	case errors.Is(err, statestore.ErrInvalidTransition):
		w.reportLogged(t, log, a, engine, logical)
		return false, nil
	case err != nil:
		w.external.watch(t, a, engine, logical)
		return false, err
	}
	w.opts.Metrics.stepDone(kind, "failed", 0)
	if held {
		w.hold(t, log, a)
		return false, nil
	}
	return w.forwardFailure(t, log, a, r), nil
}

// keepLoggedOutput keeps the output of a report refused because
// Conductor timed its try out, when the log has that try's StepCompleted
// already (an earlier copy of this report was recorded and never reached
// Conductor, and the process that kept its output restarted since): the
// next try, which the gate answers from the log, carries it.
func (w *Worker) keepLoggedOutput(ctx context.Context, log *zap.Logger, a *Assignment, engine, logical int64, r *model.TaskResult) {
	if !w.recordedBefore(ctx, log, nil, a, engine, logical, r.Status) {
		return
	}
	b, err := json.Marshal(r.OutputData)
	if err != nil {
		return
	}
	w.unreported.keep(ctx, stepAttempt{run: a.RunID, step: a.Step.StepID, logical: logical}, r.OutputData, len(b))
}

// checkNotTimedOut reads the task back from Conductor for Record. A try
// Conductor timed out is followed by its next try, so its report is not
// the step's outcome: not recorded (ErrTryTimedOut), and the try recorded
// ended (RunStepTryEnded, taskTimedOut), so that no drain waits for it.
// Any other status goes on: in progress; with an outcome (a repeated
// report, which Record answers from the log); CANCELED (its workflow
// ended: a cancel, a terminate, a failed sibling), which no try follows,
// so its report is the step's last word, recorded and forwarded as one in
// time is (Conductor keeps the task CANCELED and answers 200), whichever
// replica takes it. An error: Conductor could not say, and nothing is
// recorded (the worker retries).
func (w *Worker) checkNotTimedOut(ctx context.Context, log *zap.Logger, t *model.Task, a *Assignment, engine, logical int64) error {
	cur, err := w.opts.Tasks.Task(ctx, t.TaskId)
	if err != nil {
		log.Warn("could not read a late report's task back from Conductor; not recording it (the worker retries)", zap.Error(err))
		return err
	}
	if cur.Status != "TIMED_OUT" {
		return nil
	}
	log.Warn("report of a try Conductor timed out before it came; not recorded or forwarded")
	w.endTry(log, a, engine, logical, statestore.TryEndedTaskTimedOut, nil)
	w.external.forget(t.TaskId)
	return ErrTryTimedOut
}

// startedBefore reports whether snap has a start of stepID's logical
// attempt (or of a later one, an operator's RETRY_STEP): a step the log
// shows pending, or at an earlier attempt, was never handed out by the
// gate.
func startedBefore(snap *statestore.RunSnapshot, stepID string, logical int64) bool {
	st := snap.Step(stepID)
	return st != nil && st.Status != statestore.StepStatusPending && st.LogicalAttemptID >= logical
}

// recordedBefore reports whether the log already has the outcome status
// reports for the attempt (engine, logical), as recorded by this update's
// earlier try: the same status, not held for RETRY_STEP. The worker's SDK
// retries an update whose forward failed (Conductor's answer lost, serve
// stopped between the record and the forward) with the same body, and
// that body, the worker's output with it, is what Conductor must get; an
// answer made up from the log would carry no output (the log keeps
// outcomes, not data). snap is the state the outcome was refused on; nil
// (it could not be read) reads it again.
func (w *Worker) recordedBefore(ctx context.Context, log *zap.Logger, snap *statestore.RunSnapshot, a *Assignment, engine, logical int64, status model.TaskResultStatus) bool {
	if snap == nil {
		var err error
		if snap, err = w.runs.ProjectSnapshot(ctx, a.RunID); err != nil {
			return false
		}
	}
	st := snap.Step(a.Step.StepID)
	if st == nil || st.LogicalAttemptID != logical || st.EngineAttemptID != engine {
		return false
	}
	same := (status == model.CompletedTask && st.Status == statestore.StepStatusSuccess) ||
		(status != model.CompletedTask && st.Status == statestore.StepStatusFailed && !st.Held)
	if same {
		log.Info("the log already has this outcome of the attempt: the worker's update is a retry, forwarded as the worker sent it")
	}
	return same
}

// outcomeState is the run's state an outside worker's update is decided
// and checked on, read once, after the outbox put the step's StepStarted
// in the log (a StepStarted that failed open): which attempt the update
// is of, and whether its outcome is a valid transition (the producer
// guard, as checkOutcome). A run that cannot be read gives nil and no
// error: the append then fails the same way, or decides; inLog is false
// only when the store has no such run. An error: the outbox was not
// flushed within ctx, and nothing may be recorded.
func (w *Worker) outcomeState(ctx context.Context, log *zap.Logger, runID string) (snap *statestore.RunSnapshot, inLog bool, err error) {
	if err := w.outbox.flush(ctx, runID); err != nil {
		if !w.storeTrouble(log, err, "an outbox was not flushed within the write budget; not recording") {
			log.Error("outbox not flushed within the write budget; not recording", zap.Error(err))
		}
		return nil, true, err
	}
	snap, err = w.runs.ProjectSnapshot(ctx, runID)
	if err != nil {
		log.Debug("cannot read the run's state; the append decides", zap.Error(err))
		return nil, !errors.Is(err, statestore.ErrNotFound), nil
	}
	return snap, true, nil
}

// recordOutcome appends an outside worker's outcome of the attempt
// (StepCompleted or StepFailed, payload's type), checked against snap,
// the run's state outcomeState read (not checked when nil). An outcome
// the state refuses is an INVALID_TRANSITION error, and nothing is
// written: another writer recorded the attempt's outcome first.
func (w *Worker) recordOutcome(ctx context.Context, log *zap.Logger, a *Assignment, snap *statestore.RunSnapshot, engine, logical int64, payload statestore.Payload) error {
	ev, err := statestore.NewEvent(runRef(a), payload.EventType(), a.Step.StepID, engine, logical, payload)
	if err != nil {
		return err
	}
	log = log.With(zap.String("eventType", ev.EventType))
	if snap != nil && statestore.CheckTransition(snap, ev) != nil {
		latest, err := w.confirmRefusal(ctx, ev)
		if errors.Is(err, statestore.ErrInvalidTransition) {
			logRefusedOutcome(log, latest, ev, err)
		}
		if err != nil {
			return err
		}
	}
	began := time.Now()
	_, err = w.events.Emit(ctx, ev)
	w.opts.Metrics.eventWrite(ev.EventType, err, time.Since(began))
	if err != nil && !w.storeTrouble(log, err, "an outside worker's outcome was not recorded") {
		log.Error("event not recorded", zap.Error(err))
	}
	return err
}

// forwardFailure decides whether a FAILED report Conductor answers with a
// retry is forwarded now: not while the run is paused (reportFailure says
// why); it is then held on the task and reported when the run resumes.
func (w *Worker) forwardFailure(t *model.Task, log *zap.Logger, a *Assignment, r *model.TaskResult) bool {
	if r.Status != model.FailedTask {
		return true
	}
	ctx, cancel := context.WithTimeout(w.reportCtx, w.opts.WriteBudget)
	snap, err := w.runs.ProjectSnapshot(ctx, a.RunID)
	cancel()
	if err == nil && (snap.Status != statestore.RunStatusPaused || snap.CancelRequested) {
		return true
	}
	log.Info("the run is paused: the outside worker's failed try is held and reported when the run is resumed", zap.Error(err))
	w.holdFailure(t, heldFailure{RetryCount: t.RetryCount, Reason: r.ReasonForIncompletion, Output: r.OutputData})
	return false
}

// Reported is called once Conductor took a forwarded final update of t
// (r): it nudges the run watcher and the drain monitor as the worker's
// own reports do. a is External's assignment of t (nil: no run's step).
func (w *Worker) Reported(t *model.Task, a *Assignment, r *model.TaskResult) {
	if r.Status == model.InProgressTask {
		return
	}
	if a != nil && r.Status == model.CompletedTask {
		// Conductor has the output now: one kept from an earlier copy of
		// the report is not the one to answer a later try with.
		_, logical := a.Attempts(int(t.RetryCount))
		w.unreported.forget(w.workCtx, stepAttempt{run: a.RunID, step: a.Step.StepID, logical: logical})
	}
	w.wakePollers(t)
	if w.opts.OnTaskDone != nil && a != nil {
		w.opts.OnTaskDone(a.RunID, r.Status != model.CompletedTask || a.Sink, true)
	}
}

// externalWatch holds the external steps' tasks handed to outside workers
// and not reported yet: a worker that dies leaves its task to Conductor's
// response timeout, and the watch then records that the try ended
// (RunStepTryEnded, taskTimedOut), so that a drain does not wait for it.
type externalWatch struct {
	mu    sync.Mutex
	tasks map[string]*watched
}

type watched struct {
	t               *model.Task
	a               *Assignment
	engine, logical int64
	// due is when the task is read back from Conductor next; deadline is
	// when its response timeout passes, counted from the hand-out.
	due, deadline time.Time
}

func (x *externalWatch) watch(t *model.Task, a *Assignment, engine, logical int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.tasks == nil {
		x.tasks = map[string]*watched{}
	}
	deadline := time.Now().Add(time.Duration(max(t.ResponseTimeoutSeconds, 1)) * time.Second)
	x.tasks[t.TaskId] = &watched{t: t, a: a, engine: engine, logical: logical, due: deadline, deadline: deadline}
}

// inTime reports whether taskID is watched and its response timeout has
// not passed yet: a report of it now is one Conductor takes.
func (x *externalWatch) inTime(taskID string, now time.Time) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	e := x.tasks[taskID]
	return e != nil && now.Before(e.deadline)
}

func (x *externalWatch) forget(taskID string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.tasks, taskID)
}

// dueNow returns the watched tasks whose time has come and moves each one's
// next read interval later.
func (x *externalWatch) dueNow(now time.Time, interval time.Duration) []*watched {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []*watched
	for _, e := range x.tasks {
		if !now.Before(e.due) {
			out = append(out, e)
			e.due = now.Add(interval)
		}
	}
	return out
}

// watchExternal reads back, every ExternalCheck, the watched tasks past
// their response timeout; a task Conductor ended without the worker's
// report gets RunStepTryEnded. It returns when ctx is done.
func (w *Worker) watchExternal(ctx context.Context) {
	tick := time.NewTicker(w.opts.ExternalCheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			for _, e := range w.external.dueNow(now, w.opts.ExternalCheck) {
				w.checkExternal(ctx, e)
			}
		}
	}
}

// checkExternal reads one watched task back from Conductor.
func (w *Worker) checkExternal(ctx context.Context, e *watched) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	log := w.log.With(zap.String("taskId", e.t.TaskId), zap.String("runId", e.a.RunID), zap.String("stepId", e.a.Step.StepID))
	t, err := w.opts.Tasks.Task(rctx, e.t.TaskId)
	timedOutPaused := false
	if err == nil && t.Status == "IN_PROGRESS" && t.CallbackAfterSeconds == 0 &&
		time.Since(time.UnixMilli(t.UpdateTime)) > time.Duration(t.ResponseTimeoutSeconds)*time.Second {
		// Past its response timeout: have Conductor time it out now.
		if err = w.opts.Tasks.Decide(rctx, t.WorkflowInstanceId); err == nil {
			t, err = w.opts.Tasks.Task(rctx, e.t.TaskId)
		}
		// Conductor decides no PAUSED workflow (the run's pause paused
		// it): it times the task out only as the workflow resumes, as it
		// would have at the timeout. The task is left to that, so that
		// the run ends as it would without the pause (a task failed here
		// would end FAILED, not TIMED_OUT); the log records that the try
		// ended, so that the drain does not wait for a worker that is
		// gone, and a late report of the worker is refused (Record), as
		// Conductor refuses one after a timeout.
		timedOutPaused = err == nil && t.Status == "IN_PROGRESS"
	}
	if err != nil {
		log.Debug("could not read an outside worker's task back; trying again", zap.Error(err))
		return
	}
	switch {
	case timedOutPaused:
	case t.Status == "IN_PROGRESS" || t.Status == "SCHEDULED":
		return // still the worker's (its lease extended, or handed back): look again later
	case t.Status == "COMPLETED" || t.Status == "FAILED" || t.Status == "FAILED_WITH_TERMINAL_ERROR":
		// Reported through another proxy replica, or straight to
		// Conductor: that path recorded it (or the task is not the
		// proxy's to record).
		w.external.forget(e.t.TaskId)
		return
	}
	if w.endTry(log, e.a, e.engine, e.logical, statestore.TryEndedTaskTimedOut, nil) {
		log.Warn("the outside worker's task ended in Conductor without its report (the worker died?); recorded that the try ended",
			zap.String("status", string(t.Status)))
	} else {
		log.Info("the outside worker's task ended in Conductor without its report; the log has the try ended, or a later try in flight: nothing to record",
			zap.String("status", string(t.Status)))
	}
	w.external.forget(e.t.TaskId)
	if w.opts.OnTaskDone != nil {
		w.opts.OnTaskDone(e.a.RunID, true, true)
	}
}

// recoverExternal watches the external steps' tasks Conductor shows in
// progress as this worker opens (Options.ExternalInFlight): a previous
// process handed them out and its watch is gone.
func (w *Worker) recoverExternal(ctx context.Context) {
	tasks, err := w.opts.ExternalInFlight(ctx)
	if err != nil {
		w.log.Warn("could not list the outside workers' tasks in progress; a drain waits for those whose worker died until its timeout", zap.Error(err))
	}
	for i := range tasks {
		t := &tasks[i]
		if a, ok := w.External(t); ok {
			engine, logical := a.Attempts(int(t.RetryCount))
			if snap, err := w.runs.ProjectSnapshot(ctx, a.RunID); err == nil {
				if st := snap.Step(a.Step.StepID); st != nil && st.LogicalAttemptID > logical {
					logical, engine = st.LogicalAttemptID, 1 // an operator's RETRY_STEP: one try (gate)
				}
			}
			w.external.watch(t, a, engine, logical)
		}
	}
}
