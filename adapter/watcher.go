package adapter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// engineStatusLost is the Run.EngineStatus of a run whose workflow vanished.
const engineStatusLost = "LOST"

// SnapshotReader gives a run's derived state; statestore.Store satisfies it.
type SnapshotReader interface {
	ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error)
}

// PauseFollower keeps a run's pause in the log and in Conductor in step
// with what the watcher saw of its workflow; *drain.Follower satisfies it.
// Saw gets Conductor's workflow status (RUNNING, PAUSED, COMPLETED, ...)
// and returns what it did, for sidecar_run_watcher_actions_total{action}
// ("" nothing).
type PauseFollower interface {
	Saw(ctx context.Context, runID, workflowID, status string) (action string, err error)
}

// RunSettler brings a run's steps into the log before its end.
type RunSettler interface {
	Settle(ctx context.Context, rec *Run) error
	// Resumed asks for the run to be read back from Conductor soon (a
	// resume made in Conductor, which schedules the run's next tasks).
	Resumed(runID string)
}

// Owner tells whether this replica does a run's background work, so that
// replicas sharing one NATS divide the runs instead of each scanning every
// one; membership.Members satisfies it. Owns must be cheap: it is asked
// for every run at every scan.
type Owner interface {
	Owns(key string) bool
}

// everyRun is the Owner of a replica that works alone.
type everyRun struct{}

func (everyRun) Owns(string) bool { return true }

// WatcherOptions configures NewWatcher. Zero values take the defaults noted.
type WatcherOptions struct {
	// Owner divides the runs between replicas (default: this replica
	// owns every run). The scans, the reads in turn and the orphan
	// decisions cover the owned runs only (orphans by workflow id); a
	// nudge is answered whoever owns the run.
	Owner Owner
	// Interval between scans of the active runs (default 2s). Each scan
	// reads every active run's workflow status from Conductor once.
	Interval time.Duration
	// ReconcileInterval between orphan passes (default 30s). Before the
	// run cache is ready, each of them also reads every active run's
	// workflow.
	ReconcileInterval time.Duration
	// FullReadRate is how many active runs' workflows per second the scan
	// reads itself, in turn, besides those the running lists say ended
	// (default 20): the safety net for a stale running list, and how a
	// pause or resume made in Conductor is seen. Every run is read once
	// per N/FullReadRate seconds (50 s at 1,000 runs), at a steady rate.
	// Replicas that divide the runs divide the rate in proportion to their
	// shares: FullReadRate is the deployment's, not each replica's.
	FullReadRate int
	// MaxBackoff caps the pause after failed scans (default 30s).
	MaxBackoff time.Duration
	// StuckAfter is how long after a nudge a workflow still RUNNING is
	// read again, with its tasks, to see whether Conductor forgot to
	// decide it (default 10s).
	StuckAfter time.Duration
	// WaitingAfter is how long a worker task of a RUNNING workflow may
	// wait, SCHEDULED and handed to no worker, before a full read counts
	// its run as waiting (sidecar_run_watcher_waiting_runs; default 10m).
	WaitingAfter time.Duration
	// Pauses is told what the watcher saw of a workflow that runs, is
	// paused or completed, and keeps the run's pause in step (a pause or
	// resume made in Conductor, one of the sidecar's that did not reach
	// it, a pause raced by the run's completion). Nil: pauses are left
	// alone, and a run completed in Conductor while paused in the log
	// ends without a terminal event (terminal_refused).
	Pauses PauseFollower
	// Adopted, when set, records what the log lacks of an adopted run's
	// tasks before the watcher appends its terminal event, so that the
	// run's last steps come before its end (*Adopter satisfies it).
	Adopted RunSettler
	// StartAdopted, when set, is called after the watcher adopted the
	// workflow of a crashed start: the dead process may have taken a task
	// of it that Conductor shows in progress under its worker id, which
	// could not be listed while the run had no workflow
	// (taskworkers.StrayLook.Ask).
	StartAdopted func()
	// RecheckInterval is the least time between two reads of one run's
	// workflow asked for by Recheck (default 2s): a task the gate holds
	// back because the log says its run is paused costs at most one read
	// of Conductor per run per interval, however often it is polled.
	RecheckInterval time.Duration
	// RecheckTimeout bounds one such read and what it records (default
	// 10s).
	RecheckTimeout time.Duration
	// LostAfter is how many consecutive 404s for a started run's workflow
	// make the run fail with WORKFLOW_NOT_FOUND (default 3).
	LostAfter int
	// Logger (default zap.NewNop()).
	Logger *zap.Logger
	// Metrics (nil: none).
	Metrics *Metrics
}

