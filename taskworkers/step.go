package taskworkers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/tracing"
)

// The step handler: what a polled task means. handle takes it through
// the gate, StepStarted, the executor and StepCompleted or StepFailed to
// its report (report.go); the poll machinery is poller.go.

// handle runs one polled task to a Conductor update.
func (w *Worker) handle(t *model.Task) {
	start := time.Now()
	log := w.log.With(zap.String("taskId", t.TaskId), zap.String("workflowId", t.WorkflowInstanceId))
	a, err := w.opts.Decode(t.InputData)
	if err != nil {
		log.Error("task input is not a sidecar step; failing the task", zap.Error(err))
		w.update(t, log, &model.TaskResult{Status: model.FailedWithTerminalErrorTask, ReasonForIncompletion: CodeBadTaskInput + ": " + err.Error()})
		return
	}
	engine, logical := a.Attempts(int(t.RetryCount))
	stepLog := log.With(zap.String("runId", a.RunID), zap.String("stepId", a.Step.StepID))
	log = stepLog.With(zap.Int64("logicalAttemptId", logical), zap.Int64("engineAttemptId", engine))
	if k, ok := w.kept.take(t.TaskId, t.RetryCount); ok {
		// The step ran here and its outcome waited for the store: record
		// it now, whatever the run's state (a drain waits for it), and do
		// not run the step again.
		// Debug: while the store stays away this repeats for each such
		// task every hand-back; keepOutcome logs its trouble once a minute.
		log.Debug("recording the outcome kept while the state store did not answer; the step is not run again")
		w.finish(t, log, a, k.res, k.engine, k.logical, k.operatorAttempt, k.took, nil)
		return
	}

	if f, ok := heldFailureOf(t); ok {
		// A failed try held while the run was paused: report it once the
		// run runs again; the step does not run again.
		w.reportHeldFailure(t, log, a, f)
		return
	}
	if _, ok := t.OutputData[keptOutcomeKey]; ok {
		// The step ran (here before a restart, or on another replica)
		// and its outcome waited for the store on its task.
		snap, err := w.runs.ProjectSnapshot(statestore.WithLatest(w.workCtx), a.RunID)
		if err != nil {
			w.handBack(t, w.opts.HandBackAfter, "state unavailable")
			return
		}
		if k, ok := keptOutcomeOf(t, snap, a.Step.StepID); ok {
			log.Info("recording the outcome kept on the task while the state store did not answer; the step is not run again")
			w.finish(t, log, a, k.res, k.engine, k.logical, k.operatorAttempt, k.took, nil)
			return
		}
	}

	d, ok := w.begin(t, log, a, engine, logical)
	if !ok {
		return
	}
	engine, logical, operatorAttempt := d.engine, d.logical, d.operatorAttempt
	if operatorAttempt {
		log = stepLog.With(zap.Int64("logicalAttemptId", logical), zap.Int64("engineAttemptId", engine), zap.Bool("operatorRetry", true))
	}
	exec := w.executors[a.Step.Executor.Type]

	span := w.opts.Tracer.StartStep(tracing.Step{RunID: a.RunID, StepID: a.Step.StepID, Executor: a.Step.Executor.Type, TaskID: t.TaskId,
		LogicalAttempt: logical, EngineAttempt: engine}, start)
	res, ended, runErr := w.execute(t, log, a, exec, engine, logical, span.Traceparent())
	if ended.task != nil || ended.gone {
		// An action taken in Conductor ended the task while the step ran
		// (completed or failed by hand, the workflow terminated or
		// removed): Conductor takes no report of it now, and the log
		// records what Conductor made of it instead of the step's own.
		w.recordEngineEnd(log, a, ended.task, engine, logical)
		w.opts.Metrics.stepDone(a.Step.Executor.Type, "ended_in_conductor", time.Since(start))
		span.End(tracing.OutcomeRefused, "")
		return
	}
	if runErr != nil {
		// The executor could not run at all: hand the task back, same attempt.
		log.Warn("executor could not run; handing the task back", zap.Error(runErr))
		w.endTry(log, a, engine, logical, statestore.TryEndedHandedBack, nil)
		w.handBack(t, w.opts.HandBackAfter, "executor unavailable")
		span.End(tracing.OutcomeHandedBack, "")
		return
	}
	if w.workCtx.Err() != nil && res.Err != nil {
		// Interrupted by shutdown, not by the step: another worker retries it.
		w.endTry(log, a, engine, logical, statestore.TryEndedHandedBack, nil)
		w.handBack(t, 0, "shutdown")
		span.End(tracing.OutcomeHandedBack, "")
		return
	}
	if ended.interrupted && res.Err != nil && a.OnStepFailure == plan.OnFailurePause {
		// Interrupted by the run's cancel (Running.Interrupt): not a
		// failure to hold for RETRY_STEP, since the run ends.
		unheld := *a
		unheld.OnStepFailure = ""
		a = &unheld
	}
	outcome := w.finish(t, log, a, res, engine, logical, operatorAttempt, time.Since(start), d.started)
	code := ""
	if res.Err != nil {
		code = res.Err.Code
	}
	span.End(outcome, code)
}

