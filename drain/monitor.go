package drain

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Open starts the drain monitor. It checks the drains of the drain index
// (without one, every active run) at once, so that a deadline that passed
// while no sidecar was running is raised at start.
// A second Open fails (ErrAlreadyOpen).
func (c *Controller) Open(ctx context.Context) error {
	if c.opts.ActiveRuns == nil {
		return errors.New("drain: Options.ActiveRuns is required for the monitor")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		return ErrAlreadyOpen
	}
	ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	c.done = done
	if c.opts.Drains != nil {
		_ = c.readIndex(ctx) && c.checkWatched(ctx)
	} else {
		c.scan(ctx)
	}
	// A resume that fell due while no sidecar ran is carried out now (a
	// staggered one by the pacer, at the stagger's rate).
	c.readSchedule(ctx)
	paced, indexed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(paced)
		if c.opts.Schedule != nil {
			c.pace(ctx)
		}
	}()
	go func() {
		defer close(indexed)
		c.indexLoop(ctx)
	}()
	go func() {
		defer close(done)
		c.loop(ctx)
		<-paced
		<-indexed
	}()
	return nil
}

// ErrAlreadyOpen is returned by a second Open of a Controller.
var ErrAlreadyOpen = errors.New("drain: controller already open")

// Close stops the monitor and waits for it.
func (c *Controller) Close(ctx context.Context) error {
	c.mu.Lock()
	cancel, done := c.cancel, c.done
	c.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// MaxScanBackoff caps the wait between the monitor's scans while the store
// does not answer.
const MaxScanBackoff = 10 * time.Second

// Nudge asks the monitor to look at runID now (a step of it finished).
func (c *Controller) Nudge(runID string) {
	select {
	case c.nudge <- runID:
	default: // the next scan sees it
	}
}

// loop checks the watched runs every Interval and takes the next share of
// its full pass over the active runs; while checks fail (the store or the
// run index does not answer) it waits twice as long each time, up to
// MaxScanBackoff. A full pass that cannot list the runs does not hold the
// checks of the watched ones back.
func (c *Controller) loop(ctx context.Context) {
	wait := c.opts.Interval
	t := time.NewTimer(wait)
	defer t.Stop()
	var pass fullPass
	if c.opts.Drains == nil {
		pass.due = time.Now().Add(c.opts.FullScanInterval) // Open made one
	}
	for {
		select {
		case <-ctx.Done():
			return
		case runID := <-c.nudge:
			c.Check(ctx, runID)
		case <-t.C:
			passed := c.passStep(ctx, &pass)
			if c.checkWatched(ctx) && passed {
				wait = c.opts.Interval
			} else {
				wait = min(2*wait, MaxScanBackoff)
			}
			t.Reset(wait)
		}
	}
}

// indexLoop reads the drain index and the scheduled resumes every
// IndexInterval, apart from loop: a listing that hangs (a bucket whose
// NATS leader just died, until ListTimeout) holds up neither the checks
// of the watched runs nor the full pass. While a read fails it waits twice
// as long each time, up to MaxScanBackoff.
func (c *Controller) indexLoop(ctx context.Context) {
	if c.opts.Drains == nil && c.opts.Schedule == nil {
		return
	}
	wait := c.opts.IndexInterval
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if (c.opts.Drains == nil || c.readIndex(ctx)) && c.readSchedule(ctx) {
			wait = c.opts.IndexInterval
		} else {
			wait = min(2*wait, max(MaxScanBackoff, c.opts.IndexInterval))
		}
		t.Reset(wait)
	}
}

// watch adds runID to the watched runs (on) or removes it, and reports
// whether that changed anything.
func (c *Controller) watch(runID string, on bool) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, was := c.watched[runID]
	if on {
		c.watched[runID] = struct{}{}
	} else {
		delete(c.watched, runID)
	}
	return was != on
}

// Watched is the number of runs the monitor checks every Interval.
func (c *Controller) Watched() int {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return len(c.watched)
}

// mark records runID's open drain of cycle in the drain index. A mark
// that cannot be written is logged: this process watches the drain anyway,
// and the full pass finds it for the others.
func (c *Controller) mark(ctx context.Context, runID string, cycle int64) {
	if c.opts.Drains == nil {
		return
	}
	if err := c.opts.Drains.MarkDraining(ctx, runID, cycle); err != nil && ctx.Err() == nil {
		c.warns.Warn(c.logger, "cannot mark a drain in the drain index; other replicas find it with their full pass", zap.String("runId", runID), zap.Error(err))
	}
}