// Watcher follows the runs of the run index until their workflows end,
// and appends the terminal run event for each:
//
//	COMPLETED                        -> RunCompleted
//	FAILED                           -> RunFailed  (error.code WORKFLOW_FAILED, message reasonForIncompletion)
//	TIMED_OUT                        -> RunFailed  (WORKFLOW_TIMED_OUT)
//	TERMINATED, cancel requested     -> RunCancelled
//	TERMINATED, parent's cancel      -> RunCancelled (an adopted sub-workflow's)
//	TERMINATED, no cancel requested  -> RunFailed  (WORKFLOW_TERMINATED)
//	workflow gone (LostAfter x 404)  -> RunFailed  (WORKFLOW_NOT_FOUND)
//
// then marks the run FINAL in the registry. It also appends a RunStarted that
// a crash left out, adopts the workflow of a start whose lease expired, and
// terminates orphan workflows (docs/conductor.md). Several replicas may run a
// Watcher on the same registry: appends are idempotent and registry writes
// are compare-and-set. Open starts its goroutine; Close stops it.
type Watcher struct {
	// runs is the run index the watcher follows; conductor and emitter
	// are the index's own Conductor client and event emitter.
	runs      *Runs
	conductor *Client
	emitter   Emitter
	snaps     SnapshotReader
	opts      WatcherOptions
	log       *zap.Logger

	nudgeCh chan struct{}

	mu       sync.Mutex
	nudged   map[string]struct{}
	known    map[string]string // workflowId -> runId of started runs
	notFound map[string]int    // runId -> consecutive 404s
	suspects map[string]*suspect
	waiting  map[string]waitingRun // runId -> the task it waits on (waiting.go)
	// rechecks are the runs Recheck asked to read (to do), rechecked when
	// it last did for each (pruned past RecheckInterval).
	rechecks  map[string]struct{}
	rechecked map[string]time.Time

	// cache mirrors the run index (nil until Open); cursor is the last run
	// the rotating full read reached (guarded by mu: Scan may run beside
	// the loop's scan).
	cache  *runCache
	cursor string

	// stepCounts are the plan versions' step counts (settlePlan).
	stepCounts planStepCounts

	lifeMu sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewWatcher returns a Watcher of the runs in runs' registry that reads
// snapshots from snaps (for cancelRequested).
func NewWatcher(runs *Runs, snaps SnapshotReader, opts WatcherOptions) *Watcher {
	if opts.Interval <= 0 {
		opts.Interval = 2 * time.Second
	}
	if opts.ReconcileInterval <= 0 {
		opts.ReconcileInterval = 30 * time.Second
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.LostAfter <= 0 {
		opts.LostAfter = 3
	}
	if opts.FullReadRate <= 0 {
		opts.FullReadRate = 20
	}
	if opts.StuckAfter <= 0 {
		opts.StuckAfter = 10 * time.Second
	}
	if opts.WaitingAfter <= 0 {
		opts.WaitingAfter = 10 * time.Minute
	}
	if opts.RecheckInterval <= 0 {
		opts.RecheckInterval = 2 * time.Second
	}
	if opts.RecheckTimeout <= 0 {
		opts.RecheckTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Owner == nil {
		opts.Owner = everyRun{}
	}
	if opts.Metrics == nil {
		opts.Metrics = runs.metrics
	}
	return &Watcher{
		runs: runs, conductor: runs.conductor, emitter: runs.emitter, snaps: snaps, opts: opts, log: opts.Logger.Named("watcher"),
		nudgeCh:  make(chan struct{}, 1),
		nudged:   make(map[string]struct{}),
		known:    make(map[string]string),
		notFound: make(map[string]int),
		suspects: make(map[string]*suspect),
		waiting:  make(map[string]waitingRun),
		rechecks: make(map[string]struct{}), rechecked: make(map[string]time.Time),
	}
}

// Open starts the watcher's goroutine. It returns an error if the watcher
// is already open. ctx only carries values; cancelling it does not stop the
// watcher (Close does).
func (w *Watcher) Open(ctx context.Context) error {
	w.lifeMu.Lock()
	defer w.lifeMu.Unlock()
	if w.cancel != nil {
		return errors.New("adapter: watcher already open")
	}
	cache, err := w.runs.watchRuns(ctx, w.log)
	if err != nil {
		// Scans read the index directly until a later Open.
		w.log.Warn("cannot watch the run index; scans read it run by run", zap.Error(err))
	}
	w.mu.Lock() // NudgeWorkflow reads it from other goroutines
	w.cache = cache
	w.mu.Unlock()
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	w.cancel, w.done = cancel, done
	go func() {
		defer close(done)
		defer cache.close()
		w.loop(ctx)
	}()
	return nil
}

// Close stops the goroutine and waits for it, at most until ctx ends (then
// it returns ctx's error; the goroutine still stops soon after). Close of a
// watcher that is not open returns nil.
func (w *Watcher) Close(ctx context.Context) error {
	w.lifeMu.Lock()
	cancel, done := w.cancel, w.done
	w.cancel, w.done = nil, nil
	w.lifeMu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("adapter: close watcher: %w", ctx.Err())
	}
}

// Nudge asks for a prompt check of runID (a worker that just finished a task
// of the run may call it, so that the run's end is recorded without waiting
// for the next scan). It never blocks.
func (w *Watcher) Nudge(runID string) {
	w.mu.Lock()
	w.nudged[runID] = struct{}{}
	w.mu.Unlock()
	select {
	case w.nudgeCh <- struct{}{}:
	default:
	}
}

// maxRechecked bounds the runs Recheck remembers; past it, those older
// than RecheckInterval are forgotten.
const maxRechecked = 4096

// Recheck asks for a read of runID's workflow in Conductor soon, at most
// once per run per RecheckInterval: the gate calls it for a task it holds
// back because the log says the run is paused. A resume made in Conductor
// (its UI or API, not the sidecar) is then recorded (RunResumed,
// requestedBy conductor, by the pause follower, fenced) without waiting
// for the run's next scan, and the task passes at its next poll. A run
// paused through the sidecar is PAUSED in Conductor too: the read
// records nothing. It never blocks; the read is the open watcher's.
func (w *Watcher) Recheck(runID string) {
	now := time.Now()
	w.mu.Lock()
	if last, ok := w.rechecked[runID]; ok && now.Sub(last) < w.opts.RecheckInterval {
		w.mu.Unlock()
		return
	}
	if len(w.rechecked) >= maxRechecked {
		for id, last := range w.rechecked {
			if now.Sub(last) >= w.opts.RecheckInterval {
				delete(w.rechecked, id)
			}
		}
		if len(w.rechecked) >= maxRechecked {
			w.mu.Unlock()
			return // as many runs held back within one interval: the scans follow them
		}
	}
	w.rechecked[runID] = now
	w.rechecks[runID] = struct{}{}
	w.mu.Unlock()
	select {
	case w.nudgeCh <- struct{}{}:
	default:
	}
}

// takeRechecks returns the runs Recheck asked to read, not nudged too.
func (w *Watcher) takeRechecks() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, 0, len(w.rechecks))
	for id := range w.rechecks {
		if _, nudged := w.nudged[id]; !nudged {
			ids = append(ids, id)
		}
	}
	clear(w.rechecks)
	return ids
}

