// Package drain is the per-run pause state machine: PAUSE as draining on
// Conductor (Execution Semantics Contract v1.1 §6), RESUME, CANCEL (Cancel
// wins), the drain monitor and the drain timeout. Its state lives in the
// event log, so any replica can act on a run and a restart loses nothing:
// every action is an idempotent append, and side effects (Conductor calls,
// alert counts) follow an append that persisted, or are idempotent
// themselves.
package drain

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/ratelog"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Engine is the part of Conductor's workflow API the controller uses. Pause
// of a paused workflow and terminate of a terminated one succeed.
type Engine interface {
	Pause(ctx context.Context, workflowID string) error
	Resume(ctx context.Context, workflowID string) error
	Terminate(ctx context.Context, workflowID, reason string) error
}

// EngineLedger remembers the pause state the sidecar last put a run's
// workflow in, or saw it in (Keys implements it). The Follower reads it to
// tell a pause or resume made in Conductor from one of the sidecar's that
// has not reached Conductor yet.
type EngineLedger interface {
	// NoteEngine records that runID's workflow is paused (or not) for
	// pause cycle cycle; a note of an older cycle changes nothing.
	NoteEngine(ctx context.Context, runID string, paused bool, cycle int64) error
	// EngineState returns the last note (not paused, cycle 0: none).
	EngineState(ctx context.Context, runID string) (paused bool, cycle int64, err error)
}

// DrainIndex remembers, for every replica, which runs may have an open
// drain (Keys implements it), so that the monitor
// finds a drain another replica started, or one a dead process left,
// without reading every active run.
type DrainIndex interface {
	// MarkDraining records that runID's drain of pause cycle cycle may be
	// open; it is called after that cycle's RunPaused persisted.
	MarkDraining(ctx context.Context, runID string, cycle int64) error
	// EndDraining removes runID's mark unless it names a later cycle.
	EndDraining(ctx context.Context, runID string, cycle int64) error
	// DrainingRunIDs lists the marked runs.
	DrainingRunIDs(ctx context.Context) ([]string, error)
}

// Owner tells whether this replica watches a run's drain, so that
// replicas sharing one NATS divide the runs; membership.Members satisfies
// it.
type Owner interface {
	Owns(runID string) bool
}

// everyRun is the Owner of a replica that works alone.
type everyRun struct{}

func (everyRun) Owns(string) bool { return true }

// SnapshotReader gives a run's derived state (the projector's snapshot).
type SnapshotReader interface {
	ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error)
}

// Emitter appends events through the EventIdRegistry protocol.
type Emitter interface {
	Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error)
	// EmitIf appends only if the run's last runSeq is lastSeq (else an
	// error matching statestore.ErrRunChanged, nothing written).
	EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error)
}

// Options configures a Controller.
type Options struct {
	// DefaultTimeout is the drain timeout of a pause that names none
	// (default 5m).
	DefaultTimeout time.Duration
	// Interrupt, when set, interrupts a run's running steps on this
	// process (best effort) when the run is cancelled, and returns their
	// Conductor task ids: their workers record their ends.
	Interrupt func(runID string) []string
	// Ledger, when set, is told of every pause and resume that reached
	// Conductor.
	Ledger EngineLedger
	// ActiveRuns lists the runs of the monitor's full pass.
	ActiveRuns func(ctx context.Context) ([]string, error)
	// Drains, when set, is the drain index: Pause marks its run there,
	// the monitor reads it every IndexInterval and ends a mark with its
	// drain. Without it the full pass is the only way to find a drain this
	// process did not start.
	Drains DrainIndex
	// Interval is the period of the monitor's check of the runs it knows
	// are draining (default 250ms).
	Interval time.Duration
	// IndexInterval is the period of its read of the drain index (default
	// 5s).
	IndexInterval time.Duration
	// FullScanInterval is the shortest period of its pass over every
	// active run (default 30s). The pass reads at most FullScanRate runs a
	// second, spread evenly, so with N active runs it takes
	// max(FullScanInterval, N/FullScanRate). It sets the runs-by-status
	// gauges and finds a drain missing from the index (a process died
	// between a RunPaused and its mark).
	FullScanInterval time.Duration
	// FullScanRate caps the full pass's snapshot reads a second (default
	// 100). It is the deployment's: replicas that divide the runs read
	// their shares in the period one replica would take over all of them.
	FullScanRate int
	// Schedule, when set, keeps the pauses to be resumed on their own
	// (PauseRequest.ResumeAt) and the staggered resumes (ResumeLater):
	// the monitor reads it every IndexInterval and at start, and resumes
	// the due pauses it owns; the staggered resumes it owns go to the
	// pacer, which carries them out at the stagger's rate. Without it the
	// full pass resumes the pauses.
	Schedule ResumeSchedule
	// Owner divides the runs between replicas (default: this replica
	// owns every run). The drain index and the full pass bring in the
	// owned runs only, and the gauges count them; a drain this process
	// started (a pause, a nudge) is watched here whoever owns it.
	Owner Owner
	// Calls, when set, is told of every pause, resume and cancel request under
	// way, for the process's Follower (FollowerOptions.Calls) to see
	// (default: a Calls of the Controller's own, which nobody reads).
	Calls *Calls
	// Waker, when set, is woken after every resume that reached
	// Conductor (single, bulk, scheduled, staggered): the task workers'
	// idle poll loops, since Conductor now schedules the run's next
	// steps.
	Waker Waker
	// Adopted, when set, is the adopter of existing workflows: the
	// tasks Conductor runs itself of an adopted run (its system tasks)
	// are brought into the log by a pause once Conductor's pause took
	// effect, before its drain may end, and read back after a resume.
	Adopted AdoptedRuns
	// PlanTasks, when set, records what Conductor made of a plan run's
	// tasks that the log lacks (adapter.Watcher): at every RETRY_STEP,
	// the held step's task; at a cancel, before RunCancelled, the tasks
	// Conductor ended as it terminated the workflow.
	PlanTasks PlanTasks
	Logger    *zap.Logger
	Metrics   *Metrics
	Now       func() time.Time
}

// AdoptedRuns is what the Controller needs of the adopter of existing
// workflows (adapter.Adopter). Conductor runs an adopted run's system
// tasks (HTTP, SUB_WORKFLOW, ...) itself and runs one it scheduled
// whatever the workflow's pause, so a pause's drain waits for them; the
// log has them only from the adopter's reads of the workflow.
type AdoptedRuns interface {
	// Adopts reports whether runID, whose workflow is workflowID, is an
	// adopted workflow's run.
	Adopts(runID, workflowID string) bool
	// SyncEngineTasks records what the log lacks of the run's tasks as
	// Conductor reports them now: after a pause took effect in Conductor,
	// and as a resume of a run with a step's retry requested is recorded,
	// before Conductor resumes the workflow.
	SyncEngineTasks(ctx context.Context, runID string) error
	// Resumed asks for the run to be read back from Conductor soon, on
	// this replica whether or not it follows the run: a resume of it
	// reached Conductor, which schedules its next tasks. It must not
	// block.
	Resumed(runID string)
}

