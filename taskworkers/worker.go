package taskworkers

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TaskClient is the part of Conductor's task API the workers use.
type TaskClient interface {
	// BatchPoll long-polls up to count tasks of taskType, waiting at most
	// timeout; no task is an empty slice and no error.
	BatchPoll(ctx context.Context, taskType, workerID string, count int, timeout time.Duration) ([]model.Task, error)
	// UpdateTask reports a task's result.
	UpdateTask(ctx context.Context, r *model.TaskResult) error
}

// SnapshotReader gives a run's derived state (the projector's snapshot).
type SnapshotReader interface {
	ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error)
}

// Emitter appends events through the EventIdRegistry protocol
// (registry.Emitter).
type Emitter interface {
	Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error)
	// EmitIf appends only if the run's last runSeq is lastSeq (else an
	// error matching statestore.ErrRunChanged, nothing written).
	EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error)
}

// SecretResolver resolves a step's secret references right before it runs.
type SecretResolver interface {
	Resolve(ctx context.Context, refs []plan.SecretRef) (map[string]string, error)
}

// Assignment is what a worker needs from a Conductor task's input: the
// decoded task input of the plan compiler (run and plan ids, the step, its
// engine tries E and logical attempts L, the failure policy). Its Attempts
// derives (engineAttemptId, logicalAttemptId) from Conductor's retryCount.
type Assignment = plan.TaskInput

// Options configures a Worker. Zero durations take the defaults noted.
type Options struct {
	// WorkerID identifies this sidecar to Conductor.
	WorkerID string
	// Concurrency is the number of steps run at once per task type; only
	// the task types listed are polled.
	Concurrency map[string]int
	// PollInterval is the pause after a poll that found no task (default
	// 100ms, as the Conductor SDKs). A poll that found tasks is followed by
	// the next one at once.
	PollInterval time.Duration
	// PollTimeout is the server-side wait of one batch poll (default 0: no
	// wait). Conductor 3.21 does not hand a waiting poll a task that is
	// queued during the wait: the poll returns empty at its timeout, so a
	// wait only delays the task (measured: a 2 s poll, task queued 0.3 s
	// in, answered empty after 2.0 s). Tests set it to keep that visible.
	PollTimeout time.Duration
	// BatchSize caps the tasks asked for in one poll (default 8).
	BatchSize int
	// HandBackAfter is the callbackAfterSeconds of a task handed back
	// because its run is paused or not started yet (default 5s).
	HandBackAfter time.Duration
	// WriteBudget bounds an event append (seed 001 §5: 3s). StepStarted
	// fails open to the outbox past it; StepCompleted and StepFailed never
	// fail open.
	WriteBudget time.Duration
	// Decode turns a task's input into an Assignment (default
	// plan.DecodeTaskInput).
	Decode func(input map[string]any) (*Assignment, error)
	// Guard, when set, is called for a task whose run has no RunStarted in
	// the log yet: it checks that workflowID is the run's workflow and
	// records RunStarted (closing the window between a start and its
	// event). It returns ErrForeignWorkflow for a workflow that is not the
	// run's (an orphan of a crashed start): such a task is never run.
	Guard func(ctx context.Context, runID, workflowID string) error
	// Recover, when set, is called once by Open, before polling: it returns
	// the tasks Conductor still shows in progress under this WorkerID, left
	// by a previous process that died (kill -9). They are handed back at
	// once, instead of after Conductor's response timeout.
	Recover func(ctx context.Context) ([]model.Task, error)
	// OnTaskDone, when set, is called after a step's outcome was reported
	// to Conductor (the nudge of the run watcher and the drain monitor).
	// mayEndRun is false when the step completed and the plan has steps
	// that depend on it (plan.InputSink): Conductor goes on with the run,
	// so its status need not be read.
	OnTaskDone func(runID string, mayEndRun bool)
	// PauseOnFailure, when set, pauses a run whose step failed for good
	// under onStepFailure "pause" (RunPaused, reason stepFailed, the step
	// id); the step's task is then held, not failed. Without it such a
	// step is held all the same, and the run is not paused.
	PauseOnFailure func(ctx context.Context, runID, workflowID, stepID string) error
	// Running is the set of the steps this worker runs, which a run's
	// cancel interrupts (nil: a set of its own). Create it first and give
	// it to the drain controller too (drain.Options.Interrupt).
	Running *Running
	Logger  *zap.Logger
	// Metrics may be nil.
	Metrics *Metrics
}