// recheck reads runID's workflow for Recheck, within RecheckTimeout.
func (w *Watcher) recheck(ctx context.Context, runID string) {
	ctx, cancel := context.WithTimeout(ctx, w.opts.RecheckTimeout)
	defer cancel()
	if _, err := w.checkStatus(ctx, runID); err != nil && ctx.Err() == nil {
		w.log.Debug("could not read a held-back run's workflow; its next scan does", zap.String("runId", runID), zap.Error(err))
	}
}

// checkNudged reads the runs Recheck and Nudge asked for. A nudged run
// whose workflow is still RUNNING becomes a suspect: checkSuspects looks
// at it again StuckAfter later.
func (w *Watcher) checkNudged(ctx context.Context) error {
	for _, id := range w.takeRechecks() {
		w.recheck(ctx, id)
	}
	var errs []error
	for _, id := range w.takeNudged() {
		status, err := w.checkStatus(ctx, id)
		if status == model.RunningWorkflow {
			w.suspectRun(id)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (w *Watcher) takeNudged() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, 0, len(w.nudged))
	for id := range w.nudged {
		ids = append(ids, id)
	}
	clear(w.nudged)
	return ids
}

func (w *Watcher) loop(ctx context.Context) {
	ticker := time.NewTicker(w.opts.Interval)
	defer ticker.Stop()
	var (
		failures      int
		nextScan      time.Time
		lastReconcile time.Time
		lastLog       time.Time
		suppressed    int
	)
	report := func(err error) {
		if err == nil || ctx.Err() != nil {
			return
		}
		failures++
		nextScan = time.Now().Add(min(w.opts.Interval<<min(failures, 16), w.opts.MaxBackoff))
		if time.Since(lastLog) < time.Minute {
			suppressed++
			return
		}
		w.log.Warn("run watcher check failed; backing off", zap.Error(err),
			zap.Int("consecutiveFailures", failures), zap.Int("suppressedLogs", suppressed))
		lastLog, suppressed = time.Now(), 0
	}
	recovered := func() {
		if failures > 0 {
			w.log.Info("run watcher recovered", zap.Int("failedScans", failures))
		}
		failures, nextScan = 0, time.Time{}
	}
	tick := func() {
		if time.Now().Before(nextScan) {
			return
		}
		if err := w.checkSuspects(ctx); err != nil {
			report(err)
			return
		}
		// Every ReconcileInterval, until the run cache is ready, the scan
		// reads each run's workflow itself, in case a running list is
		// stale; with the cache, the rotating full read does that at a
		// steady rate.
		full := time.Since(lastReconcile) >= w.opts.ReconcileInterval
		var err error
		if full && !w.cache.ready() {
			err = w.scan(ctx, false)
		} else {
			err = w.Scan(ctx)
		}
		if full {
			err = errors.Join(err, w.Reconcile(ctx))
			lastReconcile = time.Now()
		}
		if err != nil {
			report(err)
		} else {
			recovered()
		}
	}
	if w.cache != nil {
		// The first scan reads the runs from the cache: wait for it a
		// little, rather than read every run from the index and Conductor.
		select {
		case <-w.cache.synced:
		case <-time.After(10 * time.Second):
		case <-ctx.Done():
			return
		}
	}
	tick() // at once: runs that ended while no watcher ran are recorded now
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.nudgeCh:
			report(w.checkNudged(ctx))
		case <-ticker.C:
			tick()
		}
	}
}

// OpenRunIDs lists the runs that are not FINAL: from the run cache once it
// is ready (no request to NATS), from the run index's active keys before.
// The drain monitor's full pass lists its runs with it.
func (w *Watcher) OpenRunIDs(ctx context.Context) ([]string, error) {
	w.lifeMu.Lock()
	cache := w.cache
	w.lifeMu.Unlock()
	if !cache.ready() {
		return w.runs.ActiveRunIDs(ctx)
	}
	runs := cache.open()
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.rec.RunID
	}
	return ids, nil
}