// PlanTasks is what the Controller needs to learn of a plan run's tasks
// in Conductor (adapter.Watcher implements it). An operator may have
// completed a held step's task there by hand, and then no worker polls it
// again to run the retried attempt; a cancel's terminate ends tasks that
// no worker of this process reports (an outside worker's that died, one
// of another replica's worker).
type PlanTasks interface {
	// SettleRetriedStep records what the log lacks of Conductor's end of
	// step stepID's task, the step's retry being requested, and reports
	// whether it recorded anything.
	SettleRetriedStep(ctx context.Context, runID, stepID string) (bool, error)
	// SettleTasks records what the log lacks of Conductor's end of the
	// run's tasks, but those of the task ids in skip.
	SettleTasks(ctx context.Context, runID string, skip []string) error
}

// planTasksReadTimeout bounds a request's read of a run's tasks from
// Conductor (a RETRY_STEP's of the held task, a cancel's before
// RunCancelled).
const planTasksReadTimeout = 10 * time.Second

// Waker wakes the task workers' idle poll loops (taskworkers.Wakeup). Wake
// must not block.
type Waker interface {
	Wake()
}

// Controller carries out PAUSE, RESUME and CANCEL and watches drains.
type Controller struct {
	snaps  SnapshotReader
	emit   Emitter
	engine Engine
	opts   Options
	logger *zap.Logger

	nudge  chan string
	mu     sync.Mutex // guards cancel and done (Open, Close)
	cancel context.CancelFunc
	done   chan struct{}
	warns  ratelog.Limiter // the monitor's warnings while the store is down
	// engineWarns are the monitor's warnings while Conductor fails its
	// reads of adopted runs' tasks (apart from warns: a pass that read
	// the store does not end them); engineReads paces those reads.
	engineWarns ratelog.Limiter
	engineReads engineReads

	// watched holds the runs whose drain is open, as far as this process
	// knows: the monitor checks them every Interval. Pause adds its run,
	// every check adds or removes the run it read, the full pass adds the
	// drains it finds.
	wmu     sync.Mutex
	watched map[string]struct{}

	// pacer holds the staggered resumes this replica carries out.
	pacer *pacer
}