// Worker polls Conductor for the sidecar's task types and runs each task's
// step: it checks the run's state (the pause gate), records StepStarted,
// executes, records StepCompleted or StepFailed, and reports to Conductor.
type Worker struct {
	tasks     TaskClient
	runs      SnapshotReader
	events    Emitter
	secrets   SecretResolver
	executors map[string]Executor
	opts      Options
	log       *zap.Logger
	outbox    *outbox

	// pollCtx stops polling; workCtx interrupts running steps.
	pollCtx, workCtx      context.Context
	stopPolling, stopWork context.CancelFunc
	polling, working      sync.WaitGroup
	// reportCtx bounds reports to Conductor: cancelled (abortReports)
	// when the shutdown grace period is over.
	reportCtx    context.Context
	abortReports context.CancelFunc
	// wake holds one channel per polled task type: a task's outcome
	// reported to Conductor wakes the idle poll loops, since Conductor
	// schedules the step's successors as it takes the update.
	wake map[string]chan struct{}

	running *Running
	// starting serializes, per run, the gate's read and its conditional
	// StepStarted within this process, so that the run's steps starting
	// together do not refuse each other's appends (RUN_CHANGED); other
	// processes' appends are still caught by the fence.
	starting keyedMutex
}

// New returns a Worker. Executors maps an executor type (plan.ExecutorCommand,
// ...) to its Executor.
func New(tasks TaskClient, runs SnapshotReader, events Emitter, secrets SecretResolver, executors map[string]Executor, opts Options) *Worker {
	if opts.PollInterval <= 0 {
		opts.PollInterval = 100 * time.Millisecond
	}
	if opts.PollTimeout < 0 {
		opts.PollTimeout = 0
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 8
	}
	if opts.HandBackAfter <= 0 {
		opts.HandBackAfter = 5 * time.Second
	}
	if opts.WriteBudget <= 0 {
		opts.WriteBudget = 3 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Decode == nil {
		opts.Decode = plan.DecodeTaskInput
	}
	if opts.Running == nil {
		opts.Running = NewRunning()
	}
	w := &Worker{tasks: tasks, runs: runs, events: events, secrets: secrets, executors: executors, opts: opts,
		log: opts.Logger.Named("worker"), running: opts.Running,
		wake: map[string]chan struct{}{}}
	w.reportCtx, w.abortReports = context.WithCancel(context.Background())
	var types []string
	for taskType, n := range opts.Concurrency {
		if n > 0 {
			w.wake[taskType] = make(chan struct{}, 1)
			types = append(types, taskType)
		}
	}
	opts.Metrics.taskTypes(types)
	w.outbox = newOutbox(events, w.log, opts.Metrics)
	return w
}

// Open starts one poll loop per task type of Options.Concurrency.
func (w *Worker) Open(ctx context.Context) error {
	if w.opts.WorkerID == "" {
		return errors.New("taskworkers: Options.WorkerID is required")
	}
	w.pollCtx, w.stopPolling = context.WithCancel(context.WithoutCancel(ctx))
	w.workCtx, w.stopWork = context.WithCancel(context.WithoutCancel(ctx))
	w.outbox.open(w.workCtx)
	if w.opts.Recover != nil {
		left, err := w.opts.Recover(ctx)
		if err != nil {
			w.log.Warn("could not list the tasks a previous process left in progress; Conductor's response timeout will retry them", zap.Error(err))
		}
		for i := range left {
			t := &left[i]
			log := w.log.With(zap.String("taskId", t.TaskId), zap.String("workflowId", t.WorkflowInstanceId))
			log.Info("handing back a task left in progress by a previous process")
			if a, err := w.opts.Decode(t.InputData); err == nil {
				_, logical := a.Attempts(int(t.RetryCount))
				w.endTry(log, a, logical, statestore.TryEndedWorkerRestarted, nil)
			}
			w.handBack(t, 0, "recovered after restart")
		}
	}
	for taskType, n := range w.opts.Concurrency {
		if n <= 0 {
			continue
		}
		w.polling.Add(1)
		go func() {
			defer w.polling.Done()
			w.pollLoop(taskType, n)
		}()
	}
	return nil
}

// Stop stops polling; steps already running go on. It does not wait.
func (w *Worker) Stop() {
	if w.stopPolling != nil {
		w.stopPolling()
	}
}

// Close stops polling and waits for running steps to finish until ctx is
// done (the shutdown grace period). Steps still running then are
// interrupted and their tasks handed back to Conductor, so that another
// worker picks them up; their StepStarted is reused by the retry (same
// attempt, same idempotencyKey).
func (w *Worker) Close(ctx context.Context) error {
	w.Stop()
	done := make(chan struct{})
	go func() {
		w.polling.Wait()
		w.working.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		w.log.Warn("shutdown grace period over; interrupting running steps and giving up reports Conductor does not take")
		err = ctx.Err()
		w.abortReports()
		w.stopWork()
		<-done
	}
	w.abortReports()
	w.stopWork()
	w.outbox.close()
	return err
}

// Interrupt cancels the running steps of runID on this process (see
// Running.Interrupt).
func (w *Worker) Interrupt(runID string) int { return w.running.Interrupt(runID) }

func (w *Worker) pollLoop(taskType string, concurrency int) {
	log := w.log.With(zap.String("taskType", taskType))
	slots := make(chan struct{}, concurrency)
	backoff := time.Duration(0)
	for {
		// Wait for at least one free slot before polling, so tasks are
		// never taken without capacity to run them.
		select {
		case slots <- struct{}{}:
			<-slots
		case <-w.pollCtx.Done():
			return
		}
		free := concurrency - len(slots)
		// The poll is never aborted by Stop: Conductor would go on
		// long-polling for an abandoned request and could hand it a task
		// nobody receives (stuck IN_PROGRESS until its response timeout).
		// It ends within PollTimeout; what it returns after Stop is handed
		// back.
		pctx, cancel := context.WithTimeout(w.workCtx, w.opts.PollTimeout+10*time.Second)
		tasks, err := w.tasks.BatchPoll(pctx, taskType, w.opts.WorkerID, min(free, w.opts.BatchSize), w.opts.PollTimeout)
		cancel()
		if w.pollCtx.Err() != nil {
			// Tasks polled as we stopped are handed back at once.
			for i := range tasks {
				w.handBack(&tasks[i], 0, "shutdown")
			}
			return
		}
		if err != nil {
			w.opts.Metrics.pollError(taskType)
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			log.Warn("poll failed; backing off", zap.Duration("backoff", backoff), zap.Error(err))
			select {
			case <-time.After(backoff):
			case <-w.pollCtx.Done():
				return
			}
			continue
		}
		if backoff > 0 {
			log.Info("polling recovered")
			backoff = 0
		}
		w.opts.Metrics.polled(taskType, len(tasks))
		if len(tasks) == 0 {
			// Nothing queued: wait before the next poll. Conductor's batch
			// poll answers at once with what is queued (wait 0); it does not
			// wake a waiting poll for a new task (see PollTimeout).
			select {
			case <-time.After(w.opts.PollInterval):
			case <-w.wake[taskType]:
			case <-w.pollCtx.Done():
				return
			}
			continue
		}
		for i := range tasks {
			slots <- struct{}{}
			t := tasks[i]
			w.working.Add(1)
			go func() {
				defer w.working.Done()
				defer func() { <-slots }()
				w.handle(&t)
			}()
		}
	}
}

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

	d, ok := w.begin(t, log, a, engine, logical)
	if !ok {
		return
	}
	engine, logical, operatorAttempt := d.engine, d.logical, d.operatorAttempt
	if operatorAttempt {
		log = stepLog.With(zap.Int64("logicalAttemptId", logical), zap.Int64("engineAttemptId", engine), zap.Bool("operatorRetry", true))
	}
	exec := w.executors[a.Step.Executor.Type]

	res, runErr := w.execute(t, a, exec, engine, logical)
	if runErr != nil {
		// The executor could not run at all: hand the task back, same attempt.
		log.Warn("executor could not run; handing the task back", zap.Error(runErr))
		w.endTry(log, a, logical, statestore.TryEndedHandedBack, nil)
		w.handBack(t, w.opts.HandBackAfter, "executor unavailable")
		return
	}
	if w.workCtx.Err() != nil && res.Err != nil {
		// Interrupted by shutdown, not by the step: another worker retries it.
		w.endTry(log, a, logical, statestore.TryEndedHandedBack, nil)
		w.handBack(t, 0, "shutdown")
		return
	}
	w.finish(t, log, a, res, engine, logical, operatorAttempt, time.Since(start))
}