// Scan checks every active run once (as Check) and returns the joined
// errors; it is the watcher's periodic scan. It reads each workflow
// definition's list of running workflows once (GET
// /workflow/running/{name}) and reads a workflow itself only when it is
// not on that list: Conductor's cost is one call per plan version plus
// one per run that ended, not one per active run.
func (w *Watcher) Scan(ctx context.Context) error {
	return w.scan(ctx, true)
}

// scan is Scan; without lists it reads every active run's workflow.
func (w *Watcher) scan(ctx context.Context, lists bool) error {
	if lists && w.cache.ready() {
		return w.scanCached(ctx)
	}
	all, err := w.runs.ActiveRunIDs(ctx)
	if err != nil {
		w.opts.Metrics.watcherError()
		return err
	}
	ids := make([]string, 0, len(all))
	for _, id := range all {
		if w.opts.Owner.Owns(id) {
			ids = append(ids, id)
		}
	}
	w.opts.Metrics.setActive(len(ids))
	var alive *runningLists
	if lists {
		alive = &runningLists{client: w.conductor, ids: map[defKey]map[string]bool{}}
	}
	var errs []error
	for _, id := range ids {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		errs = append(errs, w.checkWith(ctx, id, alive, true))
	}
	return errors.Join(errs...)
}

// scanCached is scan from the run cache: no index read per run. A run is
// read from Conductor when its definition's running list does not have
// it, and FullReadRate runs a second are read in turn whatever the lists
// say. Only the runs this replica owns are looked at.
func (w *Watcher) scanCached(ctx context.Context) error {
	runs := w.cache.open()
	all := len(runs)
	owned := runs[:0]
	for _, r := range runs {
		if w.opts.Owner.Owns(r.rec.RunID) {
			owned = append(owned, r)
		}
	}
	runs = owned
	w.opts.Metrics.setActive(len(runs))
	// The replicas read FullReadRate runs a second between them: each its
	// share, so that a run is read as often whatever their number.
	inTurn := float64(w.opts.FullReadRate) * w.opts.Interval.Seconds()
	if all > 0 {
		inTurn *= float64(len(runs)) / float64(all)
	}
	forced := w.nextInTurn(runs, max(1, int(math.Round(inTurn))))
	alive := &runningLists{client: w.conductor, ids: map[defKey]map[string]bool{}}
	var errs []error
	for _, r := range runs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		lists := alive
		if forced[r.rec.RunID] {
			lists = nil
		}
		if lists.running(ctx, r.rec) && r.rec.State == RunStateStarted && r.rec.RunStartedEmitted {
			w.found(r.rec.RunID, r.rec.WorkflowID) // the common case, without copying the entry
			continue
		}
		rec := *r.rec // checkRun may change its entry
		err := w.checkRun(ctx, &rec, r.rev, lists, nil, true)
		if err != nil && !errors.Is(err, context.Canceled) {
			w.opts.Metrics.watcherError()
		}
		errs = append(errs, err)
	}
	w.pruneWaiting(runs)
	return errors.Join(errs...)
}