// New returns a Controller; Open starts its monitor.
func New(snaps SnapshotReader, emit Emitter, engine Engine, opts Options) *Controller {
	if opts.DefaultTimeout <= 0 {
		opts.DefaultTimeout = 5 * time.Minute
	}
	if opts.Interval <= 0 {
		opts.Interval = 250 * time.Millisecond
	}
	if opts.IndexInterval <= 0 {
		opts.IndexInterval = 5 * time.Second
	}
	if opts.FullScanInterval <= 0 {
		opts.FullScanInterval = 30 * time.Second
	}
	if opts.FullScanRate <= 0 {
		opts.FullScanRate = 100
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Owner == nil {
		opts.Owner = everyRun{}
	}
	if opts.Calls == nil {
		opts.Calls = NewCalls()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Controller{snaps: snaps, emit: emit, engine: engine, opts: opts, logger: opts.Logger.Named("drain"),
		nudge: make(chan string, 1024), watched: make(map[string]struct{}), pacer: newPacer()}
}

// PauseRequest is the body of a pause.
type PauseRequest struct {
	// TimeoutSeconds overrides the default drain timeout (0: default).
	TimeoutSeconds int64  `json:"timeoutSeconds,omitempty"`
	Reason         string `json:"reason,omitempty"`
	RequestedBy    string `json:"requestedBy,omitempty"`
	// StepID names the failed step of a pause on failure.
	StepID string `json:"stepId,omitempty"`
	// ResumeAt, when set, resumes the pause on its own at that time
	// (RunResumed with requestedBy "schedule"), unless it was resumed or
	// paused again before. It is recorded in RunPaused's payload.
	ResumeAt time.Time `json:"resumeAt,omitempty"`
}

// State is a run's pause state as the API shows it.
type State struct {
	RunID     string `json:"runId"`
	Status    string `json:"status"`
	Substatus string `json:"substatus,omitempty"`
	// Drain is present while the run is paused.
	Drain *DrainView `json:"drain,omitempty"`
	// Notice says what an accepted request did not do (a pause of a run
	// already paused records nothing and keeps its drain timeout).
	Notice string `json:"notice,omitempty"`
	// AlreadyPaused: the request was a pause of a run the log shows
	// paused already (by an earlier or a concurrent request); it recorded
	// nothing.
	AlreadyPaused bool `json:"-"`
	// Snapshot is the run's snapshot the state was read from (not
	// encoded): the API answers a control request from it rather than
	// read the run again. Treat it as read-only.
	Snapshot *statestore.RunSnapshot `json:"-"`
}

// DrainView is the drain block of a paused run.
type DrainView struct {
	Cycle           int64    `json:"cycle"`
	PausedAt        string   `json:"pausedAt"`
	Deadline        string   `json:"deadline"`
	TimeoutSeconds  int64    `json:"timeoutSeconds"`
	InFlightStepIDs []string `json:"inFlightStepIds"`
	Draining        bool     `json:"draining"`
	TimedOut        bool     `json:"timedOut"`
	EndedAt         string   `json:"endedAt,omitempty"`
}

// StateOf returns the pause state of a snapshot.
func StateOf(s *statestore.RunSnapshot, defaultTimeout time.Duration) *State {
	st := &State{RunID: s.RunID, Status: s.Status, Substatus: s.Substatus, Snapshot: s}
	if s.Status == statestore.RunStatusPaused && s.Pause != nil {
		timeout := timeoutOf(s.Pause, defaultTimeout)
		deadline := ""
		if at, err := time.Parse(time.RFC3339Nano, s.Pause.PausedAt); err == nil {
			deadline = at.Add(timeout).UTC().Format(time.RFC3339Nano)
		}
		inflight := s.InFlight()
		if inflight == nil {
			inflight = []string{}
		}
		st.Drain = &DrainView{Cycle: s.Pause.Cycle, PausedAt: s.Pause.PausedAt, Deadline: deadline,
			TimeoutSeconds: int64(timeout / time.Second), InFlightStepIDs: inflight,
			Draining: s.Substatus == statestore.SubstatusDraining, TimedOut: s.Pause.DrainTimedOut, EndedAt: s.Pause.DrainEndedAt}
	}
	return st
}

func timeoutOf(p *statestore.PauseState, def time.Duration) time.Duration {
	if p.DrainTimeoutSeconds > 0 {
		return time.Duration(p.DrainTimeoutSeconds) * time.Second
	}
	return def
}

// Pause pauses a RUNNING run: RunPaused (the next pause cycle) is appended
// first, so the workers stop starting its steps at once, then Conductor's
// workflow is paused. Pausing a paused run changes nothing and returns its
// state (and pauses Conductor's workflow again, in case that failed the
// first time). Any other status gets INVALID_TRANSITION and nothing is
// written.
func (c *Controller) Pause(ctx context.Context, runID string, req PauseRequest) (*State, error) {
	defer c.opts.Calls.begin(runID)()
	p, err := c.pauseLog(ctx, runID, req)
	if err != nil {
		return nil, err
	}
	began := c.opts.Now()
	engineErr := c.engine.Pause(ctx, p.wf)
	return c.pauseEngine(ctx, p, engineErr, c.opts.Now().Sub(began))
}

// pausing is a pause whose log part is done (pauseLog) and whose
// workflow is to be paused in Conductor (pauseEngine).
type pausing struct {
	runID, wf string
	req       PauseRequest
	snap      *statestore.RunSnapshot // the run after the log part
	// recorded is the run as the pause's RunPaused left it (nil: not
	// derived), the answer when the log cannot be read after the pause.
	recorded *statestore.RunSnapshot
	cycle    int64
	// already: the run was paused before; nothing was recorded.
	already bool
	// drained: the pause found nothing in flight and ended its drain
	// (endEmptyDrain); the monitor has nothing to check.
	drained bool
}

// pauseLog is a pause's part in the log: the fenced RunPaused, the end of
// a drain with nothing in flight, the scheduled resume and the drain's
// watch.
func (c *Controller) pauseLog(ctx context.Context, runID string, req PauseRequest) (*pausing, error) {
	if req.TimeoutSeconds < 0 {
		return nil, &statestore.Error{Code: statestore.CodeSchemaValidationFailed, Field: "timeoutSeconds", Message: "must be >= 0"}
	}
	began := c.opts.Now()
	timeout := req.TimeoutSeconds
	if timeout == 0 {
		timeout = int64(c.opts.DefaultTimeout / time.Second)
	}
	c.syncIdleSteps(ctx, runID)
	// RunPaused is appended on the runSeq it was decided on, so that a
	// StepStarted, which is appended the same way, and the pause are
	// ordered whatever the interleaving (docs/events.md, "Fences").
	var cycle int64
	var paused *statestore.RunEventWrite
	snap, res, err := statestore.Fenced(ctx, knownRuns{c.snaps}, c.emit, runID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		if cancelInProgress(s) {
			return nil, cancelWins(s, statestore.RunPaused)
		}
		if s.Status == statestore.RunStatusPaused {
			return nil, nil
		}
		cycle = nextCycle(s)
		w, err := runEvent(s, pausedPayload(req, timeout), cycle, c.opts.Now)
		paused = w
		return w, err
	})
	if err != nil {
		return nil, err
	}
	p := &pausing{runID: runID, wf: workflowOf(snap), req: req, snap: snap, cycle: cycle}
	if snap.Status == statestore.RunStatusPaused {
		p.already, p.cycle = true, snap.Pause.Cycle
		return p, nil
	}
	c.opts.Metrics.pauseRecorded(c.opts.Now().Sub(began))
	if !req.ResumeAt.IsZero() {
		c.schedule(ctx, runID, cycle, req.ResumeAt)
	}
	p.recorded = appended(snap, paused, res)
	p.drained = len(snap.InFlight()) == 0 && !c.adopted(snap) && c.endEmptyDrain(ctx, runID, cycle, p.recorded)
	if !p.drained && !c.adopted(snap) {
		c.watchDrain(ctx, runID, cycle, len(snap.InFlight()), timeout)
	}
	return p, nil
}

// watchDrain has the monitor watch runID's drain of cycle (and marks it in
// the drain index for the other replicas); inFlight < 0 is not known. An
// adopted run's is watched only once the pause's read of Conductor's
// tasks is done (syncAdopted): until then the log may not show what
// Conductor runs.
func (c *Controller) watchDrain(ctx context.Context, runID string, cycle int64, inFlight int, timeoutSeconds int64) {
	c.watch(runID, true)
	c.mark(ctx, runID, cycle)
	fields := []zap.Field{zap.String("runId", runID), zap.Int64("cycle", cycle), zap.Int64("timeoutSeconds", timeoutSeconds)}
	if inFlight >= 0 {
		fields = append(fields, zap.Int("inFlight", inFlight))
	}
	c.logger.Info("run paused; draining in-flight steps", fields...)
}

// pauseEngine is the rest of a pause once Conductor answered its pause of
// p's workflow with engineErr, after took: the ledger's note, settle, the
// answer.
func (c *Controller) pauseEngine(ctx context.Context, p *pausing, engineErr error, took time.Duration) (*State, error) {
	if p.already {
		snap := p.snap
		_, engineErr := c.settle(ctx, p.runID, p.wf, true, p.cycle, c.applied(ctx, p.runID, true, p.cycle, engineErr))
		st, err := c.withEngine(snap, engineErr)
		st.Notice = fmt.Sprintf("the run was already paused (cycle %d); nothing was recorded", snap.Pause.Cycle)
		st.AlreadyPaused = true
		if have := int64(timeoutOf(snap.Pause, c.opts.DefaultTimeout) / time.Second); p.req.TimeoutSeconds != 0 && p.req.TimeoutSeconds != have {
			st.Notice += fmt.Sprintf(", and its drain timeout stays %ds: this request's %ds is not applied (resume, then pause again, to change it)", have, p.req.TimeoutSeconds)
		}
		if !p.req.ResumeAt.IsZero() {
			st.Notice += ", and this request's scheduled resume is not applied (resume, then pause again, to schedule one)"
		}
		return st, err
	}
	engineErr = c.applied(ctx, p.runID, true, p.cycle, engineErr)
	c.opts.Metrics.enginePause(took)
	if !p.drained && c.adopted(p.snap) {
		if p.drained = c.syncAdopted(ctx, p.runID, p.cycle); !p.drained {
			timeout := p.req.TimeoutSeconds
			if timeout == 0 {
				timeout = int64(c.opts.DefaultTimeout / time.Second)
			}
			c.watchDrain(ctx, p.runID, p.cycle, -1, timeout)
		}
	}
	after, engineErr := c.settle(ctx, p.runID, p.wf, true, p.cycle, engineErr)
	if !p.drained {
		c.Nudge(p.runID)
	}
	return c.answer(ctx, p.runID, after, p.recorded, engineErr)
}

// adopted reports whether snap's run is an adopted workflow's.
func (c *Controller) adopted(snap *statestore.RunSnapshot) bool {
	return c.opts.Adopted != nil && c.opts.Adopted.Adopts(snap.RunID, workflowOf(snap))
}

// idleStep reports whether a step of snap is idle (RunStepTryEnded).
func idleStep(snap *statestore.RunSnapshot) bool {
	for i := range snap.Steps {
		if snap.Steps[i].Status == statestore.StepStatusRunning && snap.Steps[i].Idle {
			return true
		}
	}
	return false
}

// syncIdleSteps has a running adopted run with an idle step read from
// Conductor before its pause is recorded. A step idle while its
// sub-workflow was paused is in flight again (RunStepTryStarted, valid
// only while the run runs) once the sub-workflow runs; the adopter's
// reads see that within an interval, and a pause in between would find
// the step idle, too late to mark it in flight, and end its drain while
// the sub-workflow runs. A failed read leaves the pause as it was.
func (c *Controller) syncIdleSteps(ctx context.Context, runID string) {
	if c.opts.Adopted == nil {
		return
	}
	s, err := knownRuns{c.snaps}.ProjectSnapshot(ctx, runID)
	if err != nil || s.Status != statestore.RunStatusRunning || !c.adopted(s) || !idleStep(s) {
		return
	}
	if err := c.opts.Adopted.SyncEngineTasks(ctx, runID); err != nil {
		c.logger.Warn("could not read an adopted run with an idle step before its pause", zap.String("runId", runID), zap.Error(err))
	}
}

// syncAdopted brings into the log the tasks Conductor runs itself of
// runID, an adopted run whose pause (cycle) reached Conductor, and ends
// the drain when none is in flight; it reports whether the drain ended.
// Once Conductor's pause took effect Conductor schedules nothing new, so
// what this read finds is all the drain waits for: the tasks recorded
// here (StepStarted after RunPaused, docs/events.md, "Fences") were
// scheduled before the pause. Without the read (Conductor did not answer)
// the monitor takes the drain, and reads them before it ends it.
func (c *Controller) syncAdopted(ctx context.Context, runID string, cycle int64) bool {
	if err := c.opts.Adopted.SyncEngineTasks(ctx, runID); err != nil {
		c.logger.Warn("could not read an adopted run's tasks from Conductor after its pause; the monitor takes its drain",
			zap.String("runId", runID), zap.Error(err))
		return false
	}
	return c.endEmptyDrain(ctx, runID, cycle, nil)
}

// endEmptyDrain ends the drain of a pause that found no step in flight:
// RunDrainCompleted on the runSeq of RunPaused, so that nothing can slip
// in between (no step starts after RunPaused: docs/events.md, "Fences").
// It reports whether the drain is over; when it is not (the run moved on,
// the store did not answer) the monitor takes the drain as usual. Doing it
// here rather than in the monitor keeps a burst of pauses from queueing
// behind the monitor's one goroutine. after, when not nil, is the run as
// RunPaused left it (appended): the fence decides on it without reading
// the run, and reads only when the run moved on since.
func (c *Controller) endEmptyDrain(ctx context.Context, runID string, cycle int64, after *statestore.RunSnapshot) bool {
	var waited time.Duration
	var runs statestore.FenceReader = knownRuns{c.snaps}
	if after != nil {
		runs = &primed{snap: after, runs: runs}
	}
	snap, res, err := statestore.Fenced(ctx, runs, c.emit, runID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		if s.Status != statestore.RunStatusPaused || s.Pause == nil || s.Pause.Cycle != cycle || len(s.InFlight()) > 0 || s.Pause.DrainEndedAt != "" {
			return nil, nil
		}
		waited = c.waited(s)
		return runEvent(s, statestore.RunDrainCompletedPayload{WaitedSeconds: seconds(waited)}, cycle, c.opts.Now)
	})
	if err != nil || snap.Status != statestore.RunStatusPaused || snap.Pause == nil || snap.Pause.Cycle != cycle || len(snap.InFlight()) > 0 {
		return false
	}
	if res.Persisted {
		c.opts.Metrics.drainEnded("drained", waited)
		c.logger.Info("run paused; no step in flight, drain completed", zap.String("runId", runID), zap.Int64("cycle", cycle))
	}
	return true
}

