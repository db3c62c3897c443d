package drain

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Conductor's workflow statuses the Follower reacts to.
const (
	EngineRunning   = "RUNNING"
	EnginePaused    = "PAUSED"
	EngineCompleted = "COMPLETED"
	// EngineTerminated is the status a cancel's terminate leaves.
	EngineTerminated = "TERMINATED"
)

// What the Follower did, as the run watcher counts it
// (sidecar_run_watcher_actions_total{action}); "" is nothing.
const (
	// FollowConverged: the log's pause state, which the sidecar's own
	// call had not brought to Conductor, applied to Conductor.
	FollowConverged = "converged"
	// FollowConductorPaused, FollowConductorResumed: a pause or resume
	// made in Conductor, recorded in the log.
	FollowConductorPaused  = "conductor_paused"
	FollowConductorResumed = "conductor_resumed"
	// FollowPauseClosed: RunResumed (requestedBy sidecar) for a pause
	// that raced Conductor's completion of the run.
	FollowPauseClosed = "pause_closed"
	// FollowCancelCompleted: a cancel requested in the log whose
	// workflow still ran in Conductor (its process died before the
	// terminate) completed: workflow terminated, RunCancelled.
	FollowCancelCompleted = "cancel_completed"
)

// FollowerEngine is the part of Conductor's workflow API the Follower
// uses: the Controller's, and a read of a workflow's status.
type FollowerEngine interface {
	Engine
	WorkflowStatus(ctx context.Context, workflowID string) (string, error)
}

// InFlight tells whether the Controller has a pause or resume of a run
// under way in this process (Calls implements it).
type InFlight interface {
	// InFlight reports whether a pause or resume of runID is under way,
	// and a generation that changes whenever one starts or ends.
	InFlight(runID string) (busy bool, gen uint64)
}

// FollowerOptions configures NewFollower. The zero value works.
type FollowerOptions struct {
	// Calls, when set, is the process's Controller's (Options.Calls): no
	// difference is put down to Conductor while a request of it on the
	// run is under way. Without it, only the engine ledger decides.
	Calls InFlight
	// Grace is how long a difference between Conductor and the log must
	// last, seen at two checks, before it is put down to an action in
	// Conductor on a run the sidecar paused before (default
	// DefaultGrace): another replica's pause or resume, which Calls does
	// not see, may have a call that lands late, and its own settle
	// brings Conductor back to the log within that time.
	Grace time.Duration
	// Alone, when set, tells whether this replica is the only live one:
	// then Calls sees every request, and a difference is decided at the
	// first check. Nil: other replicas are assumed, and the grace holds.
	Alone func() bool
	// MaxSightings is how many runs' differences are remembered for the
	// grace at most (default DefaultMaxSightings); past it, a difference
	// is decided at a later check.
	MaxSightings int
	// DrainTimeout is the drain timeout of a pause made in Conductor
	// (default 5m, as the Controller's).
	DrainTimeout time.Duration
	// Drains, when set, is the drain index: a pause made in Conductor is
	// marked there, so that the drain monitors find it.
	Drains DrainIndex
	// Interrupt, when set, interrupts the running steps of a run on this
	// process (the Controller's Options.Interrupt): used when a cancel
	// left unfinished is completed.
	Interrupt func(runID string) []string
	Logger    *zap.Logger
	Now       func() time.Time
}

// Follower is drain's reaction to what Conductor reports of a run's
// workflow: the run watcher tells it what it saw (Saw), and it keeps the
// pause in the log and in Conductor in step. Who changed a pause, and
// why, is decided here and in the Controller, nowhere else.
type Follower struct {
	snaps  SnapshotReader
	emit   Emitter
	engine FollowerEngine
	ledger EngineLedger
	opts   FollowerOptions
	logger *zap.Logger
	seen   *sightings
}