// nextInTurn returns the next n runs after the cursor (runs sorted by id,
// wrapping around) and moves the cursor past them.
func (w *Watcher) nextInTurn(runs []cachedRun, n int) map[string]bool {
	out := make(map[string]bool, min(n, len(runs)))
	if len(runs) == 0 {
		return out
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	start := sort.Search(len(runs), func(i int) bool { return runs[i].rec.RunID > w.cursor })
	for i := 0; i < min(n, len(runs)); i++ {
		id := runs[(start+i)%len(runs)].rec.RunID
		out[id] = true
		w.cursor = id
	}
	return out
}

type defKey struct {
	name    string
	version int32
}

// runningLists caches, for one scan, the ids of the RUNNING and PAUSED
// workflows of each definition. A list that cannot be read is nil: the
// runs of that definition are read one by one.
type runningLists struct {
	client *Client
	ids    map[defKey]map[string]bool
}

// read reports whether rec's definition's list was read (running has
// been asked about rec): a run off a list that was read has most likely
// ended.
func (l *runningLists) read(rec *Run) bool {
	if l == nil || rec.WorkflowName == "" {
		return false
	}
	return l.ids[defKey{rec.WorkflowName, rec.WorkflowVersion}] != nil
}

// running reports whether workflowID is on its definition's list.
func (l *runningLists) running(ctx context.Context, rec *Run) bool {
	if l == nil || rec.WorkflowName == "" {
		return false
	}
	k := defKey{rec.WorkflowName, rec.WorkflowVersion}
	set, ok := l.ids[k]
	if !ok {
		if ids, err := l.client.RunningWorkflows(ctx, k.name, k.version); err == nil {
			set = make(map[string]bool, len(ids))
			for _, id := range ids {
				set[id] = true
			}
		}
		l.ids[k] = set
	}
	return set[rec.WorkflowID]
}

// Check brings one run forward: appends a missing RunStarted, recovers an
// expired start, or, when the run's workflow has ended, appends the terminal
// run event and marks the run FINAL. A run that needs nothing is a no-op.
func (w *Watcher) Check(ctx context.Context, runID string) error {
	return w.checkWith(ctx, runID, nil, false)
}

// checkStatus is Check, also returning the workflow status it read from
// Conductor ("" when it read none).
func (w *Watcher) checkStatus(ctx context.Context, runID string) (model.WorkflowStatus, error) {
	var status model.WorkflowStatus
	err := w.check(ctx, runID, nil, &status, false)
	if err != nil && !errors.Is(err, context.Canceled) {
		w.opts.Metrics.watcherError()
	}
	return status, err
}

func (w *Watcher) checkWith(ctx context.Context, runID string, alive *runningLists, scanning bool) error {
	err := w.check(ctx, runID, alive, nil, scanning)
	if err != nil && !errors.Is(err, context.Canceled) {
		w.opts.Metrics.watcherError()
	}
	return err
}

func (w *Watcher) check(ctx context.Context, runID string, alive *runningLists, saw *model.WorkflowStatus, scanning bool) error {
	rec, rev, err := w.runs.get(ctx, runID)
	if errors.Is(err, ErrNotFound) {
		w.dropActive(ctx, runID)
		return nil
	}
	if err != nil {
		return err
	}
	return w.checkRun(ctx, rec, rev, alive, saw, scanning)
}

// checkRun is check of the index entry rec at revision rev. A scan's read
// of a running workflow (scanning: a run off its definition's running list,
// or its turn for a full read) takes the tasks' statuses too (the trimmed
// read), so that a workflow Conductor left RUNNING with every task done
// becomes a suspect (checkSuspects) without a nudge: the nudge may have
// been lost with the replica that made it, or Conductor may have lost the
// decide after it, as it restarted. A run off a list that was read is
// read without its tasks first: it has most likely ended, and an ended
// workflow's tasks are not needed.
func (w *Watcher) checkRun(ctx context.Context, rec *Run, rev uint64, alive *runningLists, saw *model.WorkflowStatus, scanning bool) error {
	runID := rec.RunID
	switch rec.State {
	case RunStateFinal:
		w.runs.deleteActive(ctx, runID, 0)
		return nil
	case RunStateStarting:
		if time.Now().Before(rec.LeaseExpiresAt) {
			return nil
		}
		return w.recoverStart(ctx, rec, rev)
	}
	if err := w.runs.ensureRunStarted(ctx, rec, rev); err != nil {
		return err
	}
	if alive.running(ctx, rec) {
		w.found(runID, rec.WorkflowID) // RUNNING or PAUSED: nothing to record
		return nil
	}
	var wf *model.Workflow
	var err error
	switch {
	case scanning && alive.read(rec):
		// Off a list that was read: the workflow has most likely ended,
		// which its head says; its tasks are read only if it still runs.
		wf, err = w.conductor.Workflow(ctx, rec.WorkflowID, false)
		if err == nil && wf.Status == model.RunningWorkflow {
			wf, err = w.conductor.WorkflowTasks(ctx, rec.WorkflowID)
		}
	case scanning:
		wf, err = w.conductor.WorkflowTasks(ctx, rec.WorkflowID)
	default:
		wf, err = w.conductor.Workflow(ctx, rec.WorkflowID, false)
	}
	if errors.Is(err, ErrNotFound) {
		w.mu.Lock()
		w.notFound[runID]++
		strikes := w.notFound[runID]
		w.mu.Unlock()
		if strikes < w.opts.LostAfter {
			return nil
		}
		return w.finish(ctx, runID, rec.WorkflowID, engineStatusLost,
			fmt.Sprintf("Conductor no longer knows workflow %s (answered 404 %d times)", rec.WorkflowID, strikes), nil)
	}
	if err != nil {
		return err
	}
	w.found(runID, rec.WorkflowID)
	if saw != nil {
		*saw = wf.Status
	}
	switch wf.Status {
	case model.CompletedWorkflow, model.FailedWorkflow, model.TimedOutWorkflow, model.TerminatedWorkflow:
		return w.finish(ctx, runID, rec.WorkflowID, string(wf.Status), wf.ReasonForIncompletion, w.parentCancelled(ctx, rec, wf))
	case model.RunningWorkflow, model.PausedWorkflow:
		if scanning && wf.Status == model.RunningWorkflow && allDone(wf.Tasks) {
			w.suspectRun(runID)
		}
		switch {
		case wf.Status == model.PausedWorkflow:
			w.clearWaiting(runID)
		case scanning && wf.Tasks != nil:
			w.noteWaiting(rec, waitingTask(wf.Tasks, time.Now(), w.opts.WaitingAfter))
		}
		return w.saw(ctx, rec, string(wf.Status))
	}
	return nil
}

// saw tells the pause follower what the watcher saw of rec's workflow,
// and counts what it did.
func (w *Watcher) saw(ctx context.Context, rec *Run, status string) error {
	if w.opts.Pauses == nil {
		return nil
	}
	action, err := w.opts.Pauses.Saw(ctx, rec.RunID, rec.WorkflowID, status)
	if action != "" {
		w.opts.Metrics.watcherAction(action)
	}
	if action == actionConductorResumed && w.opts.Adopted != nil && rec.IsAdopted() {
		w.opts.Adopted.Resumed(rec.RunID) // the tasks Conductor scheduled as it resumed
	}
	if err != nil {
		return fmt.Errorf("adapter: watcher: run %s: %w", rec.RunID, err)
	}
	return nil
}

// found notes that Conductor knows the run's workflow: it ends a streak of
// 404s and marks the workflow as the run's (not an orphan).
func (w *Watcher) found(runID, workflowID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.notFound, runID)
	w.known[workflowID] = runID
}