// appended is snap with the event w that was appended on it (res), as the
// projector will show it, or nil when that is not known: w was not
// persisted by this append (a duplicate carries another append's
// metadata), or the reducer would not apply it cleanly.
func appended(snap *statestore.RunSnapshot, w *statestore.RunEventWrite, res statestore.AppendResult) *statestore.RunSnapshot {
	if w == nil || !res.Persisted || res.RunSeq <= snap.LastEventSeq {
		return nil
	}
	rec := statestore.RunEventRecord{RunEventWrite: *w, RunSeq: res.RunSeq, PersistedAt: res.PersistedAt}
	rec.EventID = res.EventID
	next, alerts := statestore.Reduce(snap, []statestore.RunEventRecord{rec})
	if len(alerts) > 0 || next.LastEventSeq != res.RunSeq {
		return nil
	}
	return next
}

// primed is a FenceReader whose first read is snap, a state the caller
// derived itself (appended); every later read, after the fence found the
// run moved on, is the run's as runs reads it.
type primed struct {
	snap *statestore.RunSnapshot
	runs statestore.FenceReader
}

func (p *primed) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	if s := p.snap; s != nil {
		p.snap = nil
		return s, nil
	}
	return p.runs.ProjectSnapshot(ctx, runID)
}

// ResumeRequest is who resumes a run, and why; both go into RunResumed's
// payload.
type ResumeRequest struct {
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requestedBy,omitempty"`
}

// Resume resumes a PAUSED run (draining or not): RunResumed closes the
// cycle, then Conductor resumes (a workflow Conductor does not have paused
// is left as it is); completed steps never run again. Resuming
// a resumed run changes nothing in the log and resumes Conductor's
// workflow again (so a retry converges when the first resume did not reach
// Conductor). A run never paused gets INVALID_TRANSITION, and so does a
// run with a failed step held for RETRY_STEP.
func (c *Controller) Resume(ctx context.Context, runID string, req ResumeRequest) (*State, error) {
	defer c.opts.Calls.begin(runID)()
	r, err := c.resumeLog(ctx, runID, req)
	if err != nil {
		return nil, err
	}
	c.settleRetriedAdopted(ctx, r)
	return c.resumeEngine(ctx, r, c.engine.Resume(ctx, r.wf))
}