// NewFollower returns a Follower that reads the runs from snaps, appends
// through emit, calls Conductor through engine and keeps the engine ledger
// in ledger (the Controller's, so that the two agree on who moved last).
func NewFollower(snaps SnapshotReader, emit Emitter, engine FollowerEngine, ledger EngineLedger, opts FollowerOptions) *Follower {
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 5 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	if opts.MaxSightings <= 0 {
		opts.MaxSightings = DefaultMaxSightings
	}
	return &Follower{snaps: snaps, emit: emit, engine: engine, ledger: ledger, opts: opts, logger: opts.Logger.Named("drain"),
		seen: &sightings{runs: map[string]sighting{}, max: opts.MaxSightings}}
}

// Saw reacts to status, the status the watcher read of runID's workflow
// workflowID in Conductor, and returns what it did:
//
//   - RUNNING or PAUSED while the log says otherwise: the engine ledger
//     (the state the sidecar last put the workflow in) says who moved. If
//     it does not hold the log's state for the log's pause cycle, the
//     sidecar's own pause or resume has not reached Conductor: it is
//     applied to Conductor (FollowConverged). If it does, the workflow was
//     paused or resumed in Conductor: that is recorded in the log
//     (RunPaused of the next cycle, which drains and times out like any
//     other, or RunResumed; requestedBy "conductor"). Neither is done
//     while a pause or resume of the Controller's on the run was under
//     way at any moment of the check (FollowerOptions.Calls): a call of
//     it may reach Conductor after a later one, and its settle brings
//     Conductor back to the log; the check decides nothing and the next
//     one decides again. Another replica's requests are not in Calls: on
//     a run the sidecar paused before (pause cycle > 0), unless this
//     replica is alone (FollowerOptions.Alone), a move in Conductor is
//     recorded only once the same difference (log state and cycle, ledger
//     note and revision, Conductor's status) was seen by two checks at
//     least FollowerOptions.Grace apart.
//   - COMPLETED while the log says PAUSED: the pause reached the log after
//     Conductor had taken the run's last task. RunCompleted is valid from
//     RUNNING only, so the pause is closed (RunResumed, requestedBy
//     "sidecar", the reason says why) for the watcher to complete the run.
//
// RUNNING or PAUSED while the log has the run's cancel requested and not
// ended: the cancel's own terminate never reached Conductor (its process
// died in between, or Conductor did not answer it). Unless a request of
// the Controller's on the run is under way (FollowerOptions.Calls), the
// cancel is completed: the workflow terminated, the run's steps on this
// process interrupted, RunCancelled (requestedBy whoever requested the
// cancel, fenced)
// (FollowCancelCompleted).
//
// Anything else needs nothing. A run cancelled or ended in the log is left
// alone. Every record is checked against the state it was decided on.
func (f *Follower) Saw(ctx context.Context, runID, workflowID, status string) (string, error) {
	switch status {
	case EngineRunning, EnginePaused:
		return f.follow(ctx, runID, workflowID, status == EnginePaused)
	case EngineCompleted:
		f.seen.forget(runID)
		return f.closePause(ctx, runID)
	}
	f.seen.forget(runID)
	return "", nil
}