// unwatch stops watching runID, whose drain of cycle ended (or that has
// none), and removes its mark from the drain index if it was watched.
func (c *Controller) unwatch(ctx context.Context, runID string, cycle int64) {
	c.engineReads.forget(runID)
	if !c.watch(runID, false) || c.opts.Drains == nil {
		return
	}
	if err := c.opts.Drains.EndDraining(ctx, runID, cycle); err != nil && ctx.Err() == nil {
		c.warns.Warn(c.logger, "cannot end a drain's mark in the drain index; it is read again", zap.String("runId", runID), zap.Error(err))
	}
}

// readIndex watches every run of the drain index that this replica owns;
// it reports false when the index did not answer.
func (c *Controller) readIndex(ctx context.Context) bool {
	ids, err := c.opts.Drains.DrainingRunIDs(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.warns.Warn(c.logger, "cannot read the drain index; drains of other replicas are found by the full pass until it works", zap.Error(err))
		}
		return false
	}
	for _, id := range ids {
		if c.opts.Owner.Owns(id) {
			c.watch(id, true)
		}
	}
	return true
}

// checkWatched checks every watched run (its cost is one snapshot read per
// open drain, whatever the number of active runs) and sets the drain
// gauges from the runs this replica owns (so that their sum over replicas
// counts each drain once). It reports false when the store did not answer.
func (c *Controller) checkWatched(ctx context.Context) bool {
	c.wmu.Lock()
	ids := make([]string, 0, len(c.watched))
	for id := range c.watched {
		ids = append(ids, id)
	}
	c.wmu.Unlock()
	draining, inFlight := 0, 0
	for _, id := range ids {
		snap, err := c.check(ctx, id)
		if err != nil {
			return false
		}
		if snap != nil && snap.Substatus == statestore.SubstatusDraining && c.opts.Owner.Owns(id) {
			draining++
			inFlight += len(snap.InFlight())
		}
	}
	c.opts.Metrics.drainGauges(draining, inFlight)
	if len(ids) > 0 {
		// A pass that read nothing says nothing of the store.
		c.warns.Recovered(c.logger, "the drain monitor reads the store again")
	}
	return true
}

// fullPass is the monitor's pass over every active run, spread over its
// period: perTick runs a tick, the runs-by-status gauges set at its end.
type fullPass struct {
	ids     []string
	next    int
	perTick int
	counts  *runCounts // nil between passes
	due     time.Time  // when the next pass starts
}

// passStep starts a full pass when one is due and checks its next share
// of runs. It reports false when the run index or the store did not
// answer (the pass goes on from the same run at the next tick).
func (c *Controller) passStep(ctx context.Context, p *fullPass) bool {
	if p.counts == nil {
		if time.Now().Before(p.due) {
			return true
		}
		ids, total, err := c.ownedRuns(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.warns.Warn(c.logger, "cannot list active runs; the full pass waits until it works", zap.Error(err))
			}
			return false
		}
		// FullScanRate is the deployment's: the replicas' passes take as
		// long as one replica's would over every run, each reading its
		// share.
		period := max(c.opts.FullScanInterval, time.Duration(total)*time.Second/time.Duration(c.opts.FullScanRate))
		ticks := max(1, int(period/c.opts.Interval))
		*p = fullPass{ids: ids, perTick: (len(ids) + ticks - 1) / ticks, counts: newRunCounts(), due: time.Now().Add(period)}
	}
	for end := min(p.next+p.perTick, len(p.ids)); p.next < end; p.next++ {
		snap, err := c.check(ctx, p.ids[p.next])
		if err != nil {
			return false
		}
		p.counts.add(snap)
	}
	if p.next == len(p.ids) {
		c.opts.Metrics.statusGauges(p.counts)
		*p = fullPass{due: p.due}
	}
	return true
}

// ownedRuns lists the active runs this replica owns, and counts all.
func (c *Controller) ownedRuns(ctx context.Context) (ids []string, total int, err error) {
	all, err := c.opts.ActiveRuns(ctx)
	if err != nil {
		return nil, 0, err
	}
	ids = make([]string, 0, len(all))
	for _, id := range all {
		if c.opts.Owner.Owns(id) {
			ids = append(ids, id)
		}
	}
	return ids, len(all), nil
}

// runCounts is what a pass counts for the gauges: the runs by status
// (CANCELLING for a cancel under way), and the paused ones by where the
// pause came from (pauseOrigins).
type runCounts struct {
	byStatus map[string]int
	pausedBy map[string]int
}

func newRunCounts() *runCounts {
	return &runCounts{byStatus: map[string]int{}, pausedBy: map[string]int{}}
}

// add counts snap's run; terminal runs and missing ones are not counted.
func (n *runCounts) add(snap *statestore.RunSnapshot) {
	if snap == nil {
		return
	}
	status := snap.Status
	if snap.CancelRequested && !statestore.IsTerminalRunStatus(status) {
		status = "CANCELLING"
	}
	if statestore.IsTerminalRunStatus(status) {
		return
	}
	n.byStatus[status]++
	if status == statestore.RunStatusPaused && snap.Pause != nil {
		n.pausedBy[pauseOrigin(snap.Pause)]++
	}
}