// settleRetriedAdopted records, for r, an adopted run whose held step's
// retry is requested, what Conductor made of that step's task, while
// Conductor's workflow is still paused and the log already has the run
// running (RunResumed): a task completed by hand in Conductor is the
// retried attempt (AdoptedRuns.SyncEngineTasks records it, never inside
// the pause), and Conductor schedules the step that follows it as soon as
// it resumes the workflow, whose worker may poll it before any read made
// after the resume. A read that fails is logged: the adopter's reads
// record it after the resume, possibly after that next step's start.
func (c *Controller) settleRetriedAdopted(ctx context.Context, r *resuming) {
	if c.opts.Adopted == nil || !c.adopted(r.snap) || !retryPending(r.snap) {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, planTasksReadTimeout)
	defer cancel()
	if err := c.opts.Adopted.SyncEngineTasks(rctx, r.runID); err != nil {
		c.logger.Warn("could not read the retried step's task of an adopted run before resuming it in Conductor; it is recorded after the resume",
			zap.String("runId", r.runID), zap.Error(err))
	}
}

// retryPending reports whether a step of snap has its retry requested
// and not started.
func retryPending(snap *statestore.RunSnapshot) bool {
	for i := range snap.Steps {
		if snap.Steps[i].RetryRequested && snap.Steps[i].Status == statestore.StepStatusPending {
			return true
		}
	}
	return false
}

// resuming is a resume whose log part is done (resumeLog) and whose
// workflow is to be resumed in Conductor (resumeEngine).
type resuming struct {
	runID, wf string
	snap      *statestore.RunSnapshot // the run before RunResumed
	// recorded is the run as the RunResumed left it (nil: not derived).
	recorded *statestore.RunSnapshot
	// again: the run was resumed before (RunResumed is in the log);
	// Conductor's workflow is resumed again.
	again bool
}

// resumeLog is a resume's part in the log: RunResumed, decided on the
// run's state and appended only while that state is the run's
// (statestore.Fenced): a run that ended or changed meanwhile is decided
// again.
func (c *Controller) resumeLog(ctx context.Context, runID string, req ResumeRequest) (*resuming, error) {
	var r *resuming
	var resumed *statestore.RunEventWrite
	_, res, err := statestore.Fenced(ctx, knownRuns{c.snaps}, c.emit, runID, func(snap *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		r, resumed = &resuming{runID: runID, wf: workflowOf(snap), snap: snap}, nil
		if cancelInProgress(snap) {
			return nil, cancelWins(snap, statestore.RunResumed)
		}
		if snap.Status == statestore.RunStatusRunning && snap.Pause != nil && snap.Pause.ResumedAt != "" && !snap.CancelRequested {
			// A repeated resume (the first one may have been recorded
			// without reaching Conductor): resume Conductor's workflow
			// again.
			r.again = true
			return nil, nil
		}
		if snap.Status != statestore.RunStatusPaused || snap.Pause == nil {
			return nil, c.invalid(snap, statestore.RunResumed)
		}
		if held := snap.HeldSteps(); len(held) > 0 {
			// Resuming would leave a failed step with nothing to run it:
			// the operator retries it (or cancels the run) first.
			return nil, &statestore.Error{Code: statestore.CodeInvalidTransition,
				Message: fmt.Sprintf("step %s failed and is held (onStepFailure: pause): retry it first, or cancel the run", strings.Join(held, ", ")),
				Meta:    map[string]string{"actualState": snap.Status, "attemptedEventType": statestore.RunResumed, "heldSteps": strings.Join(held, ",")}}
		}
		w, err := runEvent(snap, resumedPayload(req), snap.Pause.Cycle, c.opts.Now)
		resumed = w
		return w, err
	})
	if err != nil {
		return nil, err
	}
	if r.again {
		return r, nil
	}
	r.recorded = appended(r.snap, resumed, res)
	if r.snap.Substatus == statestore.SubstatusDraining {
		c.opts.Metrics.drainEnded("resumed", c.waited(r.snap))
	}
	c.logger.Info("run resumed", zap.String("runId", runID), zap.Int64("cycle", r.snap.Pause.Cycle))
	return r, nil
}

// resumeEngine is the rest of a resume once Conductor answered its resume
// of r's workflow with err: the ledger's note, settle, the answer.
func (c *Controller) resumeEngine(ctx context.Context, r *resuming, err error) (*State, error) {
	// Conductor refusing because the workflow is not paused is success
	// here too: its pause may never have reached it (a held failure paused
	// the run while Conductor restarted), and it runs, as the log now says.
	// If it has ended, the run watcher records how.
	if isEngineConflict(err) {
		if !r.again {
			c.logger.Info("Conductor's workflow was not paused; the resume is recorded and the workflow runs", zap.String("runId", r.runID), zap.Error(err))
		}
		err = nil
	}
	after, engineErr := c.settle(ctx, r.runID, r.wf, false, r.snap.Pause.Cycle, c.applied(ctx, r.runID, false, r.snap.Pause.Cycle, err))
	if engineErr == nil && c.opts.Waker != nil {
		c.opts.Waker.Wake()
	}
	if engineErr == nil && c.adopted(r.snap) {
		// Conductor schedules the run's next tasks as it resumes it: its
		// system tasks are in the log only from the adopter's reads.
		c.opts.Adopted.Resumed(r.runID)
	}
	if r.again {
		return c.withEngine(r.snap, engineErr)
	}
	return c.answer(ctx, r.runID, after, r.recorded, engineErr)
}

// Cancel cancels a run that is not terminal: RunCancelRequested (from then
// on Cancel wins), Conductor's workflow terminated, the run's running steps
// interrupted on this process (best effort), RunCancelled. Cancelling a
// cancelled run returns its state.
func (c *Controller) Cancel(ctx context.Context, runID, reason, requestedBy string) (*State, error) {
	defer c.opts.Calls.begin(runID)() // the Follower leaves the terminate to this cancel
	cl, st, err := c.cancelLog(ctx, runID, reason, requestedBy)
	if cl == nil {
		return st, err
	}
	return c.cancelEngine(ctx, cl, c.engine.Terminate(ctx, cl.wf, "cancelled: "+reason))
}

// cancelling is a cancel whose request is recorded (cancelLog) and whose
// workflow is to be terminated in Conductor (cancelEngine).
type cancelling struct {
	runID, wf string
	cancelled statestore.RunCancelledPayload
	// after is the run as the cancel's RunCancelRequested left it
	// (appended), nil when this cancel did not append it.
	after *statestore.RunSnapshot
}