func (f *Follower) follow(ctx context.Context, runID, workflowID string, enginePaused bool) (string, error) {
	snap, err := f.snapshot(ctx, runID)
	if err != nil {
		return "", err
	}
	if snap != nil && snap.CancelRequested && !statestore.IsTerminalRunStatus(snap.Status) {
		f.seen.forget(runID)
		return f.completeCancel(ctx, runID, workflowID)
	}
	if snap == nil || !followed(snap) {
		f.seen.forget(runID)
		return "", nil
	}
	cycle, logPaused := pauseOf(snap)
	if logPaused == enginePaused {
		f.seen.forget(runID)
		if cycle == 0 && !logPaused {
			return "", nil // never paused: nothing noted, nothing to note
		}
		notedPaused, notedCycle, err := f.ledger.EngineState(ctx, runID)
		if err != nil || (notedCycle == cycle && notedPaused == enginePaused) {
			return "", err
		}
		return "", f.ledger.NoteEngine(ctx, runID, enginePaused, cycle)
	}
	// Apart. The sidecar writes the log, then Conductor, then the ledger:
	// who moved is decided on reads in the other order (the ledger, then
	// Conductor, then the log), so that no read is older than the one
	// before it and a call of the sidecar's in flight is never taken for
	// an action in Conductor. The status the watcher read only says to
	// look. A pause or resume of the Controller's under way at any moment
	// of these reads may have a call that reaches Conductor after a later
	// request's (its settle then applies the log again): what Conductor
	// shows is nobody's action yet.
	_, gen := f.inFlight(runID)
	notedPaused, notedCycle, rev, err := f.engineNote(ctx, runID)
	if err != nil {
		return "", err
	}
	status, err := f.engine.WorkflowStatus(ctx, workflowID)
	if err != nil || (status != EngineRunning && status != EnginePaused) {
		return "", err // ended: the watcher records how
	}
	enginePaused = status == EnginePaused
	if snap, err = f.snapshot(ctx, runID); snap == nil || err != nil || !followed(snap) {
		return "", err
	}
	if cycle, logPaused = pauseOf(snap); logPaused == enginePaused {
		f.seen.forget(runID)
		return "", nil // in step now: the next check notes it
	}
	if busy, now := f.inFlight(runID); busy || now != gen {
		// Whatever the ledger says: a request's own call not landed yet
		// is applied by its settle, which reads the log after it; a call
		// of ours could land after a later request's and undo it.
		f.logger.Debug("Conductor and the log differ while a pause or resume of the run is under way; decided at the next check",
			zap.String("runId", runID), zap.String("workflowId", workflowID), zap.Bool("enginePaused", enginePaused), zap.Int64("cycle", cycle))
		return "", nil
	}
	if notedCycle != cycle || notedPaused != logPaused {
		f.seen.forget(runID)
		return f.converge(ctx, runID, workflowID, logPaused, cycle)
	}
	if !f.lasted(runID, sighting{logCycle: cycle, logPaused: logPaused, noteRev: rev, notePaused: notedPaused, noteCycle: notedCycle, enginePause: enginePaused}) {
		f.logger.Debug("Conductor and the log differ; decided once the difference has lasted the grace (another replica's late call is corrected within it)",
			zap.String("runId", runID), zap.String("workflowId", workflowID), zap.Bool("enginePaused", enginePaused), zap.Int64("cycle", cycle), zap.Duration("grace", f.opts.Grace))
		return "", nil
	}
	if enginePaused {
		return f.pausedInConductor(ctx, snap, workflowID)
	}
	return f.resumedInConductor(ctx, snap, workflowID)
}

// lasted tells whether the difference s of runID may be put down to
// Conductor now. A run never paused in the log (cycle 0) has had no call
// of the sidecar's, so none can land late: decided at once; so is every
// run when this replica is alone. Otherwise only a difference that two
// checks at least the grace apart saw the same.
func (f *Follower) lasted(runID string, s sighting) bool {
	if s.logCycle == 0 || (f.opts.Alone != nil && f.opts.Alone()) {
		f.seen.forget(runID)
		return true
	}
	return f.seen.lasted(runID, s, f.opts.Now(), f.opts.Grace)
}

// engineNote is the engine ledger's note of runID, with its revision when
// the ledger tells it (RevisionLedger; 0 otherwise).
func (f *Follower) engineNote(ctx context.Context, runID string) (paused bool, cycle int64, rev uint64, err error) {
	if l, ok := f.ledger.(RevisionLedger); ok {
		return l.EngineRevision(ctx, runID)
	}
	paused, cycle, err = f.ledger.EngineState(ctx, runID)
	return paused, cycle, 0, err
}

