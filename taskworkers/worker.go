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
	"github.com/conductor-sidecar/sidecar/ratelog"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/tracing"
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

// WorkflowDefs reads workflow definitions from Conductor
// (adapter.Client).
type WorkflowDefs interface {
	WorkflowDef(ctx context.Context, name string, version int32) (*model.WorkflowDef, error)
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
	// PollIntervalMax bounds an idle loop's pause: after consecutive
	// empty polls it doubles from PollInterval up to PollIntervalMax
	// (default 1s; below PollInterval: no backoff). A poll that found
	// tasks, or a wake (a step's outcome reported, Wake, Wakeup, the end
	// of the callback of a task handed back here), starts over at
	// PollInterval. Work nothing here wakes for (a run started or resumed
	// through another replica, a resume made in Conductor, a retry
	// Conductor schedules after its delay) waits at most PollIntervalMax.
	PollIntervalMax time.Duration
	// PollTimeout is the server-side wait of one batch poll (default 0: no
	// wait). Conductor 3.21 does not hand a waiting poll a task that is
	// queued during the wait: the poll returns empty at its timeout, so a
	// wait only delays the task (measured: a 2 s poll, task queued 0.3 s
	// in, answered empty after 2.0 s). Tests set it to keep that visible.
	PollTimeout time.Duration
	// BatchSize caps the tasks asked for in one poll (default 8).
	BatchSize int
	// PollersPerType is the number of poll loops per task type (default
	// 1). A type's Concurrency is split between its loops (16 slots, 4
	// loops: 4 each; never more loops than slots), so their polls never
	// take more tasks than there are slots. Only a queue that takes
	// concurrent polls wants more than one: Conductor's memory store does
	// not (concurrent polls strand tasks on its Redis mock), its PostgreSQL
	// store does (docs/workers.md, "Pollers per task type").
	PollersPerType int
	// PollLinger is how long a busy poll loop waits for more free slots
	// before it polls for fewer than half of BatchSize (default 5ms; a
	// negative value polls as soon as one slot is free). An idle loop (all
	// slots free, or the last poll found nothing) never lingers, so it
	// adds nothing to an idle step's start.
	PollLinger time.Duration
	// HandBackAfter is the callbackAfterSeconds of a task handed back
	// because its run is paused or not started yet (default 5s).
	HandBackAfter time.Duration
	// WriteBudget bounds an event append (Execution Semantics Contract
	// v1.1 §5: 3s). StepStarted fails open to the outbox past it;
	// StepCompleted and StepFailed never fail open.
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
	// once, instead of after Conductor's response timeout. It is called
	// again after a poll whose answer may have been lost, to hand back the
	// tasks that answer carried (strays.go).
	Recover func(ctx context.Context) ([]model.Task, error)
	// OnTaskDone, when set, is called after a step's outcome was reported
	// to Conductor (the nudge of the run watcher and the drain monitor).
	// mayEndRun is false when the step completed and the plan has steps
	// that depend on it (plan.InputSink): Conductor goes on with the run,
	// so its status need not be read. mayEndDrain is false when the step's
	// outcome was appended on the run's state as the step's own
	// StepStarted left it (conditioned on that runSeq, so nothing came
	// between): the run was not paused then, and a pause recorded after
	// the outcome already counts the step as ended, so no drain waits
	// for it and the drain monitor need not read the run.
	OnTaskDone func(runID string, mayEndRun, mayEndDrain bool)
	// OnPausedTask, when set, is called for each task the gate hands
	// back because the log says its run is paused (or draining). It must
	// not block: the run watcher's Recheck, which reads the workflow in
	// Conductor (at most once per run per short interval) and records a
	// resume made there, so that the task passes at a later poll.
	OnPausedTask func(runID string)
	// OnCancellingTask, when set, is called for each task the gate hands
	// back because the log has the run's cancel requested and not ended.
	// It must not block: the run watcher's Recheck, whose read of the
	// workflow completes a cancel that never reached Conductor (its
	// process died before the terminate).
	OnCancellingTask func(runID string)
	// PauseOnFailure, when set, pauses a run whose step failed for good
	// under onStepFailure "pause" (RunPaused, reason stepFailed, the step
	// id); the step's task is then held, not failed. Without it such a
	// step is held all the same, and the run is not paused.
	PauseOnFailure func(ctx context.Context, runID, workflowID, stepID string) error
	// Tasks, when set, reads tasks back from Conductor: the watch of the
	// external steps handed to outside workers (Admit), which records
	// RunStepTryEnded (taskTimedOut) for a task Conductor ended without
	// its worker's report. Nil: no watch.
	Tasks TaskReader
	// ExternalInFlight, when set with Tasks, lists as Open runs the
	// external steps' tasks Conductor shows in progress, so that the watch
	// covers those a previous process handed out.
	ExternalInFlight func(ctx context.Context) ([]model.Task, error)
	// Adopted, when set, gives the assignments of the worker tasks of
	// adopted workflows, which then pass the same gate and recording as
	// external plan steps (External).
	Adopted AdoptedSteps
	// Definitions, when set, reads a plan's workflow definition from
	// Conductor, once per plan version, so that a step's outcome wakes
	// exactly the poll loops of the task types its plan's steps use
	// (none for a plan whose steps are all external). Nil: the types
	// polled for the plan before, every type for a plan never polled.
	Definitions WorkflowDefs
	// ExternalCheck is how often the watch reads back the tasks past
	// their response timeout (default 5s).
	ExternalCheck time.Duration
	// EngineTaskCheck is how often, with Tasks, a step this worker runs
	// has its task read back from Conductor while it runs, first once it
	// has run that long (default 5s; negative: never): a task Conductor
	// ended meanwhile (completed or failed by hand, its workflow
	// terminated or removed) interrupts the step, and the log records
	// what Conductor made of the task, not the step's own outcome.
	EngineTaskCheck time.Duration
	// Running is the set of the steps this worker runs, which a run's
	// cancel interrupts (nil: a set of its own). Create it first and give
	// it to the drain controller too (drain.Options.Interrupt).
	Running *Running
	// Wakeup, when set, wakes this worker's idle poll loops too (Wake):
	// create it first and give it to the components that make tasks
	// pollable (admission.Options.Waker, drain.Options.Waker).
	Wakeup *Wakeup
	// OutputKeep, when set, keeps outside workers' outputs whose update
	// did not reach Conductor where the next process and every replica
	// read them (unreported.go); without it they are kept in memory only.
	OutputKeep OutputKeep
	// StrayLook, when set, lets the components built with it ask this
	// worker for a look for strays (StrayLook.Ask); it needs Recover.
	StrayLook *StrayLook
	Logger    *zap.Logger
	// Metrics may be nil.
	Metrics *Metrics
	// Tracer makes a span per step attempt, a child of the run's span,
	// and gives its trace context to the step (nil: tracing off).
	Tracer *tracing.Tracer
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
	// kept holds outcomes the store did not take in time (kept.go).
	kept keptOutcomes
	// unreported holds outside workers' outputs whose update did not
	// reach Conductor (unreported.go).
	unreported unreportedOutputs
	// storeDown bounds the lines of tasks the state store did not answer
	// for: one a minute, not one per task per offer (storeTrouble).
	storeDown ratelog.Limiter
	// external watches the external steps handed to outside workers
	// (external.go).
	external externalWatch

	// taken holds the tasks polls returned whose report is not done yet;
	// lost signals a poll answer that may have been lost (strays.go).
	takenMu sync.Mutex
	taken   map[string]struct{}
	lost    chan struct{}

	// pollCtx stops polling; workCtx interrupts running steps.
	pollCtx, workCtx      context.Context
	stopPolling, stopWork context.CancelFunc
	polling, working      sync.WaitGroup
	// reportCtx bounds reports to Conductor: cancelled (abortReports)
	// when the shutdown grace period is over.
	reportCtx    context.Context
	abortReports context.CancelFunc
	// pollers are the poll machinery, one per polled task type; a task's
	// outcome reported to Conductor wakes those of its plan's task types,
	// since Conductor schedules the step's successors as it takes the
	// update.
	pollers []*poller
	// wakes learns which task types each plan's steps use (wakePollers).
	wakes *planTypes

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
	if opts.PollIntervalMax == 0 {
		opts.PollIntervalMax = time.Second
	}
	opts.PollIntervalMax = max(opts.PollIntervalMax, opts.PollInterval)
	if opts.PollTimeout < 0 {
		opts.PollTimeout = 0
	}
	if opts.PollLinger == 0 {
		opts.PollLinger = 5 * time.Millisecond
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 8
	}
	if opts.PollersPerType <= 0 {
		opts.PollersPerType = 1
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
	if opts.EngineTaskCheck == 0 {
		opts.EngineTaskCheck = 5 * time.Second
	}
	if opts.ExternalCheck <= 0 {
		opts.ExternalCheck = 5 * time.Second
	}
	w := &Worker{tasks: tasks, runs: runs, events: events, secrets: secrets, executors: executors, opts: opts,
		log: opts.Logger.Named("worker"), running: opts.Running, taken: map[string]struct{}{}, lost: make(chan struct{}, 1)}
	w.unreported.durable, w.unreported.log = opts.OutputKeep, w.log
	w.reportCtx, w.abortReports = context.WithCancel(context.Background())
	var types []string
	for taskType, n := range opts.Concurrency {
		if n > 0 {
			types = append(types, taskType)
		}
	}
	w.wakes = newPlanTypes(types)
	for _, taskType := range types {
		n := opts.Concurrency[taskType]
		loops := min(opts.PollersPerType, n)
		for i := range loops {
			share := n / loops
			if i < n%loops {
				share++
			}
			w.pollers = append(w.pollers, &poller{
				tasks: tasks, taskType: taskType, workerID: opts.WorkerID, concurrency: share, batch: opts.BatchSize,
				interval: opts.PollInterval, maxInterval: opts.PollIntervalMax, timeout: opts.PollTimeout, linger: max(opts.PollLinger, 0),
				handle: w.handle, release: func(t *model.Task) { w.handBack(t, 0, "shutdown") },
				took: w.took, lost: w.pollLost,
				metrics: opts.Metrics, log: w.log.With(zap.String("taskType", taskType)), wake: make(chan struct{}, 1), freed: make(chan struct{}, 1),
			})
		}
	}
	if opts.Wakeup != nil {
		opts.Wakeup.add(w.pollers...)
	}
	if opts.StrayLook != nil {
		opts.StrayLook.add(w)
	}
	opts.Metrics.taskTypes(types)
	w.outbox = newOutbox(events, w.log, opts.Metrics)
	return w
}

// took records the tasks a poll returned: as taken (strays.go) and their
// plans' task types (wakePollers).
func (w *Worker) took(tasks []model.Task) {
	w.noteTaken(tasks)
	w.wakes.learn(tasks)
}

// Open starts Options.PollersPerType poll loops per task type of
// Options.Concurrency.
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
				engine, logical := a.Attempts(int(t.RetryCount))
				w.endTry(log, a, engine, logical, statestore.TryEndedWorkerRestarted, nil)
			}
			w.handBack(t, 0, "recovered after restart")
		}
	}
	if w.opts.Recover != nil {
		w.polling.Add(1)
		go func() {
			defer w.polling.Done()
			w.recoverStrays(w.pollCtx)
		}()
	}
	if w.opts.Tasks != nil {
		if w.opts.ExternalInFlight != nil {
			w.recoverExternal(ctx)
		}
		w.polling.Add(1)
		go func() {
			defer w.polling.Done()
			w.watchExternal(w.pollCtx)
		}()
	}
	for _, p := range w.pollers {
		w.polling.Add(1)
		go func() {
			defer w.polling.Done()
			p.run(w.pollCtx, w.workCtx, &w.working)
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
		w.log.Warn("shutdown grace period over; interrupting running steps and handing their tasks back")
		err = ctx.Err()
		w.stopWork()
		// The interrupted steps hand their tasks back, which takes a
		// report each: they get handBackWindow to reach Conductor, then
		// every report still trying is given up.
		giveUp := time.AfterFunc(handBackWindow, w.abortReports)
		<-done
		giveUp.Stop()
	}
	w.abortReports()
	w.stopWork()
	w.outbox.close()
	return err
}

// handBackWindow is how long, once the shutdown grace is over, the
// interrupted steps' hand-backs (and any report still being retried) may
// take to reach Conductor. A task whose hand-back did not reach it stays
// in progress there until this worker id starts again (which hands it
// back) or its response timeout passes.
const handBackWindow = 5 * time.Second

// Interrupt cancels the running steps of runID on this process (see
// Running.Interrupt).
func (w *Worker) Interrupt(runID string) []string { return w.running.Interrupt(runID) }

// storeTrouble logs msg, err being the state store's failure to answer or
// to take writes (an error of kind Unavailable: STORE_UNAVAILABLE, or
// STORE_WRITE_REFUSED on a full disk), as one warning a minute for every
// task (each is handed back and nothing is lost: its outcome is kept or
// its step gated again), and reports true; any other err is not logged
// here (false).
func (w *Worker) storeTrouble(log *zap.Logger, err error, msg string, fields ...zap.Field) bool {
	if !errors.Is(err, statestore.ErrUnavailable) && !errors.Is(err, errcode.Unavailable) {
		return false
	}
	w.storeDown.Warn(log, msg+": the state store does not answer or take writes", append(fields, zap.Error(err))...)
	return true
}