// maxFenceRetries bounds how often begin decides again after its
// StepStarted found the run moved on (RUN_CHANGED): each retry reads the
// run's new state, so it ends at once if the change was a pause.
const maxFenceRetries = 64

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
		if statestore.IsTerminalRunStatus(snap.Status) {
			// The run's log is final; a task of it is one Conductor made
			// after the end: the workflow was restarted, rerun or retried
			// in Conductor. Refused: a run ends once (docs/conductor.md,
			// "Actions taken in Conductor").
			log.Warn("task of a run that already ended (its workflow was restarted, rerun or retried in Conductor?); refusing it: the run's log is final, start a new run instead",
				zap.String("status", snap.Status))
			w.opts.Metrics.handedBack(handBackRunEnded)
		} else {
			log.Info("run is being cancelled; not starting the step")
		}
		w.update(t, log, &model.TaskResult{Status: model.FailedWithTerminalErrorTask, ReasonForIncompletion: "RUN_" + snap.Status})
		return d, false
	case d.verdict == waitPaused:
		w.opts.Metrics.handedBack(handBackPaused)
		w.handBack(t, w.opts.HandBackAfter, "run paused")
		return d, false
	case d.verdict == waitNotRunning:
		w.handBack(t, time.Second, "run not running yet")
		return d, false
	case d.verdict == reportCompleted:
		log.Info("step already completed in the log; reporting it without running it again")
		w.update(t, log, &model.TaskResult{Status: model.CompletedTask, OutputData: artifactOutput(d.step.Artifacts, nil)})
		return d, false
	case d.verdict == holdFailed:
		w.hold(t, log, a)
		return d, false
	case d.verdict == reportFailed:
		log.Info("step already failed in the log; reporting it without running it again")
		w.update(t, log, failedResult(a, d.step.Error, d.engine, d.logical))
		return d, false
	case w.executors[a.Step.Executor.Type] == nil:
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
// an idle attempt, appended on the runSeq the gate decided on. It decides
// again while the run moves on under it (RUN_CHANGED), at most
// maxFenceRetries times. The read and the append are serialized per run
// within this process. snap is nil when runState already answered the
// task; err is set when the start could not be recorded.
func (w *Worker) start(t *model.Task, log *zap.Logger, a *Assignment, engine, logical int64) (snap *statestore.RunSnapshot, d decision, err error) {
	unlock := w.starting.lock(a.RunID)
	defer unlock()
	for try := 0; ; try++ {
		var ok bool
		if snap, ok = w.runState(t, log, a); !ok {
			return nil, d, nil
		}
		d = gate(snap, t.WorkflowInstanceId, a.Step.StepID, engine, logical)
		if d.verdict != start || w.executors[a.Step.Executor.Type] == nil {
			return snap, d, nil
		}
		if st := d.step; st != nil && st.Status == statestore.StepStatusRunning && st.LogicalAttemptID == d.logical && st.Idle {
			// A later try of an attempt whose StepStarted is in the log
			// (deduplicated if appended again): record that it runs again.
			err = w.tryEvent(w.workCtx, a, snap, statestore.RunStepTryStarted, d.logical, "", nil)
		} else {
			err = w.emit(log, a, statestore.StepStarted, d.engine, d.logical, nil, snap.LastEventSeq)
		}
		if errors.Is(err, statestore.ErrRunChanged) && try < maxFenceRetries {
			w.opts.Metrics.fenceRetry()
			continue // the run moved on since the gate read it: decide again
		}
		return snap, d, err
	}
}