// Where a pause came from, for sidecar_runs_paused: a bounded label, unlike
// the free-text reason.
const (
	originOperator   = "operator"    // the API (or the CLI)
	originStepFailed = "step_failed" // a held failure (onStepFailure: pause)
	originConductor  = "conductor"   // paused in Conductor's UI or API
)

var pauseOrigins = []string{originOperator, originStepFailed, originConductor}

func pauseOrigin(p *statestore.PauseState) string {
	switch {
	case p.StepID != "":
		return originStepFailed
	case p.RequestedBy == statestore.RequestedByConductor:
		return originConductor
	default:
		return originOperator
	}
}

// Scan passes over every active run this replica owns: it ends the drains that are due,
// watches those still open, and sets the runs-by-status gauges.
func (c *Controller) Scan(ctx context.Context) { c.scan(ctx) }

// scan is Scan; it reports false when the run index or the store did not
// answer, and then stops at the first run it could not read.
func (c *Controller) scan(ctx context.Context) bool {
	ids, _, err := c.ownedRuns(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.warns.Warn(c.logger, "cannot list active runs; drains are not watched until it works", zap.Error(err))
		}
		return false
	}
	counts := newRunCounts()
	for _, id := range ids {
		snap, err := c.check(ctx, id)
		if err != nil {
			return false
		}
		counts.add(snap)
	}
	c.opts.Metrics.statusGauges(counts)
	if len(ids) > 0 {
		c.warns.Recovered(c.logger, "the drain monitor reads the store again")
	}
	return true
}

// Check ends the drain of runID if it is due: RunDrainCompleted once no
// step is in flight, RunDrainTimedOut (PAUSE_DRAIN_TIMEOUT) once the
// deadline has passed with steps still running. It returns the snapshot it
// saw, or nil.
func (c *Controller) Check(ctx context.Context, runID string) *statestore.RunSnapshot {
	snap, _ := c.check(ctx, runID)
	return snap
}

// check is Check; its error is set when the store did not answer.
func (c *Controller) check(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := c.snaps.ProjectSnapshot(ctx, runID)
	if errors.Is(err, statestore.ErrNotFound) {
		c.unwatch(ctx, runID, math.MaxInt64)
		return nil, nil
	}
	if err != nil {
		if ctx.Err() == nil {
			c.warns.Warn(c.logger, "cannot read a run's state", zap.String("runId", runID), zap.Error(err))
		}
		return nil, err
	}
	if c.resumeIfDue(ctx, snap) {
		// A scheduled resume that fell due (found by a pass or a check
		// rather than the schedule: its entry was not written).
		return c.snapshot(ctx, runID)
	}
	if snap.Status != statestore.RunStatusPaused || snap.Pause == nil || snap.Pause.DrainEndedAt != "" {
		var cycle int64
		if snap.Pause != nil {
			cycle = snap.Pause.Cycle
		}
		c.unwatch(ctx, runID, cycle)
		return snap, nil
	}
	if c.watch(runID, true) {
		c.mark(ctx, runID, snap.Pause.Cycle) // found by a pass or a nudge: tell the other replicas
	}
	if len(snap.InFlight()) > 0 && c.waited(snap) < timeoutOf(snap.Pause, c.opts.DefaultTimeout) {
		return snap, nil // still draining
	}
	if len(snap.InFlight()) == 0 && c.adopted(snap) {
		// Conductor runs an adopted run's system tasks whatever the
		// pause: the log shows them only once they were read. A read
		// that fails leaves the drain open until a later check, after a
		// backoff.
		if !c.engineReads.due(runID, time.Now()) {
			return snap, nil
		}
		sctx, cancel := context.WithTimeout(ctx, adoptedReadTimeout)
		err := c.opts.Adopted.SyncEngineTasks(sctx, runID)
		cancel()
		c.engineReads.done(runID, err, time.Now())
		if err != nil {
			c.engineWarns.Warn(c.logger, "could not read an adopted run's tasks from Conductor; its drain stays open until a read works",
				zap.String("runId", runID), zap.Error(err))
			return snap, nil
		}
		c.engineWarns.Recovered(c.logger, "the drain monitor reads adopted runs' tasks from Conductor again")
	}
	return c.endDrain(ctx, snap), nil
}

// engineReadsMax bounds how many runs' backoffs engineReads keeps; past
// it, it starts over (every run's next read is due).
const engineReadsMax = 10_000