// dropActive removes a stale index entry of a run that has no registry
// entry (a released start), unless it was rewritten meanwhile.
func (w *Watcher) dropActive(ctx context.Context, runID string) {
	rev, err := w.runs.activeRevision(ctx, runID)
	if err != nil {
		return
	}
	if _, _, err := w.runs.get(ctx, runID); errors.Is(err, ErrNotFound) {
		w.runs.deleteActive(ctx, runID, rev)
	}
}

// parentCancelled is the state of the run of wf's parent workflow when
// wf, an adopted run's workflow, was TERMINATED because that run was
// cancelled (Conductor terminates a workflow's sub-workflows with it; an
// adopted parent's runId is its workflowId); nil otherwise.
func (w *Watcher) parentCancelled(ctx context.Context, rec *Run, wf *model.Workflow) *statestore.RunSnapshot {
	if wf.Status != model.TerminatedWorkflow || wf.ParentWorkflowId == "" || !rec.IsAdopted() {
		return nil
	}
	parent, err := w.snaps.ProjectSnapshot(ctx, wf.ParentWorkflowId)
	if err != nil || !parent.CancelRequested {
		return nil
	}
	return parent
}

// finish appends the terminal event for engineStatus, the end of the run's
// workflow workflowID (unless the run is already terminal in its
// snapshot), and marks the run FINAL. parentCancel, when set, is the
// cancelled run whose workflow terminated this one (parentCancelled). It reads the run's entry from the
// bucket's leader: the end of a run is for good, and a follower may still
// hold an entry that was replaced (a start abandoned and retried with
// another workflow); if the entry names another workflow now, the one that
// ended was not the run's, and nothing is recorded.
func (w *Watcher) finish(ctx context.Context, runID, workflowID, engineStatus, reason string, parentCancel *statestore.RunSnapshot) error {
	rec, rev, err := w.runs.leaderRun(ctx, runID)
	if errors.Is(err, ErrNotFound) {
		return nil // released: its workflow was an abandoned start's
	}
	if err != nil {
		return err
	}
	if rec.WorkflowID != workflowID {
		w.log.Info("a workflow that is no longer the run's ended; nothing recorded (the orphan rules handle it)",
			zap.String("runId", runID), zap.String("workflowId", workflowID), zap.String("runWorkflowId", rec.WorkflowID))
		return nil
	}
	if rec.State == RunStateFinal {
		w.runs.deleteActive(ctx, runID, 0)
		return nil
	}
	snap, err := w.snaps.ProjectSnapshot(ctx, runID)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		return fmt.Errorf("adapter: watcher: snapshot of run %s: %w", runID, err)
	}
	if snap == nil || !statestore.IsTerminalRunStatus(snap.Status) {
		if w.opts.Adopted != nil && rec.IsAdopted() && engineStatus != engineStatusLost {
			if err := w.opts.Adopted.Settle(ctx, rec); err != nil {
				return fmt.Errorf("adapter: watcher: the last tasks of adopted run %s: %w", runID, err)
			}
		}
		if !rec.IsAdopted() && engineStatus != engineStatusLost {
			if err := w.settlePlan(ctx, rec, snap, engineStatus); err != nil {
				return err
			}
		}
		if err := w.endInLog(ctx, rec, engineStatus, reason, parentCancel); err != nil {
			return err
		}
	}
	for range 5 {
		rec.State = RunStateFinal
		rec.EngineStatus = engineStatus
		rec.FinalAt = time.Now().UTC()
		_, err := w.runs.updateRun(ctx, rec, rev)
		if err == nil {
			break
		}
		if !isRevisionMismatch(err) {
			return err
		}
		if rec, rev, err = w.runs.get(ctx, runID); err != nil {
			return err
		}
		if rec.State == RunStateFinal {
			break
		}
	}
	w.mu.Lock()
	delete(w.notFound, runID)
	delete(w.known, rec.WorkflowID)
	w.mu.Unlock()
	w.clearSuspect(runID)
	w.clearWaiting(runID)
	w.runs.deleteActive(ctx, runID, 0)
	return nil
}

// maxPauseCloses bounds how often endInLog closes a pause that keeps
// landing before the run's RunCompleted.
const maxPauseCloses = 3