// endTry records that the step's current try ended without an outcome for
// its logical attempt (RunStepTryEnded with reason), so that no drain waits
// for it. It is best effort: if the store does not take it within the write
// budget, a drain of the run waits for the step until its timeout, as it
// would for a running one.
func (w *Worker) endTry(log *zap.Logger, a *Assignment, logical int64, reason string, stepErr *statestore.StepError) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.workCtx), w.opts.WriteBudget)
	defer cancel()
	for try := 0; ; try++ {
		snap, err := w.runs.ProjectSnapshot(ctx, a.RunID)
		if err == nil {
			st := snap.Step(a.Step.StepID)
			if st == nil || st.Status != statestore.StepStatusRunning || st.LogicalAttemptID != logical || st.Idle {
				return // not in flight in the log: nothing to record
			}
			err = w.tryEvent(ctx, a, snap, statestore.RunStepTryEnded, logical, reason, stepErr)
		}
		if err == nil || !errors.Is(err, statestore.ErrRunChanged) || try >= maxFenceRetries {
			if err != nil {
				log.Warn("could not record that the step's try ended; a drain of the run waits for it until its timeout", zap.Error(err))
			}
			return
		}
	}
}

// tryEvent appends RunStepTryEnded or RunStepTryStarted for the step at
// logical attempt, numbered after snap's last try event and conditioned on
// snap's last runSeq (RUN_CHANGED when the run moved on). The number is per
// run, so a concurrent try event of another step may have taken it, and
// ours was then answered as its duplicate: tryEvent reads the run again and
// reports RUN_CHANGED unless the step is now as the event says.
func (w *Worker) tryEvent(ctx context.Context, a *Assignment, snap *statestore.RunSnapshot, eventType string, logical int64, reason string, stepErr *statestore.StepError) error {
	payload := map[string]any{"stepId": a.Step.StepID, "stepLogicalAttemptId": logical}
	if reason != "" {
		payload["reason"] = reason
	}
	if stepErr != nil {
		payload["error"] = stepErr
	}
	ev, err := statestore.NewEvent(runRef(a), eventType, "", 1, snap.StepTryEvents+1, payload)
	if err != nil {
		return err
	}
	if err := statestore.CheckTransition(snap, ev); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, w.opts.WriteBudget)
	defer cancel()
	began := time.Now()
	_, err = w.events.EmitIf(ctx, ev, snap.LastEventSeq)
	w.opts.Metrics.eventWrite(eventType, err, time.Since(began))
	if err != nil {
		return err
	}
	after, err := w.runs.ProjectSnapshot(ctx, a.RunID)
	if err != nil {
		return err
	}
	if st := after.Step(a.Step.StepID); st == nil || st.Idle != (eventType == statestore.RunStepTryEnded) {
		return statestore.RunChanged(a.RunID, snap.LastEventSeq, after.LastEventSeq)
	}
	return nil
}