// engineReads paces the monitor's reads of adopted runs' tasks from
// Conductor: after a failed read of a run, its next one waits a backoff
// (1 s, doubling to 30 s, jittered), so that a Conductor that is down, or
// has lost the workflow, is not read at every tick for every draining
// run. A read that works forgets the run's backoff. The zero value is
// ready; it is safe for concurrent use.
type engineReads struct {
	mu      sync.Mutex
	backoff map[string]*engineBackoff
}

type engineBackoff struct {
	b    *backoff.ExponentialBackOff
	next time.Time
}

// due reports whether runID's next read may be made at now.
func (e *engineReads) due(runID string, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.backoff[runID]
	return b == nil || !now.Before(b.next)
}

// done notes the outcome of a read of runID made at now.
func (e *engineReads) done(runID string, err error, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err == nil {
		delete(e.backoff, runID)
		return
	}
	if e.backoff == nil || len(e.backoff) >= engineReadsMax {
		e.backoff = map[string]*engineBackoff{}
	}
	b := e.backoff[runID]
	if b == nil {
		b = &engineBackoff{b: &backoff.ExponentialBackOff{InitialInterval: time.Second, RandomizationFactor: 0.2, Multiplier: 2, MaxInterval: 30 * time.Second}}
		b.b.Reset()
		e.backoff[runID] = b
	}
	b.next = now.Add(b.b.NextBackOff())
}

// forget drops runID's backoff (its drain is no longer watched).
func (e *engineReads) forget(runID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.backoff, runID)
}

// adoptedReadTimeout bounds the monitor's read of an adopted run's tasks
// before it ends the run's drain: the monitor's one goroutine checks every
// watched run.
const adoptedReadTimeout = 2 * time.Second

// endDrain appends the end of the drain of snap's pause cycle, decided on
// snap: RunDrainCompleted when no step is in flight, RunDrainTimedOut when
// the deadline passed with steps still running. Both are valid from PAUSED
// only, so the append is fenced (statestore.Fenced): a resume or a step's
// end that lands between the read and the append makes it decide again on
// the run's new state. It returns the state of the last decision; when the
// store did not answer, snap, and the drain stays watched.
func (c *Controller) endDrain(ctx context.Context, snap *statestore.RunSnapshot) *statestore.RunSnapshot {
	runID := snap.RunID
	var (
		ended    string // "drained", "timed_out", or "" (nothing to end)
		waited   time.Duration
		inflight []string
	)
	now, res, err := statestore.Fenced(ctx, statestore.ReadFirst(snap, knownRuns{c.snaps}), c.emit, runID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		ended = ""
		if s.Status != statestore.RunStatusPaused || s.Pause == nil || s.Pause.DrainEndedAt != "" {
			return nil, nil // resumed, ended or drained meanwhile: the next check unwatches it
		}
		inflight, waited = s.InFlight(), c.waited(s)
		switch {
		case len(inflight) == 0:
			ended = "drained"
			return runEvent(s, statestore.RunDrainCompletedPayload{WaitedSeconds: seconds(waited)}, s.Pause.Cycle, c.opts.Now)
		case waited >= timeoutOf(s.Pause, c.opts.DefaultTimeout):
			ended = "timed_out"
			return runEvent(s, statestore.RunDrainTimedOutPayload{
				Code: statestore.PauseDrainTimeoutCode, InFlightStepIDs: inflight, WaitedSeconds: seconds(waited),
			}, s.Pause.Cycle, c.opts.Now)
		}
		return nil, nil // a step is still in flight and the deadline is ahead
	})
	if err != nil {
		c.warns.Warn(c.logger, "could not record the end of a drain; retrying", zap.String("runId", runID), zap.Error(err))
		return snap
	}
	if ended == "" {
		return now
	}
	c.unwatch(ctx, runID, now.Pause.Cycle)
	if !res.Persisted {
		return now
	}
	switch ended {
	case "drained":
		c.opts.Metrics.drainEnded("drained", waited)
		c.logger.Info("drain completed: no step in flight", zap.String("runId", runID), zap.Int64("cycle", now.Pause.Cycle), zap.Duration("waited", waited))
	case "timed_out":
		// Counted by the replica whose append persisted: one alert between replicas.
		c.opts.Metrics.drainEnded("timed_out", waited)
		c.opts.Metrics.timeout()
		c.logger.Warn("PAUSE_DRAIN_TIMEOUT: drain deadline passed with steps still in flight (started, no outcome recorded); the run is PAUSED, and each ends in the log when its worker reports, or, if its worker died, when it restarts or Conductor's response timeout passes",
			zap.String("code", statestore.PauseDrainTimeoutCode), zap.String("runId", runID), zap.Int64("cycle", now.Pause.Cycle),
			zap.Strings("inFlightStepIds", inflight), zap.Duration("waited", waited))
	}
	return now
}