// cancelLog is a cancel's first part in the log: RunCancelRequested,
// decided on the run's state and appended only while that state is the
// run's (statestore.Fenced): a run that ended meanwhile is decided again.
// A run it ends here (cancelled already, or queued), or an error, returns
// no cancelling, and the state or the error as Cancel returns them.
func (c *Controller) cancelLog(ctx context.Context, runID, reason, requestedBy string) (*cancelling, *State, error) {
	// RunCancelRequested is appended on the runSeq it was decided on, so
	// that the run as it left it is known without reading it again
	// (cancelEngine's fence decides on it).
	var requested *statestore.RunEventWrite
	snap, res, err := statestore.Fenced(ctx, knownRuns{c.snaps}, c.emit, runID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		requested = nil
		if s.Status == statestore.RunStatusCancelled || s.CancelRequested {
			return nil, nil // cancelled, or its cancel recorded: nothing to add
		}
		if statestore.IsTerminalRunStatus(s.Status) {
			return nil, c.invalid(s, statestore.RunCancelRequested)
		}
		w, err := runEvent(s, statestore.RunCancelRequestedPayload{Reason: reason, RequestedBy: requestedBy}, 1, c.opts.Now)
		requested = w
		return w, err
	})
	if err != nil {
		return nil, nil, err
	}
	if snap.Status == statestore.RunStatusCancelled {
		st := StateOf(snap, c.opts.DefaultTimeout)
		st.Notice = "the run was already cancelled; nothing was recorded (this request's reason is not kept)"
		return nil, st, nil
	}
	cancelled := statestore.RunCancelledPayload{Reason: reason, RequestedBy: requestedBy}
	if snap.Status == statestore.RunStatusQueued {
		// Waiting for admission: no workflow exists yet. The run ends
		// here, and the admission decider drops it (package admission).
		st, err := c.cancelQueued(ctx, runID, cancelled)
		return nil, st, err
	}
	return &cancelling{runID: runID, wf: workflowOf(snap), cancelled: cancelled, after: appended(snap, requested, res)}, nil, nil
}

// cancelEngine is the rest of a cancel once Conductor answered the
// termination of cl's workflow with err: the run's steps interrupted,
// RunCancelled.
func (c *Controller) cancelEngine(ctx context.Context, cl *cancelling, err error) (*State, error) {
	if err != nil {
		// The request is recorded; a retry of the cancel terminates, and
		// so does the pause follower if none comes.
		snap := cl.after
		if snap == nil {
			if snap, _ = c.snapshot(ctx, cl.runID); snap == nil {
				return nil, err
			}
		}
		return c.withEngine(snap, err)
	}
	runID := cl.runID
	var interrupted []string
	if c.opts.Interrupt != nil {
		if interrupted = c.opts.Interrupt(runID); len(interrupted) > 0 {
			c.logger.Info("interrupted running steps of a cancelled run", zap.String("runId", runID), zap.Int("steps", len(interrupted)))
		}
	}
	// Conductor ended the run's tasks as it terminated the workflow: an
	// adopted run's system tasks and outside workers' tasks, a plan run's
	// outside workers' steps and steps of other replicas' workers. No read
	// follows a run once it ended, so they are read and recorded before
	// RunCancelled, as the watcher does before a run's end, so that the
	// ended run keeps no step in flight. A read that fails leaves them.
	var settle func(context.Context, string) error
	switch {
	case c.opts.Adopted != nil && c.opts.Adopted.Adopts(runID, cl.wf):
		settle = c.opts.Adopted.SyncEngineTasks
	case c.opts.PlanTasks != nil:
		// The steps interrupted here record their own ends, with
		// what they wrote (their artifacts).
		settle = func(ctx context.Context, runID string) error {
			return c.opts.PlanTasks.SettleTasks(ctx, runID, interrupted)
		}
	}
	if settle != nil {
		sctx, cancel := context.WithTimeout(ctx, planTasksReadTimeout)
		if err := settle(sctx, runID); err != nil {
			c.logger.Warn("could not read the cancelled run's tasks from Conductor; steps it ended may stay in flight in the log",
				zap.String("runId", runID), zap.Error(err))
		}
		cancel()
	}
	// RunCancelled is decided on the run as RunCancelRequested left it
	// and appended on that runSeq; whatever landed since (the run
	// watcher's RunCancelled, a step's event) makes the fence read the
	// run and decide again.
	var runs statestore.FenceReader = knownRuns{c.snaps}
	if cl.after != nil {
		runs = &primed{snap: cl.after, runs: runs}
	}
	var ended *statestore.RunEventWrite
	snap, res, err := statestore.Fenced(ctx, runs, c.emit, runID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		ended = nil
		if s.Status == statestore.RunStatusCancelled {
			return nil, nil
		}
		w, err := runEvent(s, recordedCancel(s, cl.cancelled), 1, c.opts.Now)
		ended = w
		return w, err
	})
	if err != nil {
		return nil, err
	}
	if snap.Status == statestore.RunStatusCancelled {
		// The run watcher saw the workflow terminated, with the cancel
		// requested, and recorded RunCancelled first.
		return StateOf(snap, c.opts.DefaultTimeout), nil
	}
	if snap.Substatus == statestore.SubstatusDraining {
		c.opts.Metrics.drainEnded("cancelled", c.waited(snap))
	}
	c.logger.Info("run cancelled", zap.String("runId", runID))
	if after := appended(snap, ended, res); after != nil {
		return StateOf(after, c.opts.DefaultTimeout), nil
	}
	if snap, err = c.snapshot(ctx, runID); err != nil {
		return nil, err
	}
	return StateOf(snap, c.opts.DefaultTimeout), nil
}

// recordedCancel is the RunCancelled that ends s's cancel: the requester
// and reason of its RunCancelRequested, which may be another request's
// (two cancels raced and the other was recorded first); mine's when the
// log names no one.
func recordedCancel(s *statestore.RunSnapshot, mine statestore.RunCancelledPayload) statestore.RunCancelledPayload {
	if s.CancelRequested && s.CancelRequestedBy != "" {
		mine.RequestedBy, mine.Reason = s.CancelRequestedBy, s.CancelReason
	}
	return mine
}

// cancelQueued appends RunCancelled to a run cancelled while QUEUED.
func (c *Controller) cancelQueued(ctx context.Context, runID string, cancelled statestore.RunCancelledPayload) (*State, error) {
	snap, err := c.snapshot(ctx, runID)
	if err != nil {
		return nil, err
	}
	if snap.Status != statestore.RunStatusCancelled {
		if _, err := c.record(ctx, snap, cancelled, 1); err != nil {
			return nil, err
		}
		if snap, err = c.snapshot(ctx, runID); err != nil {
			return nil, err
		}
	}
	c.logger.Info("queued run cancelled", zap.String("runId", runID))
	return StateOf(snap, c.opts.DefaultTimeout), nil
}

// RetryRequest is the body of a RETRY_STEP.
type RetryRequest struct {
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requestedBy,omitempty"`
}