// begin takes a polled task up to its recorded StepStarted: it reads the
// run's derived state, applies the gate and appends StepStarted
// conditioned on the runSeq it decided on (the fence: no StepStarted is
// persisted after a RunPaused it did not see). A task the gate does not
// start is reported or handed back here, and ok is false.
func (w *Worker) begin(t *model.Task, log *zap.Logger, a *Assignment, engine, logical int64) (d decision, ok bool) {
	polled := time.Now()
	snap, d, err := w.start(t, log, a, engine, logical)
	if snap == nil {
		return d, false // handed back or refused by runState
	}
	switch {
	case err != nil:
		w.handBack(t, w.opts.HandBackAfter, "state store unavailable")
		return d, false
	case d.verdict == refuseForeign:
		w.refuseForeign(t, log)
		return d, false
	case d.verdict == refuseEnded:
		// The run's log is final; a task of it is one Conductor made
		// after the end: the workflow was restarted, rerun or retried
		// in Conductor. Refused: a run ends once (docs/conductor.md,
		// "Actions taken in Conductor").
		log.Warn("task of a run that already ended (its workflow was restarted, rerun or retried in Conductor?); refusing it: the run's log is final, start a new run instead",
			zap.String("status", snap.Status))
		w.opts.Metrics.handedBack(handBackRunEnded)
		w.update(t, log, &model.TaskResult{Status: model.FailedWithTerminalErrorTask, ReasonForIncompletion: "RUN_" + snap.Status})
		return d, false
	case d.verdict == waitCancel:
		// The cancel's terminate ends the task in Conductor; failing it
		// here would fail the workflow instead. A cancel whose process
		// died before the terminate is completed from the run's check.
		log.Info("run is being cancelled; not starting the step, handing the task back")
		w.opts.Metrics.handedBack(handBackCancelling)
		w.handBack(t, w.opts.HandBackAfter, "run being cancelled")
		if w.opts.OnCancellingTask != nil {
			w.opts.OnCancellingTask(a.RunID)
		}
		return d, false
	case d.verdict == waitPaused:
		w.opts.Metrics.handedBack(handBackPaused)
		w.handBack(t, w.opts.HandBackAfter, "run paused")
		if w.opts.OnPausedTask != nil {
			// Resumed in Conductor, not yet in the log? Have it looked at.
			w.opts.OnPausedTask(a.RunID)
		}
		return d, false
	case d.verdict == waitNotRunning:
		w.handBack(t, time.Second, "run not running yet")
		return d, false
	case d.verdict == reportCompleted:
		log.Info("step already completed in the log; reporting it without running it again")
		w.update(t, log, &model.TaskResult{Status: model.CompletedTask, OutputData: w.loggedOutput(log, a, d)})
		return d, false
	case d.verdict == holdFailed:
		w.hold(t, log, a)
		return d, false
	case d.verdict == reportFailed:
		log.Info("step already failed in the log; reporting it without running it again")
		w.update(t, log, failedResult(a, d.step.Error, d.engine, d.logical))
		return d, false
	case !w.runnable(a):
		log.Error("no executor for the step's type", zap.String("executor", a.Step.Executor.Type))
		w.update(t, log, &model.TaskResult{Status: model.FailedWithTerminalErrorTask,
			ReasonForIncompletion: CodeUnknownExecutor + ": no executor of type " + a.Step.Executor.Type})
		return d, false
	}
	w.opts.Metrics.stepStartLatency(t.ScheduledTime, polled)
	return d, true
}

// start reads the run's state, applies the gate and, when it says start,
// records the start: StepStarted, or RunStepTryStarted for a later try of
// an idle attempt, appended on the runSeq the gate decided on
// (statestore.Fenced: it decides again while the run moves on under it).
// The read and the append are serialized per run within this process.
// snap is nil when runState already answered the task; err is set when
// the start could not be recorded.
func (w *Worker) start(t *model.Task, log *zap.Logger, a *Assignment, engine, logical int64) (snap *statestore.RunSnapshot, d decision, err error) {
	unlock := w.starting.lock(a.RunID)
	gated := &gatedRun{w: w, t: t, log: log, a: a}
	defer func() {
		// The run's lock orders its reads and appends only: a task answered
		// to Conductor (handed back, refused) is answered after it, so
		// that the run's other tasks do not wait for Conductor.
		unlock()
		if gated.answer != nil {
			gated.answer()
		}
	}()
	appender := &startAppender{w: w, log: log, a: a}
	snap, _, err = statestore.Fenced(w.workCtx, gated, appender, a.RunID, func(snap *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		d = gate(snap, t.WorkflowInstanceId, a.Step.StepID, engine, logical)
		if d.verdict != start || !w.runnable(a) {
			return nil, nil
		}
		if st := d.step; snap.Status == statestore.RunStatusPaused && st != nil && a.Step.Executor.Type != plan.ExecutorExternal {
			// The gate lets a try in flight go on in a pause: an outside
			// worker's, polled back after its own IN_PROGRESS with a
			// callback. The sidecar's own worker never hands a try back
			// to go on with it, so its try offered again is one whose
			// worker is gone (a restart, or a hand-back, whose record of
			// the try's end failed with the store): not run again inside
			// the pause. Its end is recorded, and the task waits for the
			// resume.
			d.verdict = waitPaused
			return tryEvent(a, snap, statestore.RunStepTryEndedPayload{StepID: a.Step.StepID, StepLogicalAttemptID: st.LogicalAttemptID,
				EngineAttemptID: st.EngineAttemptID, Reason: statestore.TryEndedHandedBack})
		}
		if st := d.step; st != nil && st.Status == statestore.StepStatusRunning && st.LogicalAttemptID == d.logical &&
			(st.Idle || d.engine > st.EngineAttemptID) {
			// A later try of an attempt whose StepStarted is in the log
			// (deduplicated if appended again): record that it runs again.
			// The attempt may not be idle in the log yet: Conductor ended
			// its try (a response timeout) before anyone recorded that,
			// and this is the engine's next try.
			return tryEvent(a, snap, statestore.RunStepTryStartedPayload{StepID: a.Step.StepID, StepLogicalAttemptID: d.logical, EngineAttemptID: d.engine})
		}
		if st := d.step; st != nil && st.Status == statestore.StepStatusRunning && st.LogicalAttemptID == d.logical {
			// This try's start is in the log already (a worker recorded
			// it and died before it reported; Conductor handed the task
			// out again): run it, recording nothing. A second
			// StepStarted would be a duplicate at best, and the transition
			// check refuses it on a RUNNING step.
			return nil, nil
		}
		return statestore.NewEvent(runRef(a), statestore.StepStarted, a.Step.StepID, d.engine, d.logical, nil)
	})
	if errors.Is(err, errAnswered) {
		return nil, d, nil
	}
	if err == nil && d.verdict == start {
		d.started = startedFrom(snap, appender.started)
	}
	return snap, d, err
}