// endInLog appends the run's terminal event for Conductor's engineStatus
// through statestore.Fenced: decided on the run's state, checked against
// it (the producer guard, Layer 1: never an event the projector would
// flag), and appended only while that state is still the run's, so an
// event that lands meanwhile (a pause) makes it read and decide again. A
// run COMPLETED in Conductor while PAUSED in the log (a pause that raced
// the run's completion, before or after the watcher's read) is told to
// the pause follower, which closes the pause, and then decided again, at
// most maxPauseCloses times. A refusal that closing a pause cannot cure
// is logged and counted, and the run is marked FINAL without a terminal
// event.
func (w *Watcher) endInLog(ctx context.Context, rec *Run, engineStatus, reason string, parentCancel *statestore.RunSnapshot) error {
	for closes := 1; ; closes++ {
		var (
			ev     *statestore.RunEventWrite
			label  string
			paused bool
		)
		_, _, err := statestore.Fenced(ctx, w.snaps, w.emitter, rec.RunID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
			ev, paused = nil, false
			if statestore.IsTerminalRunStatus(s.Status) {
				return nil, nil // another replica recorded the end meanwhile
			}
			if w.opts.Pauses != nil && closes <= maxPauseCloses && pausedAtCompletion(s, engineStatus) {
				paused = true
				return nil, nil // the pause follower closes the pause first
			}
			var err error
			ev, label, err = terminalEvent(rec, engineStatus, reason, s, parentCancel)
			return ev, err
		})
		switch {
		case err == nil && paused:
			if err := w.saw(ctx, rec, engineStatus); err != nil {
				return err
			}
			continue
		case errors.Is(err, statestore.ErrInvalidTransition), errors.Is(err, statestore.ErrNotFound):
			// Not valid from the run's state, as the guard or a store that
			// validates transitions (Layer 2) found it.
			w.opts.Metrics.watcherAction(actionTerminalRefused)
			w.log.Error("terminal run event not valid from the run's state; marking the run final without it",
				zap.String("runId", rec.RunID), zap.String("engineStatus", engineStatus), zap.Error(err))
			return nil
		case err != nil:
			return fmt.Errorf("adapter: watcher: end of run %s: %w", rec.RunID, err)
		case ev == nil:
			return nil
		}
		w.opts.Metrics.terminalEvent(label)
		w.log.Info("run ended", zap.String("runId", rec.RunID), zap.String("workflowId", rec.WorkflowID),
			zap.String("engineStatus", engineStatus), zap.String("event", ev.EventType))
		return nil
	}
}

// pausedAtCompletion tells whether Conductor COMPLETED a workflow whose run
// the log (snap) has PAUSED, no cancel requested: RunCompleted is not
// valid until the pause follower closes the pause.
func pausedAtCompletion(snap *statestore.RunSnapshot, engineStatus string) bool {
	return snap != nil && snap.Status == statestore.RunStatusPaused && !snap.CancelRequested &&
		engineStatus == string(model.CompletedWorkflow)
}

// terminalEvent maps a terminal Conductor status to the run event to
// append; label is the metric label (CANCELLED for our own cancel). A run
// whose cancel is requested ends CANCELLED whatever Conductor reports
// (Cancel wins): the workflow may have completed or failed before the
// cancel's terminate reached it, or without it (its process died in
// between); Conductor's status is in the payload. A workflow terminated by
// its parent's cancel (parentCancel, the parent's run) ends RunCancelled
// too, naming who requested the parent's cancel: nothing of it failed.
func terminalEvent(rec *Run, engineStatus, reason string, snap, parentCancel *statestore.RunSnapshot) (*statestore.RunEventWrite, string, error) {
	if snap != nil && snap.CancelRequested {
		ev, err := runEvent(rec, statestore.RunCancelled, statestore.RunCancelledPayload{EngineStatus: engineStatus, Reason: reason,
			RequestedBy: snap.CancelRequestedBy})
		return ev, "CANCELLED", err
	}
	if parentCancel != nil && engineStatus == string(model.TerminatedWorkflow) {
		ev, err := runEvent(rec, statestore.RunCancelled, statestore.RunCancelledPayload{EngineStatus: engineStatus, Reason: reason,
			RequestedBy: parentCancel.CancelRequestedBy})
		return ev, "CANCELLED", err
	}
	failed := func(code, fallback string) (*statestore.RunEventWrite, string, error) {
		msg := reason
		if msg == "" {
			msg = fallback
		}
		ev, err := runEvent(rec, statestore.RunFailed, statestore.RunFailedPayload{
			EngineStatus: engineStatus, Error: &statestore.StepError{Code: code, Message: msg, Retryable: false},
		})
		return ev, engineStatus, err
	}
	switch engineStatus {
	case string(model.CompletedWorkflow):
		ev, err := runEvent(rec, statestore.RunCompleted, statestore.RunCompletedPayload{EngineStatus: engineStatus})
		return ev, engineStatus, err
	case string(model.FailedWorkflow):
		return failed(CodeWorkflowFailed, "workflow FAILED in Conductor")
	case string(model.TimedOutWorkflow):
		return failed(CodeWorkflowTimedOut, "workflow TIMED_OUT in Conductor")
	case string(model.TerminatedWorkflow):
		return failed(CodeWorkflowTerminated, "workflow TERMINATED in Conductor")
	default:
		return failed(CodeWorkflowNotFound, "workflow not found in Conductor")
	}
}