// maxRetryRaces bounds how often RetryStep renumbers its request after
// another replica's retry of another step took the same number.
const maxRetryRaces = 8

// RetryStep reruns a step held after a failure (onStepFailure: pause) as
// its next logical attempt: it appends RunStepRetryRequested, and the
// step runs when the run is resumed. The run must be PAUSED and the step's
// latest attempt failed and held; anything else gets INVALID_TRANSITION
// (e.g. a run that failed under onStepFailure: fail) and writes nothing.
// Retrying a step whose retry is already requested returns the state,
// while the run may still run it (not ended, no cancel requested).
// The step's task is held by the workers, not failed: the request does
// not depend on Conductor. Once it is recorded, the held task is read
// back (Options.PlanTasks): a task completed in Conductor by hand makes
// the retried attempt the one Conductor completed. A read that fails is
// logged, and a repeated RETRY_STEP reads again; the run watcher records
// the same at the run's end.
func (c *Controller) RetryStep(ctx context.Context, runID, stepID string, req RetryRequest) (*State, error) {
	for range maxRetryRaces {
		var next int64
		snap, _, err := statestore.Fenced(ctx, knownRuns{c.snaps}, c.emit, runID, func(snap *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
			next = 0
			st := snap.Step(stepID)
			if st == nil {
				return nil, ErrStepNotFound
			}
			if st.RetryRequested && st.Status == statestore.StepStatusPending && !statestore.IsTerminalRunStatus(snap.Status) && !snap.CancelRequested {
				return nil, nil // requested already, and still to run
			}
			if snap.Status != statestore.RunStatusPaused || snap.CancelRequested {
				return nil, c.invalid(snap, statestore.RunStepRetryRequested)
			}
			if st.Status != statestore.StepStatusFailed || !st.Held {
				why := "it has not failed"
				if st.Status == statestore.StepStatusFailed {
					why = "its failure is final (the plan's onStepFailure is fail)"
				}
				return nil, &statestore.Error{Code: statestore.CodeInvalidTransition,
					Message: fmt.Sprintf("step %s cannot be retried: %s (status %s, logical attempt %d)", stepID, why, st.Status, st.LogicalAttemptID),
					Meta:    map[string]string{"actualState": st.Status, "attemptedEventType": statestore.RunStepRetryRequested}}
			}
			next = st.LogicalAttemptID + 1
			payload := statestore.RunStepRetryRequestedPayload{Reason: req.Reason, RequestedBy: req.RequestedBy, StepID: stepID, StepLogicalAttemptID: next}
			return runEvent(snap, payload, snap.StepRetries+1, c.opts.Now)
		})
		if err != nil {
			return nil, err
		}
		if next == 0 { // requested already: read the held task again
			return StateOf(c.settleHeld(ctx, snap, stepID), c.opts.DefaultTimeout), nil
		}
		// The request number is per run: a concurrent retry of another step
		// may have taken it, and then ours was deduplicated into theirs.
		// Look, and renumber if so.
		if snap, err = c.snapshot(ctx, runID); err != nil {
			return nil, err
		}
		if st := snap.Step(stepID); st != nil && st.LogicalAttemptID >= next {
			c.logger.Info("step retry requested; it runs when the run is resumed", zap.String("runId", runID),
				zap.String("stepId", stepID), zap.Int64("logicalAttemptId", next))
			return StateOf(c.settleHeld(ctx, snap, stepID), c.opts.DefaultTimeout), nil
		}
	}
	return nil, fmt.Errorf("retry of step %s: lost %d races with concurrent retries; try again", stepID, maxRetryRaces)
}

// settleHeld reads back the task of snap's retried step stepID
// (Options.PlanTasks) and returns the run as it is then: snap when
// nothing was recorded or the read failed.
func (c *Controller) settleHeld(ctx context.Context, snap *statestore.RunSnapshot, stepID string) *statestore.RunSnapshot {
	if c.opts.PlanTasks == nil {
		return snap
	}
	rctx, cancel := context.WithTimeout(ctx, planTasksReadTimeout)
	recorded, err := c.opts.PlanTasks.SettleRetriedStep(rctx, snap.RunID, stepID)
	cancel()
	if err != nil {
		c.logger.Warn("could not read the retried step's held task from Conductor; if it was ended there by hand, the run watcher records it at the run's end",
			zap.String("runId", snap.RunID), zap.String("stepId", stepID), zap.Error(err))
		return snap
	}
	if !recorded {
		return snap
	}
	c.logger.Info("the retried step's held task was completed in Conductor: its retried attempt is recorded as Conductor completed it",
		zap.String("runId", snap.RunID), zap.String("stepId", stepID))
	if now, err := c.snapshot(ctx, snap.RunID); err == nil {
		return now
	}
	return snap
}

// applied tells the ledger that a pause (or resume) of cycle reached
// Conductor, when engineErr is nil, and returns engineErr. A ledger that
// cannot be written is logged: the watcher then re-applies the log's state
// to Conductor, which is idempotent.
func (c *Controller) applied(ctx context.Context, runID string, paused bool, cycle int64, engineErr error) error {
	if engineErr != nil || c.opts.Ledger == nil {
		return engineErr
	}
	if err := c.opts.Ledger.NoteEngine(ctx, runID, paused, cycle); err != nil {
		c.logger.Warn("could not note Conductor's pause state in the run index", zap.String("runId", runID), zap.Error(err))
	}
	return nil
}

// settleRounds bounds how often one request applies a later pause state
// to Conductor after its own call (settle).
const settleRounds = 4

// settle keeps Conductor at the log's pause state after a request set it
// to paused (or not) at cycle (settleEngine), noting each call that
// reached Conductor in the ledger (applied).
func (c *Controller) settle(ctx context.Context, runID, workflowID string, paused bool, cycle int64, engineErr error) (*statestore.RunSnapshot, error) {
	if engineErr != nil {
		return nil, engineErr
	}
	return settleEngine(ctx, c.snaps, c.engine, c.logger, runID, workflowID, paused, cycle,
		func(ctx context.Context, paused bool, cycle int64, err error) error {
			return c.applied(ctx, runID, paused, cycle, err)
		})
}