// startedRun is the run as this worker's StepStarted left it: the state
// the fence decided on with the StepStarted applied, and its runSeq.
// While the run's last runSeq is still seq, that is the run's state, so
// the step's outcome is checked against it and appended conditioned on
// seq (outcome), without reading the run again.
type startedRun struct {
	snap *statestore.RunSnapshot
	seq  int64
}

// startedFrom returns the run after rec, the StepStarted the fence
// appended on snap, or nil when there is none (queued in the outbox, a
// duplicate, a try event).
func startedFrom(snap *statestore.RunSnapshot, rec *statestore.RunEventRecord) *startedRun {
	if rec == nil || rec.RunSeq <= snap.LastEventSeq || inFlightOther(snap, rec.StepID) {
		// With other steps in flight the run will likely have moved on
		// by the outcome (a refused conditional append costs more than
		// the read it saves): no copy of the run is made for it.
		return nil
	}
	after, _ := statestore.Reduce(snap, []statestore.RunEventRecord{*rec})
	if after == nil || after.LastEventSeq != rec.RunSeq {
		return nil
	}
	return &startedRun{snap: after, seq: rec.RunSeq}
}

// inFlightOther reports whether a step other than stepID is in flight in
// snap.
func inFlightOther(snap *statestore.RunSnapshot, stepID string) bool {
	for i := range snap.Steps {
		if st := &snap.Steps[i]; st.StepID != stepID && st.Status == statestore.StepStatusRunning && !st.Idle {
			return true
		}
	}
	return false
}

// errAnswered is gatedRun's answer when runState already answered the
// task (handed back or refused): start records nothing.
var errAnswered = errors.New("task answered")

// gatedRun reads the run's state for start's fence: runState, which
// answers a task that cannot be gated. Every read after the first is a
// decision taken again (a fence retry), and counted.
type gatedRun struct {
	w     *Worker
	t     *model.Task
	log   *zap.Logger
	a     *Assignment
	reads int
	// answer, when set, answers the task to Conductor (runState's
	// decision); start calls it once the run's lock is released.
	answer func()
}

func (g *gatedRun) ProjectSnapshot(context.Context, string) (*statestore.RunSnapshot, error) {
	if g.reads++; g.reads > 1 {
		g.w.opts.Metrics.fenceRetry() // the run moved on since the gate read it
	}
	snap, answer := g.w.runState(g.t, g.log, g.a)
	if answer != nil {
		g.answer = answer
		return nil, errAnswered
	}
	return snap, nil
}

// startAppender appends start's event: StepStarted fails open (emitEvent),
// RunStepTryStarted is a try event (tryAppender).
type startAppender struct {
	w   *Worker
	log *zap.Logger
	a   *Assignment
	// started is the StepStarted it persisted (nil: none, or queued).
	started *statestore.RunEventRecord
}

func (s *startAppender) EmitIf(ctx context.Context, ev *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	if ev.EventType == statestore.StepStarted {
		res, _, err := s.w.emitEvent(s.log, ev, lastSeq, nil)
		if err == nil && res.Persisted {
			s.started = &statestore.RunEventRecord{RunEventWrite: *ev, RunSeq: res.RunSeq, PersistedAt: res.PersistedAt}
			s.started.EventID = res.EventID
		}
		return res, err
	}
	return tryAppender{w: s.w, a: s.a}.EmitIf(ctx, ev, lastSeq)
}

// endTry records that the step's try (engine, logical) ended without an
// outcome for its logical attempt (RunStepTryEnded with reason), so that
// no drain waits for it. A try the log shows replaced by a later one
// (Conductor's next try, recorded started) is not the step's to end:
// nothing is recorded. It is best effort: if the store does not take it
// within the write budget, a drain of the run waits for the step until its
// timeout, as it would for a running one. It reports whether it recorded
// the end.
func (w *Worker) endTry(log *zap.Logger, a *Assignment, engine, logical int64, reason string, stepErr *statestore.StepError) (recorded bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.workCtx), w.opts.WriteBudget)
	defer cancel()
	_, res, err := statestore.Fenced(ctx, w.runs, tryAppender{w: w, a: a}, a.RunID, func(snap *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		st := snap.Step(a.Step.StepID)
		if st == nil || st.Status != statestore.StepStatusRunning || st.LogicalAttemptID != logical || st.Idle || st.EngineAttemptID > engine {
			return nil, nil // not in flight in the log, or a later try is: nothing to record
		}
		return tryEvent(a, snap, statestore.RunStepTryEndedPayload{StepID: a.Step.StepID, StepLogicalAttemptID: logical, EngineAttemptID: engine,
			Reason: reason, Error: stepErr})
	})
	if err != nil {
		log.Warn("could not record that the step's try ended; a drain of the run waits for it until its timeout", zap.Error(err))
	}
	return err == nil && res.RunSeq > 0
}

// tryEvent is RunStepTryEnded or RunStepTryStarted for the step,
// numbered after snap's last try event.
func tryEvent(a *Assignment, snap *statestore.RunSnapshot, p statestore.Payload) (*statestore.RunEventWrite, error) {
	return statestore.NewEvent(runRef(a), p.EventType(), "", 1, snap.StepTryEvents+1, p)
}

// tryAppender appends a try event of a's step within the write budget
// (statestore.TryAppender: RUN_CHANGED unless the step is then as the
// event says).
type tryAppender struct {
	w *Worker
	a *Assignment
}

func (ta tryAppender) EmitIf(ctx context.Context, ev *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	ctx, cancel := context.WithTimeout(ctx, ta.w.opts.WriteBudget)
	defer cancel()
	return statestore.TryAppender{Emit: meteredAppender{ta.w}, Runs: ta.w.runs, StepID: ta.a.Step.StepID}.EmitIf(ctx, ev, lastSeq)
}

// meteredAppender appends through the worker's emitter and counts the
// write's latency (sidecar_worker_event_write_seconds).
type meteredAppender struct{ w *Worker }