// followed tells whether the Follower keeps snap's run in step: RUNNING or
// PAUSED, no cancel requested.
func followed(snap *statestore.RunSnapshot) bool {
	return !snap.CancelRequested && (snap.Status == statestore.RunStatusRunning || snap.Status == statestore.RunStatusPaused)
}

// pauseOf is the log's pause state of snap's run: its pause cycle (0:
// never paused) and whether it is paused.
func pauseOf(snap *statestore.RunSnapshot) (int64, bool) {
	var cycle int64
	if snap.Pause != nil {
		cycle = snap.Pause.Cycle
	}
	return cycle, snap.Status == statestore.RunStatusPaused
}

// inFlight is FollowerOptions.Calls' answer for runID (nothing under way
// without it).
func (f *Follower) inFlight(runID string) (bool, uint64) {
	if f.opts.Calls == nil {
		return false, 0
	}
	return f.opts.Calls.InFlight(runID)
}

// converge applies the log's pause state to Conductor, then reads the log
// again and applies a later state, as a request's settle does: a pause or
// resume appended meanwhile may have reached Conductor before this call.
func (f *Follower) converge(ctx context.Context, runID, workflowID string, paused bool, cycle int64) (string, error) {
	var err error
	if paused {
		err = f.engine.Pause(ctx, workflowID)
	} else if err = f.engine.Resume(ctx, workflowID); isEngineConflict(err) {
		err = nil // no longer PAUSED: what we wanted
	}
	if err != nil {
		return "", err
	}
	f.logger.Info("applied the log's pause state to Conductor (the sidecar's own call had not reached it)",
		zap.String("runId", runID), zap.String("workflowId", workflowID), zap.Bool("paused", paused), zap.Int64("cycle", cycle))
	if err := f.ledger.NoteEngine(ctx, runID, paused, cycle); err != nil {
		return FollowConverged, err
	}
	_, err = settleEngine(ctx, f.snaps, f.engine, f.logger, runID, workflowID, paused, cycle,
		func(ctx context.Context, paused bool, cycle int64, err error) error {
			if err != nil {
				return err
			}
			return f.ledger.NoteEngine(ctx, runID, paused, cycle)
		})
	return FollowConverged, err
}

// pausedInConductor records a pause made in Conductor: RunPaused with the
// next cycle, appended only while the log still says what the pause was
// decided on (RUNNING at snap's cycle); a concurrent pause through the
// sidecar wins, and this one is then seen in step.
func (f *Follower) pausedInConductor(ctx context.Context, snap *statestore.RunSnapshot, workflowID string) (string, error) {
	runID, cycle := snap.RunID, nextCycle(snap)
	payload := pausedPayload(PauseRequest{RequestedBy: statestore.RequestedByConductor, Reason: "paused in Conductor"}, int64(f.opts.DrainTimeout/time.Second))
	var still bool
	_, _, err := statestore.Fenced(ctx, f.snaps, f.emit, runID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		open, paused := pauseOf(s)
		if still = followed(s) && !paused && open+1 == cycle; !still {
			return nil, nil // decided again at the next check
		}
		return runEvent(s, payload, cycle, f.opts.Now)
	})
	if errors.Is(err, statestore.ErrRunChanged) || errors.Is(err, statestore.ErrNotFound) {
		return "", nil // decided again at the next check
	}
	if err != nil || !still {
		return "", err
	}
	f.logger.Warn("the run's workflow was paused in Conductor; recorded the pause, the run drains",
		zap.String("runId", runID), zap.String("workflowId", workflowID), zap.Int64("cycle", cycle))
	if f.opts.Drains != nil {
		if err := f.opts.Drains.MarkDraining(ctx, runID, cycle); err != nil {
			// The drain monitors' full pass finds the drain without its mark.
			f.logger.Warn("could not mark the drain in the drain index", zap.String("runId", runID), zap.Error(err))
		}
	}
	return FollowConductorPaused, f.ledger.NoteEngine(ctx, runID, true, cycle)
}