// runState reads the run's derived state for a polled task. A run without
// events is brought to RunStarted by Options.Guard when the task's
// workflow is the run's. A task that cannot be gated is handed back (or
// refused) here, and ok is false.
func (w *Worker) runState(t *model.Task, log *zap.Logger, a *Assignment) (*statestore.RunSnapshot, bool) {
	snap, err := w.runs.ProjectSnapshot(w.workCtx, a.RunID)
	if errors.Is(err, statestore.ErrNotFound) && w.opts.Guard != nil {
		// RunStarted is appended right after Conductor starts the workflow;
		// the task can be polled first. The guard records it.
		if gerr := w.opts.Guard(w.workCtx, a.RunID, t.WorkflowInstanceId); gerr != nil {
			if errors.Is(gerr, ErrForeignWorkflow) {
				w.refuseForeign(t, log)
				return nil, false
			}
			if errors.Is(gerr, ErrUnknownRun) {
				log.Warn("task of a run this sidecar does not know (another deployment on the same Conductor? give each its own --task-domain); handing it back", zap.Error(gerr))
				w.opts.Metrics.handedBack(handBackUnknown)
				w.handBack(t, w.opts.HandBackAfter, "unknown run")
				return nil, false
			}
			log.Info("run start not recorded yet; handing the task back", zap.Error(gerr))
			w.handBack(t, time.Second, "run not started yet")
			return nil, false
		}
		snap, err = w.runs.ProjectSnapshot(w.workCtx, a.RunID)
	}
	switch {
	case errors.Is(err, statestore.ErrNotFound):
		w.handBack(t, time.Second, "run not started yet")
		return nil, false
	case err != nil:
		log.Warn("cannot read the run's state; handing the task back", zap.Error(err))
		w.handBack(t, w.opts.HandBackAfter, "state unavailable")
		return nil, false
	}
	return snap, true
}