func (m meteredAppender) EmitIf(ctx context.Context, ev *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	began := time.Now()
	res, err := m.w.events.EmitIf(ctx, ev, lastSeq)
	m.w.opts.Metrics.eventWrite(ev.EventType, err, time.Since(began))
	return res, err
}

// runState reads the run's derived state for a polled task. A run without
// events is brought to RunStarted by Options.Guard when the task's
// workflow is the run's. A task that cannot be gated gets answer, which
// hands it back (or refuses it) to Conductor; the caller calls it once it
// holds no lock of the run.
func (w *Worker) runState(t *model.Task, log *zap.Logger, a *Assignment) (snap *statestore.RunSnapshot, answer func()) {
	snap, err := w.runs.ProjectSnapshot(w.workCtx, a.RunID)
	if errors.Is(err, statestore.ErrNotFound) && w.opts.Guard != nil {
		// RunStarted is appended right after Conductor starts the workflow;
		// the task can be polled first. The guard records it.
		if gerr := w.opts.Guard(w.workCtx, a.RunID, t.WorkflowInstanceId); gerr != nil {
			if errors.Is(gerr, ErrForeignWorkflow) {
				return nil, func() { w.refuseForeign(t, log) }
			}
			if errors.Is(gerr, ErrUnknownRun) {
				log.Warn("task of a run this sidecar does not know (another deployment on the same Conductor? give each its own --task-domain); handing it back", zap.Error(gerr))
				w.opts.Metrics.handedBack(handBackUnknown)
				return nil, func() { w.handBackWaking(t, w.opts.HandBackAfter, "unknown run", false) }
			}
			log.Info("run start not recorded yet; handing the task back", zap.Error(gerr))
			return nil, func() { w.handBack(t, time.Second, "run not started yet") }
		}
		snap, err = w.runs.ProjectSnapshot(w.workCtx, a.RunID)
	}
	switch {
	case errors.Is(err, statestore.ErrNotFound):
		return nil, func() { w.handBack(t, time.Second, "run not started yet") }
	case err != nil:
		if !w.storeTrouble(log, err, "cannot read a run's state; its task is handed back") {
			log.Warn("cannot read the run's state; handing the task back", zap.Error(err))
		}
		return nil, func() { w.handBack(t, w.opts.HandBackAfter, "state unavailable") }
	}
	return snap, nil
}

// execute runs the step's try; traceparent is its span's W3C trace
// context ("" when tracing is off).
func (w *Worker) execute(t *model.Task, log *zap.Logger, a *Assignment, exec Executor, engine, logical int64, traceparent string) (res Result, ended engineEnd, err error) {
	ctx, cancel := context.WithCancel(w.workCtx)
	defer cancel()
	w.running.track(a.RunID, t.TaskId, cancel)
	defer w.running.untrack(a.RunID, t.TaskId)
	watch := w.watchEngineTask(t, cancel, log)
	began, interrupted := time.Now(), ctx.Err
	defer func() {
		ended.task, ended.gone = watch.stop()
		if interrupted() == nil { // ended on its own, not interrupted
			ended = w.finalCheck(t, watch, time.Since(began), ended)
		}
		// Neither the engine's end (the watch), nor a shutdown: the
		// run's cancel.
		ended.interrupted = interrupted() != nil && ended.task == nil && !ended.gone && w.workCtx.Err() == nil
	}()
	if a.Step.TimeoutSeconds > 0 {
		var tcancel context.CancelFunc
		ctx, tcancel = context.WithTimeout(ctx, time.Duration(a.Step.TimeoutSeconds)*time.Second)
		defer tcancel()
	}
	if a.Step.Join == plan.JoinAnySuccess {
		if e := w.joinGate(ctx, a); e != nil {
			return Result{Err: e}, ended, nil
		}
	}
	var secrets map[string]string
	if len(a.Step.Secrets) > 0 {
		var err error
		if secrets, err = w.secrets.Resolve(ctx, a.Step.Secrets); err != nil {
			return Result{Err: &statestore.StepError{Code: errcode.CodeOf(err), Message: err.Error()}}, ended, nil
		}
	}
	res, err = exec.Execute(ctx, Execution{RunID: a.RunID, StepID: a.Step.StepID, LogicalAttemptID: logical,
		EngineAttemptID: engine, Spec: a.Step.Executor, Secrets: secrets, Traceparent: traceparent})
	return res, ended, err
}

// engineEnd is what the watch of a running step saw of its task in
// Conductor: the task as Conductor ended it, or that Conductor has it no
// more (gone); neither when the step ended first.
type engineEnd struct {
	task *model.Task
	gone bool
	// interrupted: Running.Interrupt (the run's cancel) ended the step.
	interrupted bool
}

// joinGate is the any_success join: the step runs only if one of its
// dependencies succeeded in the log (Conductor's JOIN let it through once
// every branch ended, failed ones included). A state that cannot be read
// fails the try, retryably.
func (w *Worker) joinGate(ctx context.Context, a *Assignment) *statestore.StepError {
	snap, err := w.runs.ProjectSnapshot(ctx, a.RunID)
	if err != nil {
		return &statestore.StepError{Code: CodeStoreUnavailable, Message: "join any_success: " + err.Error(), Retryable: true}
	}
	for _, d := range a.Step.DependsOn {
		if st := snap.Step(d); st != nil && st.Status == statestore.StepStatusSuccess {
			return nil
		}
	}
	return &statestore.StepError{Code: CodeJoinNotPassable, Retryable: false,
		Message: fmt.Sprintf("join any_success: none of %s succeeded", strings.Join(a.Step.DependsOn, ", "))}
}