// resumedInConductor records a resume made in Conductor: RunResumed of the
// open cycle, appended only while the log still says what the resume was
// decided on (snap: PAUSED at that cycle); a run that ended or moved on
// meanwhile is decided again at the next check.
func (f *Follower) resumedInConductor(ctx context.Context, snap *statestore.RunSnapshot, workflowID string) (string, error) {
	cycle := snap.Pause.Cycle
	payload := resumedPayload(ResumeRequest{RequestedBy: statestore.RequestedByConductor, Reason: "resumed in Conductor"})
	var still bool
	_, _, err := statestore.Fenced(ctx, statestore.ReadFirst(snap, f.snaps), f.emit, snap.RunID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		open, paused := pauseOf(s)
		if still = followed(s) && paused && open == cycle; !still {
			return nil, nil // decided again at the next check
		}
		return runEvent(s, payload, cycle, f.opts.Now)
	})
	if errors.Is(err, statestore.ErrRunChanged) || errors.Is(err, statestore.ErrNotFound) {
		return "", nil // decided again at the next check
	}
	if err != nil || !still {
		return "", err
	}
	f.logger.Warn("the run's workflow was resumed in Conductor; recorded the resume",
		zap.String("runId", snap.RunID), zap.String("workflowId", workflowID), zap.Int64("cycle", cycle))
	return FollowConductorResumed, f.ledger.NoteEngine(ctx, snap.RunID, false, cycle)
}

// completeCancel completes runID's cancel, requested in the log, whose
// workflow workflowID Conductor still runs: terminate, interrupt the
// run's steps here, RunCancelled appended on the runSeq it was decided
// on. Terminating a workflow that ended meanwhile changes nothing in
// Conductor; a run the Controller (or the watcher) ended meanwhile is
// left as it is.
func (f *Follower) completeCancel(ctx context.Context, runID, workflowID string) (string, error) {
	if busy, _ := f.inFlight(runID); busy {
		return "", nil // the Controller's own cancel is under way: its terminate follows
	}
	if err := f.engine.Terminate(ctx, workflowID, "cancelled: the cancel requested in the sidecar's log"); err != nil {
		return "", err
	}
	if f.opts.Interrupt != nil {
		if n := len(f.opts.Interrupt(runID)); n > 0 {
			f.logger.Info("interrupted running steps of a cancelled run", zap.String("runId", runID), zap.Int("steps", n))
		}
	}
	var ended bool
	_, _, err := statestore.Fenced(ctx, f.snaps, f.emit, runID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		if ended = s.CancelRequested && !statestore.IsTerminalRunStatus(s.Status); !ended {
			return nil, nil
		}
		return runEvent(s, statestore.RunCancelledPayload{EngineStatus: EngineTerminated, RequestedBy: cancelledBy(s),
			Reason: "the cancel requested in the log had not reached Conductor; completed"}, 1, f.opts.Now)
	})
	if errors.Is(err, statestore.ErrRunChanged) || errors.Is(err, statestore.ErrNotFound) {
		return "", nil // decided again at the next check
	}
	if err != nil || !ended {
		return "", err
	}
	f.logger.Warn("completed a cancel requested in the log whose workflow still ran in Conductor (the cancel's terminate never reached it)",
		zap.String("runId", runID), zap.String("workflowId", workflowID))
	return FollowCancelCompleted, nil
}

// cancelledBy is who requested s's cancel, which RunCancelled records
// whoever completes it; "sidecar" for a request that names no one.
func cancelledBy(s *statestore.RunSnapshot) string {
	if s.CancelRequestedBy != "" {
		return s.CancelRequestedBy
	}
	return statestore.RequestedBySidecar
}