func (w *Worker) execute(t *model.Task, a *Assignment, exec Executor, engine, logical int64) (Result, error) {
	ctx, cancel := context.WithCancel(w.workCtx)
	defer cancel()
	w.running.track(a.RunID, t.TaskId, cancel)
	defer w.running.untrack(a.RunID, t.TaskId)
	if a.Step.TimeoutSeconds > 0 {
		var tcancel context.CancelFunc
		ctx, tcancel = context.WithTimeout(ctx, time.Duration(a.Step.TimeoutSeconds)*time.Second)
		defer tcancel()
	}
	var secrets map[string]string
	if len(a.Step.Secrets) > 0 {
		var err error
		if secrets, err = w.secrets.Resolve(ctx, a.Step.Secrets); err != nil {
			return Result{Err: &statestore.StepError{Code: statestore.CodeOf(err), Message: err.Error()}}, nil
		}
	}
	return exec.Execute(ctx, Execution{RunID: a.RunID, StepID: a.Step.StepID, LogicalAttemptID: logical,
		EngineAttemptID: engine, Spec: a.Step.Executor, Secrets: secrets})
}

// finish records the step's outcome and reports it to Conductor.
func (w *Worker) finish(t *model.Task, log *zap.Logger, a *Assignment, res Result, engine, logical int64, operatorAttempt bool, took time.Duration) {
	kind := a.Step.Executor.Type
	if res.Err == nil {
		payload := map[string]any{}
		if len(res.Artifacts) > 0 {
			payload["artifacts"] = res.Artifacts
		}
		if err := w.emit(log, a, statestore.StepCompleted, engine, logical, payload, -1); err != nil {
			// Never fail open: without StepCompleted the task must not complete.
			w.update(t, log, &model.TaskResult{Status: model.FailedTask, ReasonForIncompletion: CodeStoreUnavailable + ": StepCompleted not recorded"})
			return
		}
		w.opts.Metrics.stepDone(kind, "completed", took)
		w.update(t, log, &model.TaskResult{Status: model.CompletedTask, OutputData: artifactOutput(res.Artifacts, res.Output)})
		return
	}
	final := !res.Err.Retryable || engine >= int64(max(a.EngineTries, 1)) || operatorAttempt
	if !final {
		// An engine retry of the same logical attempt follows: logs and
		// metrics only, no StepFailed (DESIGN.md "Engine retries").
		log.Warn("step try failed; Conductor retries it", zap.String("code", res.Err.Code), zap.String("error", res.Err.Message))
		// Recorded before Conductor hears of it: once Conductor has the
		// failure, the next try may start (on any replica), and it must
		// find this try ended.
		w.endTry(log, a, logical, statestore.TryEndedEngineTryFailed, res.Err)
		w.opts.Metrics.stepDone(kind, "retried", took)
		w.update(t, log, &model.TaskResult{Status: model.FailedTask, ReasonForIncompletion: res.Err.Code + ": " + res.Err.Message, OutputData: artifactOutput(res.Artifacts, res.Output)})
		return
	}
	// For good: no logical attempt left, not retryable, or an operator's
	// retry. Under onStepFailure "pause" the run pauses and the task is held.
	held := a.OnStepFailure == plan.OnFailurePause &&
		(!res.Err.Retryable || logical >= int64(max(a.LogicalAttempts, 1)) || operatorAttempt)
	payload := map[string]any{"error": res.Err}
	if len(res.Artifacts) > 0 {
		payload["artifacts"] = res.Artifacts
	}
	if held {
		payload["onStepFailure"] = statestore.OnStepFailurePause
	}
	if err := w.emit(log, a, statestore.StepFailed, engine, logical, payload, -1); err != nil {
		w.update(t, log, &model.TaskResult{Status: model.FailedTask, ReasonForIncompletion: CodeStoreUnavailable + ": StepFailed not recorded"})
		return
	}
	w.opts.Metrics.stepDone(kind, "failed", took)
	log.Warn("step failed for this logical attempt", zap.String("code", res.Err.Code), zap.Bool("retryable", res.Err.Retryable), zap.Bool("held", held))
	if held {
		w.hold(t, log, a)
		return
	}
	r := failedResult(a, res.Err, engine, logical)
	r.OutputData = artifactOutput(res.Artifacts, res.Output)
	w.update(t, log, r)
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

// emit appends a step event. StepStarted is appended conditioned on
// lastSeq, the runSeq the gate decided on (RUN_CHANGED when the run moved
// on), and fails open: it is queued in the outbox when the store does not
// answer within the write budget. The other events (lastSeq < 0) never fail
// open, and flush the outbox first, so that a run's events keep their
// order.
func (w *Worker) emit(log *zap.Logger, a *Assignment, eventType string, engine, logical int64, payload map[string]any, lastSeq int64) error {
	failOpen := lastSeq >= 0
	var body any
	if len(payload) > 0 {
		body = payload
	}
	ev, err := statestore.NewEvent(runRef(a), eventType, a.Step.StepID, engine, logical, body)
	if err != nil {
		return err
	}
	log = log.With(zap.String("eventType", eventType))
	ctx, cancel := context.WithTimeout(w.workCtx, w.opts.WriteBudget)
	defer cancel()
	if !failOpen {
		if err := w.outbox.flush(ctx, a.RunID); err != nil {
			log.Error("outbox not flushed within the write budget; not recording", zap.Error(err))
			return err
		}
	}
	began := time.Now()
	if failOpen {
		_, err = w.events.EmitIf(ctx, ev, lastSeq)
	} else {
		_, err = w.events.Emit(ctx, ev)
	}
	w.opts.Metrics.eventWrite(eventType, err, time.Since(began))
	if err == nil || errors.Is(err, statestore.ErrRunChanged) {
		return err
	}
	if errors.Is(err, statestore.ErrSchemaValidation) || !failOpen {
		log.Error("event not recorded", zap.Error(err))
		return err
	}
	log.Warn("state store slow or down; StepStarted queued in the outbox", zap.Error(err))
	w.outbox.add(ev)
	return nil
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
		var coded interface{ ErrorCode() string }
		switch {
		case errors.As(err, &coded) && coded.ErrorCode() == "NOT_FOUND":
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
	for _, c := range w.wake {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}