// finish records the step's outcome and reports it to Conductor; st,
// when set, is the run as the step's StepStarted left it. It returns what
// became of the try (tracing.Outcome*).
func (w *Worker) finish(t *model.Task, log *zap.Logger, a *Assignment, res Result, engine, logical int64, operatorAttempt bool, took time.Duration, st *startedRun) string {
	kind := a.Step.Executor.Type
	if res.Err == nil {
		settled, err := w.record(log, a, engine, logical, statestore.StepCompletedPayload{Artifacts: res.Artifacts}, st)
		if errors.Is(err, statestore.ErrInvalidTransition) {
			w.reportLogged(t, log, a, engine, logical)
			return tracing.OutcomeRefused
		}
		if err != nil {
			// Never fail open: without StepCompleted the task must not complete.
			w.keepOutcome(t, log, keptOutcome{res: res, engine: engine, logical: logical, operatorAttempt: operatorAttempt, took: took}, err)
			return tracing.OutcomeKept
		}
		w.opts.Metrics.stepDone(kind, "completed", took)
		w.report(t, log, &model.TaskResult{Status: model.CompletedTask, OutputData: artifactOutput(res.Artifacts, res.Output)}, !settled, true)
		return tracing.OutcomeCompleted
	}
	final := !res.Err.Retryable || engine >= int64(max(a.EngineTries, 1)) || operatorAttempt
	if !final {
		// An engine retry of the same logical attempt follows: logs and
		// metrics only, no StepFailed (docs/events.md, "Why the try events exist").
		log.Warn("step try failed; Conductor retries it", zap.String("code", res.Err.Code), zap.String("error", res.Err.Message))
		// Recorded before Conductor hears of it: once Conductor has the
		// failure, the next try may start (on any replica), and it must
		// find this try ended.
		w.endTry(log, a, engine, logical, statestore.TryEndedEngineTryFailed, res.Err)
		w.opts.Metrics.stepDone(kind, "retried", took)
		w.reportFailure(t, log, a, &model.TaskResult{Status: model.FailedTask, ReasonForIncompletion: res.Err.Code + ": " + res.Err.Message, OutputData: artifactOutput(res.Artifacts, res.Output)})
		return tracing.OutcomeRetried
	}
	// For good: no logical attempt left, not retryable, or an operator's
	// retry. Under onStepFailure "pause" the run pauses and the task is held.
	held := a.OnStepFailure == plan.OnFailurePause &&
		(!res.Err.Retryable || logical >= int64(max(a.LogicalAttempts, 1)) || operatorAttempt)
	payload := statestore.StepFailedPayload{Error: res.Err, Artifacts: res.Artifacts}
	if held {
		payload.OnStepFailure = statestore.OnStepFailurePause
	}
	err := w.emit(log, a, engine, logical, payload, st)
	if errors.Is(err, statestore.ErrInvalidTransition) {
		w.reportLogged(t, log, a, engine, logical)
		return tracing.OutcomeRefused
	}
	if err != nil {
		w.keepOutcome(t, log, keptOutcome{res: res, engine: engine, logical: logical, operatorAttempt: operatorAttempt, took: took}, err)
		return tracing.OutcomeKept
	}
	w.opts.Metrics.stepDone(kind, "failed", took)
	log.Warn("step failed for this logical attempt", zap.String("code", res.Err.Code), zap.Bool("retryable", res.Err.Retryable), zap.Bool("held", held))
	if held {
		w.hold(t, log, a)
		return tracing.OutcomeHeld
	}
	r := failedResult(a, res.Err, engine, logical)
	r.OutputData = artifactOutput(res.Artifacts, res.Output)
	w.reportFailure(t, log, a, r)
	return tracing.OutcomeFailed
}

// heldFailureKey names the task output that holds a failed try's report
// while its run is paused (reportFailure). It lives on the Conductor task,
// so a restart or another replica finds it; a retry is a new task and
// starts without it.
const heldFailureKey = "sidecarHeldFailure"

// heldFailure is a FAILED report kept on its task.
type heldFailure struct {
	RetryCount int32          `json:"retryCount"`
	Reason     string         `json:"reason"`
	Output     map[string]any `json:"output,omitempty"`
}

// reportFailure reports r, a FAILED result Conductor answers with a retry
// (an engine try, or the next logical attempt), unless the run is paused:
// Conductor schedules no retry of a paused workflow but still evaluates
// its JOINs, and a JOIN over a FAILED branch task fails the workflow, so
// a pause would turn a retryable failure into a failed run. Then the task
// is handed back with the report kept on it, and reported when Conductor
// offers it again and the run runs (reportHeldFailure). A run whose state
// cannot be read is treated as paused: holding is always safe. Left open:
// a pause recorded in the milliseconds between this read and Conductor
// taking the report.
func (w *Worker) reportFailure(t *model.Task, log *zap.Logger, a *Assignment, r *model.TaskResult) {
	if r.Status != model.FailedTask {
		w.update(t, log, r)
		return
	}
	ctx, cancel := context.WithTimeout(w.reportCtx, w.opts.WriteBudget)
	snap, err := w.runs.ProjectSnapshot(ctx, a.RunID)
	cancel()
	if err == nil && (snap.Status != statestore.RunStatusPaused || snap.CancelRequested) {
		w.update(t, log, r)
		return
	}
	log.Info("the run is paused: the failed try is held and reported when the run is resumed", zap.Error(err))
	w.holdFailure(t, heldFailure{RetryCount: t.RetryCount, Reason: r.ReasonForIncompletion, Output: r.OutputData})
}

// holdFailure hands t back with f kept on it.
func (w *Worker) holdFailure(t *model.Task, f heldFailure) {
	w.opts.Metrics.handedBack(handBackPaused)
	w.update(t, w.log.With(zap.String("taskId", t.TaskId), zap.String("reason", "failure held while paused")), &model.TaskResult{
		Status: model.InProgressTask, CallbackAfterSeconds: max(int64(w.opts.HandBackAfter/time.Second), 1),
		OutputData: map[string]any{heldFailureKey: f},
	})
}

// heldFailureOf returns the failure held on t, if t carries one of its
// own try (not a copy from an earlier try's task).
func heldFailureOf(t *model.Task) (heldFailure, bool) {
	v, ok := t.OutputData[heldFailureKey]
	if !ok {
		return heldFailure{}, false
	}
	b, err := json.Marshal(v)
	var f heldFailure
	if err != nil || json.Unmarshal(b, &f) != nil || f.RetryCount != t.RetryCount {
		return heldFailure{}, false
	}
	return f, true
}