// closePause appends the RunResumed that closes a pause Conductor never
// applied: the log says PAUSED, but Conductor COMPLETED the workflow
// (docs/drain.md, "A pause that races the end of the run"). The other
// terminal events are valid from PAUSED and need nothing.
func (f *Follower) closePause(ctx context.Context, runID string) (string, error) {
	snap, err := f.snapshot(ctx, runID)
	if snap == nil || err != nil {
		return "", err
	}
	if snap.Status != statestore.RunStatusPaused || snap.Pause == nil || snap.CancelRequested {
		return "", nil
	}
	if _, err := record(ctx, f.emit, snap, resumedPayload(ResumeRequest{
		RequestedBy: statestore.RequestedBySidecar,
		Reason:      "Conductor had COMPLETED the workflow before the pause took effect; the pause is closed so that the run can complete",
	}), snap.Pause.Cycle, f.opts.Now); err != nil {
		return "", err
	}
	f.logger.Warn("the run completed in Conductor while paused in the log; closed the pause before RunCompleted",
		zap.String("runId", runID), zap.Int64("cycle", snap.Pause.Cycle))
	return FollowPauseClosed, nil
}

// snapshot is the run's snapshot; nil, without an error, for a run the log
// does not have.
func (f *Follower) snapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := f.snaps.ProjectSnapshot(ctx, runID)
	if errors.Is(err, statestore.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("drain: snapshot of run %s: %w", runID, err)
	}
	return snap, nil
}

// nextCycle is the pause cycle of the next RunPaused of snap's run.
func nextCycle(snap *statestore.RunSnapshot) int64 {
	if snap.Pause == nil {
		return 1
	}
	return snap.Pause.Cycle + 1
}

// pausedPayload is RunPaused's payload: the drain timeout (seconds) and
// req's reason, requestedBy, stepId and resumeAt when set.
func pausedPayload(req PauseRequest, timeoutSeconds int64) statestore.RunPausedPayload {
	p := statestore.RunPausedPayload{DrainTimeoutSeconds: &timeoutSeconds, Reason: req.Reason, RequestedBy: req.RequestedBy, StepID: req.StepID}
	if !req.ResumeAt.IsZero() {
		p.ResumeAt = req.ResumeAt.UTC().Format(time.RFC3339Nano)
	}
	return p
}

// resumedPayload is RunResumed's payload: req's reason and requestedBy
// when set.
func resumedPayload(req ResumeRequest) statestore.RunResumedPayload {
	return statestore.RunResumedPayload{Reason: req.Reason, RequestedBy: req.RequestedBy}
}

// runEvent is the run-level event with payload p (its type names the
// event's) of snap's run, for cycle (its logicalAttemptId: the pause cycle
// of the pause events, the request number of a retry), emitted at now.
func runEvent(snap *statestore.RunSnapshot, p statestore.Payload, cycle int64, now func() time.Time) (*statestore.RunEventWrite, error) {
	w, err := statestore.NewEvent(snap.Ref(), p.EventType(), "", 1, cycle, p)
	if err != nil {
		return nil, err
	}
	w.EmittedAt = now().UTC().Format(time.RFC3339Nano)
	return w, nil
}

// record appends runEvent(snap, p, cycle, now) after checking it against
// snap (Layer 1: never what the projector would flag). The append is not
// conditioned on snap's runSeq: it is for the events a later change of
// the run does not make wrong (a repeat is deduplicated by its
// idempotency key, an event the run outgrew is audit only). The events
// that must not land after a change (a pause, the end of a drain nothing
// can join) go through statestore.Fenced.
func record(ctx context.Context, emit Emitter, snap *statestore.RunSnapshot, p statestore.Payload, cycle int64, now func() time.Time) (statestore.AppendResult, error) {
	w, err := runEvent(snap, p, cycle, now)
	if err != nil {
		return statestore.AppendResult{}, err
	}
	if err := statestore.CheckTransition(snap, w); err != nil {
		return statestore.AppendResult{}, err
	}
	return emit.Emit(ctx, w)
}