// recoverStart handles a start whose lease expired without the workflow
// being recorded: if Conductor runs a workflow carrying the runId, adopt it
// (the oldest, if several); otherwise release the lease, so that a retry of
// the request starts cleanly.
func (w *Watcher) recoverStart(ctx context.Context, rec *Run, rev uint64) error {
	c := w.conductor
	ids, err := c.RunningWorkflows(ctx, rec.WorkflowName, rec.WorkflowVersion)
	if err != nil {
		return err
	}
	var candidates []*model.Workflow
	for _, id := range ids {
		w.mu.Lock()
		_, isKnown := w.known[id]
		w.mu.Unlock()
		if isKnown {
			continue
		}
		wf, err := c.Workflow(ctx, id, false)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if runID, _ := wf.Input[plan.InputRunID].(string); runID == rec.RunID {
			candidates = append(candidates, wf)
		}
	}
	if len(candidates) == 0 {
		w.log.Info("releasing an expired start lease; no workflow was started", zap.String("runId", rec.RunID),
			zap.String("attempt", rec.AttemptID))
		w.runs.release(ctx, rec, rev)
		return nil
	}
	sort.Slice(candidates, func(i, j int) bool {
		if candidates[i].StartTime != candidates[j].StartTime {
			return candidates[i].StartTime < candidates[j].StartTime
		}
		return candidates[i].WorkflowId < candidates[j].WorkflowId
	})
	wf := candidates[0]
	rec.State = RunStateStarted
	rec.WorkflowID = wf.WorkflowId
	rec.StartedAt = time.UnixMilli(wf.StartTime).UTC()
	if wf.StartTime == 0 {
		rec.StartedAt = time.Now().UTC()
	}
	rec.LeaseExpiresAt = time.Time{}
	newRev, err := w.runs.updateRun(ctx, rec, rev)
	if isRevisionMismatch(err) {
		return nil // a retry of the request or another replica got there first
	}
	if err != nil {
		return err
	}
	w.opts.Metrics.orphan("adopted")
	w.log.Warn("adopted the workflow of a crashed start", zap.String("runId", rec.RunID),
		zap.String("workflowId", wf.WorkflowId), zap.Int("candidates", len(candidates)))
	w.mu.Lock()
	w.known[wf.WorkflowId] = rec.RunID
	w.mu.Unlock()
	if w.opts.StartAdopted != nil {
		w.opts.StartAdopted()
	}
	return w.runs.ensureRunStarted(ctx, rec, newRev)
}

// Reconcile looks at the RUNNING and PAUSED workflows of every plan version
// in the registry (those whose workflow id this replica owns) and
// terminates the orphans: workflows started by the
// adapter (their input has runId and startAttemptId) in this Runs' task
// domain, whose run is recorded with another workflow, or that have no run
// entry and are older than the lease. Workflows of runs still STARTING are left alone (Check adopts them
// once the lease expires).
func (w *Watcher) Reconcile(ctx context.Context) error {
	plans, err := w.runs.registeredPlans(ctx)
	if err != nil {
		return err
	}
	type nameVersion struct {
		name    string
		version int32
	}
	seen := make(map[nameVersion]bool)
	// The workflows the run index records, whoever owns their runs: they
	// are no orphans, and need no read.
	recorded := w.cache.workflowIDs()
	var errs []error
	for _, p := range plans {
		nv := nameVersion{p.WorkflowName, p.WorkflowVersion}
		if seen[nv] {
			continue
		}
		seen[nv] = true
		ids, err := w.conductor.RunningWorkflows(ctx, nv.name, nv.version)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, id := range ids {
			if recorded[id] || !w.opts.Owner.Owns(id) {
				continue
			}
			if err := w.reconcileWorkflow(ctx, id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (w *Watcher) reconcileWorkflow(ctx context.Context, workflowID string) error {
	w.mu.Lock()
	_, isKnown := w.known[workflowID]
	w.mu.Unlock()
	if isKnown {
		return nil
	}
	c := w.conductor
	wf, err := c.Workflow(ctx, workflowID, false)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	runID, _ := wf.Input[plan.InputRunID].(string)
	attempt, _ := wf.Input[InputStartAttemptID].(string)
	if runID == "" || attempt == "" {
		return nil // not started by the adapter
	}
	if wf.TaskToDomain["*"] != w.runs.opts.TaskDomain {
		return nil // started by a deployment with another task domain
	}
	rec, _, err := w.runs.get(ctx, runID)
	var reason string
	switch {
	case errors.Is(err, ErrNotFound):
		if wf.StartTime == 0 || time.Since(time.UnixMilli(wf.StartTime)) < w.runs.opts.LeaseTTL {
			return nil
		}
		reason = fmt.Sprintf("sidecar: orphan workflow: run %s has no run entry (its start was abandoned)", runID)
	case err != nil:
		return err
	case rec.WorkflowID == workflowID:
		w.mu.Lock()
		w.known[workflowID] = runID
		w.mu.Unlock()
		return nil
	case rec.State == RunStateStarting:
		return nil
	default:
		reason = fmt.Sprintf("sidecar: orphan workflow: run %s runs as workflow %s", runID, rec.WorkflowID)
	}
	if err := c.Terminate(ctx, workflowID, reason); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	w.opts.Metrics.orphan("terminated")
	w.log.Warn("terminated an orphan workflow", zap.String("workflowId", workflowID), zap.String("runId", runID),
		zap.String("reason", reason))
	return nil
}

// NudgeWorkflow asks for a prompt check of the run whose workflow is
// workflowID (Conductor notified a change of the workflow's status), and
// reports whether workflowID is the workflow of a run the watcher follows.
// The check is Nudge's: the workflow is read from Conductor, and what it
// shows recorded as the scan would. It never blocks; a workflow of no
// open run is left alone.
func (w *Watcher) NudgeWorkflow(workflowID string) bool {
	if workflowID == "" {
		return false
	}
	w.mu.Lock()
	runID, ok := w.known[workflowID]
	cache := w.cache
	w.mu.Unlock()
	if !ok {
		runID, ok = cache.runOf(workflowID)
	}
	if ok {
		w.Nudge(runID)
	}
	return ok
}