// reportHeldFailure reports a held failure once the run is no longer
// paused (resumed, or being cancelled: Conductor then ends the workflow
// anyway), and holds it again while it is.
func (w *Worker) reportHeldFailure(t *model.Task, log *zap.Logger, a *Assignment, f heldFailure) {
	snap, err := w.runs.ProjectSnapshot(w.workCtx, a.RunID)
	if err != nil || (snap.Status == statestore.RunStatusPaused && !snap.CancelRequested) {
		w.holdFailure(t, f)
		return
	}
	log.Info("reporting the try that failed while the run was paused; Conductor retries it", zap.String("reason", f.Reason))
	w.update(t, log, &model.TaskResult{Status: model.FailedTask, ReasonForIncompletion: f.Reason, OutputData: f.Output})
}

// keepOutcome handles a step whose StepCompleted or StepFailed the store
// did not take within the write budget (Execution Semantics Contract v1.1 §5:
// a critical write never fails open, and the step's try fails). The task is
// neither completed nor failed in Conductor, whose retry budget is the
// plan's, not the store's: it is handed back, and the outcome kept here is
// recorded and reported when Conductor offers the task again, without running
// the step again. A store failover (seconds: a NATS leader election) then
// costs a delay, not the run.
func (w *Worker) keepOutcome(t *model.Task, log *zap.Logger, o keptOutcome, err error) {
	o.retryCount, o.at = t.RetryCount, time.Now()
	w.kept.keep(t.TaskId, o)
	w.opts.Metrics.handedBack(handBackKept)
	if !w.storeTrouble(log, err, "an outcome could not be recorded within the write budget; its task is handed back and the outcome recorded when Conductor offers it again",
		zap.String("code", CodeStoreUnavailable)) {
		log.Warn("the outcome could not be recorded within the write budget; the task is handed back and the outcome recorded when Conductor offers it again",
			zap.String("code", CodeStoreUnavailable), zap.Error(err))
	}
	// Kept on the task too: another replica, or this one restarted, that
	// gets the task records it instead of running the step again.
	w.report(t, log.With(zap.String("reason", "outcome not recorded")), &model.TaskResult{
		Status: model.InProgressTask, CallbackAfterSeconds: max(int64(w.opts.HandBackAfter/time.Second), 1),
		OutputData: map[string]any{keptOutcomeKey: taskOutcomeOf(o)},
	}, true, true)
}

// keptOutcomeKey names the task output that holds an outcome the store
// did not take (keepOutcome) on its task, handed back: a restart or
// another replica that gets the task records and reports it instead of
// running the step again. A retry is a new task and starts without it.
const keptOutcomeKey = "sidecarKeptOutcome"

// taskOutcome is a kept outcome on its task.
type taskOutcome struct {
	RetryCount      int32                    `json:"retryCount"`
	EngineAttempt   int64                    `json:"engineAttemptId"`
	LogicalAttempt  int64                    `json:"logicalAttemptId"`
	OperatorAttempt bool                     `json:"operatorAttempt,omitempty"`
	TookMs          int64                    `json:"tookMs"`
	Artifacts       []statestore.ArtifactRef `json:"artifacts,omitempty"`
	Output          map[string]any           `json:"output,omitempty"`
	Error           *statestore.StepError    `json:"error,omitempty"`
}

func taskOutcomeOf(o keptOutcome) taskOutcome {
	return taskOutcome{RetryCount: o.retryCount, EngineAttempt: o.engine, LogicalAttempt: o.logical, OperatorAttempt: o.operatorAttempt,
		TookMs: o.took.Milliseconds(), Artifacts: o.res.Artifacts, Output: o.res.Output, Error: o.res.Err}
}

// keptOutcomeOf returns the outcome kept on t, if t carries one of its own
// try whose step the log (snap) still has in flight at that attempt: an
// outcome recorded since, or an attempt the log has moved past (an
// operator's retry runs on the same task), is not used again.
func keptOutcomeOf(t *model.Task, snap *statestore.RunSnapshot, stepID string) (keptOutcome, bool) {
	v, ok := t.OutputData[keptOutcomeKey]
	if !ok {
		return keptOutcome{}, false
	}
	b, err := json.Marshal(v)
	var o taskOutcome
	if err != nil || json.Unmarshal(b, &o) != nil || o.RetryCount != t.RetryCount {
		return keptOutcome{}, false
	}
	st := snapStep(snap, stepID)
	if st == nil || st.Status != statestore.StepStatusRunning || st.LogicalAttemptID != o.LogicalAttempt || st.EngineAttemptID != o.EngineAttempt {
		return keptOutcome{}, false
	}
	return keptOutcome{retryCount: o.RetryCount, res: Result{Artifacts: o.Artifacts, Output: o.Output, Err: o.Error},
		engine: o.EngineAttempt, logical: o.LogicalAttempt, operatorAttempt: o.OperatorAttempt, took: time.Duration(o.TookMs) * time.Millisecond}, true
}

// hold keeps the task of a step that failed under onStepFailure "pause":
// the run is paused (reason stepFailed) and the task handed back, so that
// Conductor neither fails it nor runs the workflow on; while the run is
// paused every poll hands it back again. After a RETRY_STEP and RESUME it
// runs as the next logical attempt. A failed pause is retried at the next
// poll (the task comes back after HandBackAfter).
func (w *Worker) hold(t *model.Task, log *zap.Logger, a *Assignment) {
	if w.opts.PauseOnFailure != nil {
		if err := w.opts.PauseOnFailure(w.workCtx, a.RunID, t.WorkflowInstanceId, a.Step.StepID); err != nil {
			log.Warn("could not pause the run after a held step failure; retrying at the next poll", zap.Error(err))
		}
	}
	w.opts.Metrics.handedBack(handBackHeld)
	w.handBack(t, w.opts.HandBackAfter, "held after failure")
}