// settleEngine keeps Conductor at the log's pause state after a call set
// runID's workflow to paused (or not) at cycle: concurrent pause and
// resume requests append in one order and may reach Conductor in the
// other. After the call it reads the log again and, when the log has
// moved on, applies the log's state and notes it (note gets each call's
// state and error, and returns the error to go on with), at most
// settleRounds times; such a read sees every event appended before it,
// so the last call to reach Conductor leaves it as the log says. Meanwhile
// Conductor may show a state the log has left: the Follower puts nothing
// down to Conductor while a request of the Controller's is under way
// (Calls). It returns the last snapshot it read when Conductor was left
// at it (the run's state as the request leaves it; nil otherwise: the
// caller reads it, and the run watcher converges what is left).
func settleEngine(ctx context.Context, snaps SnapshotReader, engine Engine, logger *zap.Logger, runID, workflowID string,
	paused bool, cycle int64, note func(ctx context.Context, paused bool, cycle int64, err error) error) (*statestore.RunSnapshot, error) {
	for range settleRounds {
		snap, err := knownRuns{snaps}.ProjectSnapshot(ctx, runID)
		if err != nil {
			return nil, nil // the watcher converges what is left
		}
		if snap.CancelRequested || statestore.IsTerminalRunStatus(snap.Status) || snap.Pause == nil {
			return snap, nil // the watcher converges what is left
		}
		want := snap.Status == statestore.RunStatusPaused
		if want == paused && snap.Pause.Cycle == cycle {
			return snap, nil
		}
		if want {
			err = engine.Pause(ctx, workflowID)
		} else if err = engine.Resume(ctx, workflowID); isEngineConflict(err) {
			err = nil
		}
		if err := note(ctx, want, snap.Pause.Cycle, err); err != nil {
			return nil, err
		}
		logger.Info("a concurrent request changed the run's pause state; applied the log's state to Conductor",
			zap.String("runId", runID), zap.Bool("paused", want), zap.Int64("cycle", snap.Pause.Cycle))
		paused, cycle = want, snap.Pause.Cycle
	}
	return nil, nil // the watcher converges what is left
}

// EngineError is returned with the run's state when the log was updated
// but Conductor could not be told; retrying the same request converges.
type EngineError struct {
	State *State
	Err   error
}

func (e *EngineError) Error() string {
	return "recorded, but Conductor was not updated: " + e.Err.Error()
}
func (e *EngineError) Unwrap() error { return e.Err }

func (c *Controller) withEngine(snap *statestore.RunSnapshot, engineErr error) (*State, error) {
	st := StateOf(snap, c.opts.DefaultTimeout)
	if engineErr != nil {
		return st, &EngineError{State: st, Err: engineErr}
	}
	return st, nil
}

// answerReadTimeout bounds answer's read of a run whose state the
// request's own event gives.
const answerReadTimeout = 2 * time.Second

// answer is the state a request that reached Conductor returns: from
// snap, the state settle left the run in, or read now when settle read
// none; when that read fails too, from recorded, the state the request's
// own event left the run in, with a notice (nil: the read's error).
func (c *Controller) answer(ctx context.Context, runID string, snap, recorded *statestore.RunSnapshot, engineErr error) (*State, error) {
	if snap == nil {
		rctx := ctx
		if recorded != nil {
			// The answer is known; a read that does not come at once
			// (the store that settle could not read either) is not
			// waited for long.
			var cancel context.CancelFunc
			rctx, cancel = context.WithTimeout(ctx, answerReadTimeout)
			defer cancel()
		}
		var err error
		if snap, err = c.snapshot(rctx, runID); err != nil {
			if recorded == nil {
				return nil, err
			}
			// The request's event is in the log: answer what it did,
			// not STORE_UNAVAILABLE as if it had not happened.
			st, engineErr := c.withEngine(recorded, engineErr)
			st.Notice = "recorded; the run's state could not be read after it (" + err.Error() + "): this is the state the request left it in"
			return st, engineErr
		}
	}
	return c.withEngine(snap, engineErr)
}

// workflowOf is the Conductor workflow of a run: the workflowId of the
// engineRunRef its RunStarted recorded ("" before it started).
func workflowOf(snap *statestore.RunSnapshot) string {
	return statestore.ConductorWorkflowID(snap.EngineRunRef)
}

func (c *Controller) snapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	return knownRuns{c.snaps}.ProjectSnapshot(ctx, runID)
}

// knownRuns reads the runs the controller acts on, for itself and for
// statestore.Fenced: a run the log does not have is ErrRunNotFound.
type knownRuns struct{ snaps SnapshotReader }

func (r knownRuns) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := r.snaps.ProjectSnapshot(ctx, runID)
	if errors.Is(err, statestore.ErrNotFound) {
		return nil, ErrRunNotFound
	}
	return snap, err
}

// invalid is the INVALID_TRANSITION answer for an action the run's state
// does not allow; nothing is written.
func (c *Controller) invalid(snap *statestore.RunSnapshot, eventType string) error {
	w, err := statestore.NewEvent(snap.Ref(), eventType, "", 1, 1, nil)
	if err != nil {
		return err
	}
	if err := statestore.CheckTransition(snap, w); err != nil {
		return err
	}
	return &statestore.Error{Code: statestore.CodeInvalidTransition, Message: fmt.Sprintf("%s is not allowed: the run is %s", eventType, snap.Status),
		Meta: map[string]string{"actualState": snap.Status, "attemptedEventType": eventType}}
}

// cancelInProgress tells whether snap's run has its cancel requested and has not
// ended: its cancel is in progress.
func cancelInProgress(snap *statestore.RunSnapshot) bool {
	return snap.CancelRequested && !statestore.IsTerminalRunStatus(snap.Status)
}

// cancelWins is the INVALID_TRANSITION answer for a pause or resume
// (eventType) of a run whose cancel is in progress: Cancel wins, and a
// pause or resume sent to a workflow being terminated could undo the
// terminate. Nothing is written.
func cancelWins(snap *statestore.RunSnapshot, eventType string) error {
	return &statestore.Error{Code: statestore.CodeInvalidTransition,
		Message: fmt.Sprintf("%s is not allowed: the run's cancel is in progress (requested, not yet ended); it ends CANCELLED", eventType),
		Meta:    map[string]string{"actualState": snap.Status, "attemptedEventType": eventType, "cancelRequested": "true"}}
}

// record appends the run-level event with payload p for cycle, checked
// against snap (record).
func (c *Controller) record(ctx context.Context, snap *statestore.RunSnapshot, p statestore.Payload, cycle int64) (statestore.AppendResult, error) {
	return record(ctx, c.emit, snap, p, cycle, c.opts.Now)
}

func (c *Controller) waited(snap *statestore.RunSnapshot) time.Duration {
	if snap.Pause == nil {
		return 0
	}
	at, err := time.Parse(time.RFC3339Nano, snap.Pause.PausedAt)
	if err != nil {
		return 0
	}
	return c.opts.Now().Sub(at)
}

// isEngineConflict reports whether Conductor refused a call because the
// workflow is not in the state the call expects (a Conflict).
func isEngineConflict(err error) bool { return errors.Is(err, errcode.Conflict) }

// seconds is d in seconds, for a payload's optional waitedSeconds.
func seconds(d time.Duration) *float64 {
	v := d.Seconds()
	return &v
}