// failedResult is the Conductor result of a logical attempt that failed for
// good: FAILED lets Conductor start the next logical attempt while the
// retry budget allows it; a non-retryable error ends the step.
func failedResult(a *Assignment, e *statestore.StepError, engine, logical int64) *model.TaskResult {
	r := &model.TaskResult{Status: model.FailedTask}
	if e != nil {
		r.ReasonForIncompletion = e.Code + ": " + e.Message
		if !e.Retryable {
			r.Status = model.FailedWithTerminalErrorTask
		}
	}
	return r
}

// loggedOutput is the output of a step the log has completed, reported
// for a try Conductor asks for again: the artifacts the log refers to
// and, for an outside worker's step, the output its update carried when
// that update did not reach Conductor (unreported.go). The log has
// outcomes, not data: an outside worker's output that was not kept is
// lost, and said so.
func (w *Worker) loggedOutput(log *zap.Logger, a *Assignment, d decision) map[string]any {
	if w.executors[a.Step.Executor.Type] != nil { // the sidecar's own step: its output is its artifacts
		return artifactOutput(d.step.Artifacts, nil)
	}
	out, kept := w.unreported.take(w.workCtx, stepAttempt{run: a.RunID, step: a.Step.StepID, logical: d.logical})
	if !kept {
		log.Warn("reporting an outside worker's completed step without its output: the update that carried it never reached Conductor, and no copy of it is kept (older than an hour, or the keep was full or away when it came)")
	}
	return artifactOutput(d.step.Artifacts, out)
}

func artifactOutput(refs []statestore.ArtifactRef, out map[string]any) map[string]any {
	m := make(map[string]any, len(out)+1)
	for k, v := range out {
		m[k] = v
	}
	if len(refs) > 0 {
		m["artifacts"] = refs
	}
	return m
}

// emit records a step's outcome (StepCompleted or StepFailed, payload's
// type) for the attempt: emitEvent without a fence; st, when set, is the
// run as the step's StepStarted left it.
func (w *Worker) emit(log *zap.Logger, a *Assignment, engine, logical int64, payload statestore.Payload, st *startedRun) error {
	_, err := w.record(log, a, engine, logical, payload, st)
	return err
}

// record is emit; settled reports that the outcome was persisted on the
// run as the step's StepStarted left it (outcome), so that no drain of
// the run can wait for the step.
func (w *Worker) record(log *zap.Logger, a *Assignment, engine, logical int64, payload statestore.Payload, st *startedRun) (settled bool, err error) {
	ev, err := statestore.NewEvent(runRef(a), payload.EventType(), a.Step.StepID, engine, logical, payload)
	if err != nil {
		return false, err
	}
	_, settled, err = w.emitEvent(log, ev, -1, st)
	return settled, err
}

// emitEvent appends a step event. StepStarted is appended conditioned on
// lastSeq, the runSeq the gate decided on (RUN_CHANGED when the run moved
// on), and fails open: it is queued in the outbox when the store does not
// answer within the write budget (a zero result, no error). The other
// events (lastSeq < 0) never fail open, and flush the outbox first, so
// that a run's events keep their order; they are checked against the
// run's state (checkOutcome), which st gives without a read while the run
// has not moved since the step's StepStarted (outcome); settled is true
// when the outcome was persisted that way.
func (w *Worker) emitEvent(log *zap.Logger, ev *statestore.RunEventWrite, lastSeq int64, st *startedRun) (res statestore.AppendResult, settled bool, err error) {
	failOpen := lastSeq >= 0
	eventType := ev.EventType
	log = log.With(zap.String("eventType", eventType))
	ctx, cancel := context.WithTimeout(w.workCtx, w.opts.WriteBudget)
	defer cancel()
	began := time.Now()
	switch {
	case failOpen:
		res, err = w.events.EmitIf(ctx, ev, lastSeq)
	default:
		if err := w.outbox.flush(ctx, ev.RunID); err != nil {
			if !w.storeTrouble(log, err, "an outbox was not flushed within the write budget; not recording") {
				log.Error("outbox not flushed within the write budget; not recording", zap.Error(err))
			}
			return res, false, err
		}
		var done bool
		if res, done, err = w.outcome(ctx, ev, st); !done {
			if snap, err := w.checkOutcome(ctx, ev); err != nil {
				if errors.Is(err, statestore.ErrInvalidTransition) {
					logRefusedOutcome(log, snap, ev, err)
				}
				return res, false, err
			}
			began = time.Now()
			res, err = w.events.Emit(ctx, ev)
		} else {
			settled = res.Persisted
		}
	}
	w.opts.Metrics.eventWrite(eventType, err, time.Since(began))
	if err == nil {
		w.storeDown.Recovered(w.log, "the state store answers again: the tasks handed back meanwhile are recorded as Conductor offers them again")
	}
	if err == nil || errors.Is(err, statestore.ErrRunChanged) {
		return res, settled, err
	}
	if errors.Is(err, statestore.ErrSchemaValidation) || !failOpen {
		if !w.storeTrouble(log, err, "an event was not recorded") {
			log.Error("event not recorded", zap.Error(err))
		}
		return res, false, err
	}
	log.Warn("state store slow or down; StepStarted queued in the outbox", zap.Error(err))
	w.outbox.add(ev)
	return statestore.AppendResult{}, false, nil
}

// outcome appends the outcome ev without reading the run while it has
// not moved since the step's StepStarted: checked against st (the run as
// the StepStarted left it) and appended conditioned on st.seq, so that
// the check holds for the state the append lands on. done is false when
// that cannot decide: no st, the run moved on (RUN_CHANGED, nothing
// written), or st refuses ev (then the run's state now decides).
func (w *Worker) outcome(ctx context.Context, ev *statestore.RunEventWrite, st *startedRun) (res statestore.AppendResult, done bool, err error) {
	if st == nil || statestore.CheckTransition(st.snap, ev) != nil {
		return res, false, nil
	}
	res, err = w.events.EmitIf(ctx, ev, st.seq)
	if errors.Is(err, statestore.ErrRunChanged) {
		return res, false, nil
	}
	return res, true, err
}

// checkOutcome is the producer guard (Layer 1) of StepCompleted and
// StepFailed: the outcome must be a valid transition from the run's state
// read now, after the outbox put the step's StepStarted in the log. It is
// not when another writer recorded an outcome of the same attempt first (a
// second worker ran the task Conductor handed out again after a response
// timeout): INVALID_TRANSITION, and the caller reports the log's outcome
// instead. A state that cannot be read is left to the append, which fails
// the same way.
func (w *Worker) checkOutcome(ctx context.Context, ev *statestore.RunEventWrite) (*statestore.RunSnapshot, error) {
	snap, err := w.runs.ProjectSnapshot(ctx, ev.RunID)
	if err != nil {
		return nil, nil
	}
	if err := statestore.CheckTransition(snap, ev); err != nil {
		return w.confirmRefusal(ctx, ev)
	}
	return snap, nil
}

// confirmRefusal decides an outcome that a read of the run refused again,
// on a read that sees every append before it: a refused outcome is
// dropped (the log's is reported instead, and the task may be offered and
// run again), while a read may lag the log (a JetStream replica behind its
// leader answers it, as during a leader election, and the step's own
// StepStarted may have just been put in the log by the outbox). It returns
// INVALID_TRANSITION only on that read; a read that fails is the store's
// trouble (STORE_UNAVAILABLE), and the outcome is kept, not dropped.
func (w *Worker) confirmRefusal(ctx context.Context, ev *statestore.RunEventWrite) (*statestore.RunSnapshot, error) {
	latest, err := w.runs.ProjectSnapshot(statestore.WithLatest(ctx), ev.RunID)
	if err != nil {
		return nil, &statestore.Error{Code: statestore.CodeStoreUnavailable,
			Message: "the run's state could not be read to confirm that it refuses the step's " + ev.EventType, Err: err}
	}
	return latest, statestore.CheckTransition(latest, ev)
}

// logRefusedOutcome logs an outcome the run's state refused (err): as
// the repeat it is when snap already has that very outcome for the
// attempt (a worker that reports again, an update retried after its
// forward failed), else as the error it is.
func logRefusedOutcome(log *zap.Logger, snap *statestore.RunSnapshot, ev *statestore.RunEventWrite, err error) {
	if st := snapStep(snap, ev.StepID); st != nil && st.LogicalAttemptID == ev.LogicalAttemptID &&
		(ev.EventType == statestore.StepCompleted && st.Status == statestore.StepStatusSuccess ||
			ev.EventType == statestore.StepFailed && st.Status == statestore.StepStatusFailed) {
		log.Info("the step's outcome is already in the log (a repeated report); not recording it again")
		return
	}
	if snap == nil {
		log.Error("the step's outcome is not a valid transition from the run's state; not recording it", zap.Error(err))
		return
	}
	// The run or the step ended otherwise meanwhile (a cancel, a task
	// ended or a workflow terminated in Conductor): expected, not a fault.
	log.Warn("the step's outcome is not a valid transition from the run's state (the run or the step ended otherwise); not recording it", zap.Error(err))
}

// reportLogged reports to Conductor the outcome the log has for the
// attempt, when the worker's own was refused by checkOutcome: the log and
// Conductor then agree. If the log has no outcome for it, the task is
// handed back and gated again when it returns.
func (w *Worker) reportLogged(t *model.Task, log *zap.Logger, a *Assignment, engine, logical int64) {
	w.opts.Metrics.stepRefused(a.Step.Executor.Type)
	// On a read that sees every append, as the refusal was decided
	// (confirmRefusal): one that lags the log may not show the outcome
	// the step's own was refused for.
	snap, err := w.runs.ProjectSnapshot(statestore.WithLatest(w.workCtx), a.RunID)
	if err != nil {
		w.handBack(t, w.opts.HandBackAfter, "state unavailable")
		return
	}
	switch d := gate(snap, t.WorkflowInstanceId, a.Step.StepID, engine, logical); d.verdict {
	case reportCompleted:
		log.Warn("the log already has the attempt's StepCompleted; reporting it")
		w.update(t, log, &model.TaskResult{Status: model.CompletedTask, OutputData: w.loggedOutput(log, a, d)})
	case reportFailed:
		log.Warn("the log already has the attempt's StepFailed; reporting it")
		w.update(t, log, failedResult(a, d.step.Error, d.engine, d.logical))
	case holdFailed:
		w.hold(t, log, a)
	default:
		w.handBack(t, w.opts.HandBackAfter, "outcome refused")
	}
}

// runnable reports whether the step can start: an executor of its type is
// registered here, or an outside worker runs it (an external step, gated
// by Admit).
func (w *Worker) runnable(a *Assignment) bool {
	return a.Step.Executor.Type == plan.ExecutorExternal || w.executors[a.Step.Executor.Type] != nil
}

// runRef is the run an Assignment's events belong to.
func runRef(a *Assignment) statestore.RunRef {
	return statestore.RunRef{RunID: a.RunID, TenantID: a.TenantID, ProjectID: a.ProjectID,
		EnvironmentID: a.EnvironmentID, PlanID: a.PlanID, PlanVersion: a.PlanVersion}
}

// refuseForeign fails a task of a workflow that is not its run's workflow
// (an orphan of a crashed start, terminated by the adapter's reconcile).
func (w *Worker) refuseForeign(t *model.Task, log *zap.Logger) {
	log.Warn("task belongs to a workflow that is not its run's workflow; not running it")
	w.opts.Metrics.handedBack(handBackForeign)
	w.update(t, log, &model.TaskResult{Status: model.FailedWithTerminalErrorTask, ReasonForIncompletion: CodeForeignWorkflow + ": not the run's workflow"})
}

// snapStep is snap's step stepID (nil without snap or such a step).
func snapStep(snap *statestore.RunSnapshot, stepID string) *statestore.StepSnapshot {
	if snap == nil {
		return nil
	}
	return snap.Step(stepID)
}
