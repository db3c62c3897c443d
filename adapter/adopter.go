package adapter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
)

// AdopterOptions configures NewAdopter. Zero values take the defaults noted.
type AdopterOptions struct {
	// Specs are the adopted definitions (--adopt).
	Specs []AdoptSpec
	// Identity is the tenant, project and environment of adopted runs
	// (each default "default").
	Identity AdoptedIdentity
	// Interval is how often the runs with a system task in progress are
	// read back and the nudged runs read (default 1s).
	Interval time.Duration
	// DiscoverEvery is how many Intervals pass between two reads of the
	// adopted definitions' running lists, which finds the workflows no
	// task poll showed yet (default 5).
	DiscoverEvery int
	// Owner divides the adopted runs between replicas (default: all).
	Owner Owner
	// TaskDomain, when set, adopts only the workflows started in that
	// task domain (taskToDomain["*"], or every entry when it has no "*"):
	// deployments that share a Conductor and adopt the same definition
	// keep their workflows apart. Empty: every workflow of the adopted
	// definitions, whatever its domain.
	TaskDomain string
	// OnStepFailure is the failure policy of adopted runs' worker tasks
	// (plan.OnFailureFail, the default, or plan.OnFailurePause: a final
	// failure reported through the proxy is held for RETRY_STEP).
	OnStepFailure string
	// Pauses, when set, is told when a read of an adopted workflow finds
	// it PAUSED in Conductor (the run watcher's follower), so that a pause
	// made in Conductor is in the log before the gate decides on the
	// workflow's tasks, not only at the watcher's next scan.
	Pauses PauseFollower
	Logger *zap.Logger
}

// Adopter makes the workflows of the adopted definitions runs of the log
// (docs/workers.md, "Adopting existing workflows"). A workflow is adopted
// when a task of it is first polled through the task proxy (Ensure, from
// the workers' guard) or when the periodic read of its definition's
// running list finds it (a workflow already running when adoption
// started). Each adopted run is then read back from Conductor, with its
// tasks, when something may have changed: a nudge (an outside worker's
// report through the proxy), every Interval while a system task of it is
// in progress, and once more before the watcher appends its terminal
// event (Settle). The run's end is the watcher's, as for plan runs.
type Adopter struct {
	runs  *Runs
	snaps SnapshotReader
	opts  AdopterOptions
	log   *zap.Logger

	mu sync.Mutex
	// known are the open adopted runs this process follows: runId ->
	// whether a task of it is still to be recorded from Conductor.
	known map[string]*followed
	// nudged are the runs to read at the next tick.
	nudged map[string]struct{}
	// resumed are the runs this process did not follow when a resume of
	// them reached Conductor (Resumed): read and followed at the next tick.
	resumed map[string]struct{}
	nudgeCh chan struct{}
	// foreign caches the workflows of an adopted definition's name whose
	// version is not adopted (bounded).
	foreign map[string]struct{}

	cancel context.CancelFunc
	done   chan struct{}
}

type followed struct {
	rec     *Run
	pending bool
	// visiting is set on a run another replica owns, followed here since
	// a resume of it went through this process: it is forgotten once a read
	// finds nothing of it left to record.
	visiting bool
	// followUps are the interval reads still due after a read found a
	// control task open: a JOIN completes, or a loop moves on, a moment
	// after the worker report whose nudge caused that read.
	followUps int
}

// controlFollowUps is how many interval reads follow a read that found a
// control task open.
const controlFollowUps = 3

// NewAdopter returns an Adopter for runs' run index and Conductor client.
func NewAdopter(runs *Runs, snaps SnapshotReader, opts AdopterOptions) *Adopter {
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.DiscoverEvery <= 0 {
		opts.DiscoverEvery = 5
	}
	if opts.Owner == nil {
		opts.Owner = everyRun{}
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	for _, f := range []*string{&opts.Identity.TenantID, &opts.Identity.ProjectID, &opts.Identity.EnvironmentID} {
		if *f == "" {
			*f = "default"
		}
	}
	return &Adopter{runs: runs, snaps: snaps, opts: opts, log: opts.Logger.Named("adopter"),
		known: map[string]*followed{}, nudged: map[string]struct{}{}, resumed: map[string]struct{}{}, nudgeCh: make(chan struct{}, 1), foreign: map[string]struct{}{}}
}

// Open starts the adopter's loop.
func (a *Adopter) Open(ctx context.Context) error {
	ctx, a.cancel = context.WithCancel(context.WithoutCancel(ctx))
	a.done = make(chan struct{})
	go a.loop(ctx)
	specs := make([]string, len(a.opts.Specs))
	for i, s := range a.opts.Specs {
		specs[i] = s.String()
	}
	a.log.Info("adopting the workflows of existing definitions", zap.Strings("adopt", specs))
	return nil
}

// Close stops the loop.
func (a *Adopter) Close(ctx context.Context) error {
	if a.cancel == nil {
		return nil
	}
	a.cancel()
	select {
	case <-a.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Nudge asks for runID's workflow to be read back soon (a task of it ended).
func (a *Adopter) Nudge(runID string) {
	a.mu.Lock()
	_, ok := a.known[runID]
	if ok {
		a.nudged[runID] = struct{}{}
	}
	a.mu.Unlock()
	if ok {
		select {
		case a.nudgeCh <- struct{}{}:
		default:
		}
	}
}

// maxResumed bounds the resumed runs waiting for their first read.
const maxResumed = 10_000

// Resumed asks for runID's workflow to be read back soon because a resume
// of it reached Conductor, which schedules the run's next tasks as it
// resumes it (drain.AdoptedRuns, and the run watcher for a resume made in
// Conductor). Unlike Nudge, a run this process does not follow (another
// replica owns it) is read too, and followed until a read finds nothing
// of it left to record: its system tasks are in the log while they run
// whichever replica the resume went through. It does not block.
func (a *Adopter) Resumed(runID string) {
	a.mu.Lock()
	if _, ok := a.known[runID]; ok {
		a.nudged[runID] = struct{}{}
	} else if len(a.resumed) < maxResumed {
		a.resumed[runID] = struct{}{}
	}
	a.mu.Unlock()
	select {
	case a.nudgeCh <- struct{}{}:
	default:
	}
}

// follow reads runID, an adopted run this process did not follow, and
// follows it from then on (visiting, when another replica owns it).
func (a *Adopter) follow(ctx context.Context, runID string) error {
	rec, err := a.runs.Run(ctx, runID)
	if err != nil || !rec.IsAdopted() || rec.State == RunStateFinal {
		return err
	}
	a.mu.Lock()
	if _, ok := a.known[runID]; !ok {
		a.known[runID] = &followed{rec: rec, visiting: !a.opts.Owner.Owns(runID)}
	}
	a.mu.Unlock()
	return a.read(ctx, rec, adoptReadNudge)
}

// AdoptsName reports whether a definition of that name is adopted (some
// version of it): Step is false for the tasks of any other
// (taskworkers.AdoptedSteps).
func (a *Adopter) AdoptsName(name string) bool {
	for _, s := range a.opts.Specs {
		if s.Name == name {
			return true
		}
	}
	return false
}

func (a *Adopter) adopts(name string, version int32) bool {
	for _, s := range a.opts.Specs {
		if s.matches(name, version) {
			return true
		}
	}
	return false
}

// adoptsWorkflow reports whether wf is adopted: of an adopted definition
// and, with AdopterOptions.TaskDomain set, started in that task domain.
func (a *Adopter) adoptsWorkflow(wf *model.Workflow) bool {
	return a.adopts(wf.WorkflowName, wf.WorkflowVersion) && InTaskDomain(wf.TaskToDomain, a.opts.TaskDomain)
}

// InTaskDomain reports whether a workflow started with taskToDomain runs
// its tasks in domain: its "*" entry is domain or, without one, every
// entry is (an empty map: no domain). An empty domain matches any
// workflow.
func InTaskDomain(taskToDomain map[string]string, domain string) bool {
	if domain == "" {
		return true
	}
	// Conductor trims the domain it maps a task to.
	if d, ok := taskToDomain["*"]; ok {
		return strings.TrimSpace(d) == domain
	}
	for _, d := range taskToDomain {
		if strings.TrimSpace(d) != domain {
			return false
		}
	}
	return len(taskToDomain) > 0
}

// markForeign remembers a workflow of an adopted definition's name that
// is not adopted (another version, another task domain, a plan run's),
// so that its tasks pass the proxy and the running-list read skips it
// without reading it again.
func (a *Adopter) markForeign(id string) {
	a.mu.Lock()
	if len(a.foreign) > 100_000 {
		clear(a.foreign)
	}
	a.foreign[id] = struct{}{}
	a.mu.Unlock()
}

// Step is the assignment of a polled worker task of an adopted workflow
// (taskworkers.Options.Adopted): ok false for a task of any other
// workflow, which then passes untouched. A task of a workflow not seen
// yet costs one read of the run index (and, when no run has its id, one
// of the workflow from Conductor); the run itself is adopted by the
// workers' guard (Ensure) before the step starts.
func (a *Adopter) Step(t *model.Task) (*plan.TaskInput, bool) {
	if t == nil || t.WorkflowType == "" || !a.AdoptsName(t.WorkflowType) || !IsWorkerTask(t.TaskType) {
		return nil, false
	}
	id := t.WorkflowInstanceId
	a.mu.Lock()
	f, known := a.known[id]
	_, isForeign := a.foreign[id]
	a.mu.Unlock()
	if isForeign {
		return nil, false
	}
	if known {
		return AdoptedTaskInput(f.rec, t, a.opts.OnStepFailure), true
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.runs.conductor.timeout)
	defer cancel()
	rec, err := a.runs.Run(ctx, id)
	switch {
	case err == nil && rec.IsAdopted():
		return AdoptedTaskInput(rec, t, a.opts.OnStepFailure), true
	case err == nil:
		return nil, false // a plan run's workflow
	case !errors.Is(err, ErrNotFound):
		a.log.Warn("could not read the run index for a polled task; passing it through", zap.String("workflowId", id), zap.Error(err))
		return nil, false
	}
	wf, err := a.runs.conductor.Workflow(ctx, id, false)
	if err != nil {
		a.log.Warn("could not read a polled task's workflow; passing it through", zap.String("workflowId", id), zap.Error(err))
		return nil, false
	}
	if !a.adoptsWorkflow(wf) {
		a.markForeign(id)
		return nil, false
	}
	// Not adopted yet: the identity it will get (the guard adopts it).
	pending := &Run{RunID: id, TenantID: a.opts.Identity.TenantID, ProjectID: a.opts.Identity.ProjectID,
		EnvironmentID: a.opts.Identity.EnvironmentID, PlanID: wf.WorkflowName, PlanVersion: strconv.Itoa(int(wf.WorkflowVersion))}
	return AdoptedTaskInput(pending, t, a.opts.OnStepFailure), true
}

// Sync records what the log lacks of the tasks of t's workflow, when it
// is an adopted run this process follows, before the gate starts t's step
// (taskworkers.AdoptedSteps): the system tasks Conductor ran before t
// come before it in the log. A workflow this process does not follow yet
// is adopted here (as Ensure does), t left to the gate: Conductor shows
// it IN_PROGRESS since the proxy's poll, but no worker has it yet, and a
// workflow found PAUSED must hold it back rather than have it recorded
// as started by the mid-flight rule.
func (a *Adopter) Sync(ctx context.Context, t *model.Task) error {
	a.mu.Lock()
	f, known := a.known[t.WorkflowInstanceId]
	a.mu.Unlock()
	if !known {
		return a.ensure(ctx, t.WorkflowInstanceId, t.TaskId)
	}
	return a.read(ctx, f.rec, adoptReadGate)
}

// SyncEngineTasks records what the log lacks of runID's tasks as
// Conductor reports them now (drain.AdoptedRuns): called by a pause of the
// run once Conductor's pause took effect, so that the system tasks
// Conductor runs whatever the pause (scheduled or in progress) are in
// flight before the drain's end is decided. Any replica may call it for
// any adopted run; a run this process does not follow is read from the
// run index first.
func (a *Adopter) SyncEngineTasks(ctx context.Context, runID string) error {
	a.mu.Lock()
	f, known := a.known[runID]
	a.mu.Unlock()
	rec := (*Run)(nil)
	if known {
		rec = f.rec
	} else {
		r, err := a.runs.Run(ctx, runID)
		if err != nil {
			return err
		}
		if !r.IsAdopted() {
			return nil
		}
		rec = r
	}
	return a.read(ctx, rec, adoptReadPause)
}

// Adopts reports whether runID may be an adopted workflow's run: adopted
// runs' runId is their workflowId.
func (a *Adopter) Adopts(runID, workflowID string) bool { return runID == workflowID }

// Ensure adopts workflowID now, if its definition is adopted, and records
// what of its tasks the log lacks; ErrNotFound when its definition is not
// adopted (or Conductor does not know it).
func (a *Adopter) Ensure(ctx context.Context, workflowID string) error {
	return a.ensure(ctx, workflowID, "")
}

// EnsureRunning is Ensure for a workflow Conductor runs now (RUNNING or
// PAUSED), for a request that names a run the log does not have yet (a
// control request or a status read in the seconds before the running-list
// read finds a new workflow). An ended workflow is not adopted: its run
// may have ended and left hot state. ErrNotFound for any workflow that is
// not adopted, ended, or unknown to Conductor; a workflow already known as
// not adopted costs no read.
func (a *Adopter) EnsureRunning(ctx context.Context, workflowID string) error {
	a.mu.Lock()
	_, known := a.known[workflowID]
	_, isForeign := a.foreign[workflowID]
	a.mu.Unlock()
	switch {
	case known:
		return nil
	case isForeign:
		return &Error{Code: CodeNotFound, Op: "adopt", Message: "workflow " + workflowID + " is not adopted"}
	}
	wf, err := a.workflowToAdopt(ctx, workflowID)
	if err != nil {
		return err
	}
	if wf.Status != model.RunningWorkflow && wf.Status != model.PausedWorkflow {
		return &Error{Code: CodeNotFound, Op: "adopt", Message: fmt.Sprintf("workflow %s is %s: only a running or paused workflow is adopted on demand", workflowID, wf.Status)}
	}
	return a.adopt(ctx, wf, "")
}

// ensure is Ensure; gatedTaskID is the task whose poll adopts the
// workflow ("" when no poll does), which the gate starts.
func (a *Adopter) ensure(ctx context.Context, workflowID, gatedTaskID string) error {
	wf, err := a.workflowToAdopt(ctx, workflowID)
	if err != nil {
		return err
	}
	return a.adopt(ctx, wf, gatedTaskID)
}

// workflowToAdopt reads workflowID with its tasks from Conductor; an
// error matching ErrNotFound when it is not adopted (another definition
// or version, another task domain, a plan run's workflow), remembered.
func (a *Adopter) workflowToAdopt(ctx context.Context, workflowID string) (*model.Workflow, error) {
	a.runs.metrics.adoptRead(adoptReadAdoption)
	wf, err := a.runs.conductor.WorkflowTasks(ctx, workflowID)
	if err != nil {
		return nil, err
	}
	if !a.adopts(wf.WorkflowName, wf.WorkflowVersion) {
		a.markForeign(workflowID)
		return nil, &Error{Code: CodeNotFound, Op: "adopt", Message: "workflow " + workflowID + " is not of an adopted definition"}
	}
	if !InTaskDomain(wf.TaskToDomain, a.opts.TaskDomain) {
		a.markForeign(workflowID)
		return nil, &Error{Code: CodeNotFound, Op: "adopt", Message: fmt.Sprintf("workflow %s runs in task domain %q, not %q; it is not adopted", workflowID, wf.TaskToDomain["*"], a.opts.TaskDomain)}
	}
	if _, planRun := wf.Input[plan.InputRunID]; planRun {
		// The workflow of a plan run (the sidecar started it): it is in
		// the log as that run already.
		a.markForeign(workflowID)
		return nil, &Error{Code: CodeNotFound, Op: "adopt", Message: "workflow " + workflowID + " is a plan run's; it is not adopted"}
	}
	return wf, nil
}

// adopt records wf as a run and brings its tasks into the log (the
// mid-flight rule on the first read).
func (a *Adopter) adopt(ctx context.Context, wf *model.Workflow, gatedTaskID string) error {
	rec, err := a.runs.adoptRun(ctx, wf, a.opts.Identity)
	if err != nil {
		return err
	}
	pending, control, err := a.runs.recordTasks(ctx, a.snaps, rec, wf, true, gatedTaskID)
	err = errors.Join(err, a.sawPaused(ctx, rec, wf))
	a.mu.Lock()
	// A run that ended is not followed again, even when Conductor runs
	// its workflow again (restart, rerun, retry): a run ends once.
	if rec.State != RunStateFinal && (wf.Status == model.RunningWorkflow || wf.Status == model.PausedWorkflow) {
		f := &followed{rec: rec, pending: pending || err != nil}
		if control {
			f.followUps = controlFollowUps
		}
		a.known[rec.RunID] = f
	}
	a.mu.Unlock()
	return err
}

// Settle records what the log lacks of rec's tasks before the watcher
// appends its terminal event (adopted runs only).
func (a *Adopter) Settle(ctx context.Context, rec *Run) error {
	if !rec.IsAdopted() {
		return nil
	}
	err := a.read(ctx, rec, adoptReadSettle)
	a.mu.Lock()
	delete(a.known, rec.RunID)
	delete(a.nudged, rec.RunID)
	a.mu.Unlock()
	return err
}

// read reads rec's workflow with its tasks and records what the log
// lacks; reason is counted (sidecar_adopter_reads_total).
func (a *Adopter) read(ctx context.Context, rec *Run, reason string) error {
	a.runs.metrics.adoptRead(reason)
	wf, err := a.runs.conductor.WorkflowTasks(ctx, rec.WorkflowID)
	if err != nil {
		return err
	}
	pending, control, err := a.runs.recordTasks(ctx, a.snaps, rec, wf, false, "")
	err = errors.Join(err, a.sawPaused(ctx, rec, wf))
	a.mu.Lock()
	if f, ok := a.known[rec.RunID]; ok {
		f.pending = pending || err != nil
		switch {
		case !control:
			f.followUps = 0
		case reason == adoptReadPending:
			f.followUps = max(f.followUps-1, 0)
		case reason == adoptReadPause:
			// Conductor's pause took effect: no control task moves on
			// for a report that follows; the interval reads left stay.
		default:
			f.followUps = controlFollowUps
		}
		if f.visiting && !f.pending && f.followUps == 0 {
			delete(a.known, rec.RunID) // its owner follows it
		}
	}
	a.mu.Unlock()
	return err
}

// sawPaused tells the pause follower that wf, rec's workflow, is PAUSED
// in Conductor: a pause made there is recorded (RunPaused, requestedBy
// conductor) unless the log has it already or it is the sidecar's own.
// Conductor's pause leaves the workflow's scheduled tasks pollable, so the
// gate, which decides on the log, must see it first.
func (a *Adopter) sawPaused(ctx context.Context, rec *Run, wf *model.Workflow) error {
	if a.opts.Pauses == nil || wf.Status != model.PausedWorkflow {
		return nil
	}
	_, err := a.opts.Pauses.Saw(ctx, rec.RunID, rec.WorkflowID, string(wf.Status))
	return err
}

func (a *Adopter) loop(ctx context.Context) {
	defer close(a.done)
	tick := time.NewTicker(a.opts.Interval)
	defer tick.Stop()
	a.discover(ctx)
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-a.nudgeCh:
			a.readDue(ctx, false)
			n--
		case <-tick.C:
			if n%a.opts.DiscoverEvery == 0 {
				a.discover(ctx)
			}
			a.readDue(ctx, true)
		}
	}
}

// readDue reads the nudged runs, and with pending also those with a task
// still to be recorded.
func (a *Adopter) readDue(ctx context.Context, pending bool) {
	a.mu.Lock()
	type dueRun struct {
		rec    *Run
		reason string
	}
	var due []dueRun
	for id, f := range a.known {
		if _, nudged := a.nudged[id]; nudged {
			due = append(due, dueRun{f.rec, adoptReadNudge})
		} else if pending && (f.pending || f.followUps > 0) {
			due = append(due, dueRun{f.rec, adoptReadPending})
		}
	}
	clear(a.nudged)
	var resumed []string
	for id := range a.resumed {
		resumed = append(resumed, id)
	}
	clear(a.resumed)
	a.mu.Unlock()
	for _, id := range resumed {
		if ctx.Err() != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := a.follow(rctx, id); err != nil {
			a.log.Debug("could not read a resumed adopted run", zap.String("runId", id), zap.Error(err))
		}
		cancel()
	}
	for _, d := range due {
		if ctx.Err() != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := a.read(rctx, d.rec, d.reason); err != nil {
			a.log.Debug("could not bring an adopted run's tasks into the log; trying again", zap.String("runId", d.rec.RunID), zap.Error(err))
		}
		cancel()
	}
}

// discover reads the running lists of the adopted definitions and adopts
// the workflows this process does not follow yet (after a restart: every
// one, whose adoption is then a no-op beside the catch-up of its tasks).
func (a *Adopter) discover(ctx context.Context) {
	for _, s := range a.opts.Specs {
		versions := []int32{s.Version}
		if s.Version == 0 {
			def, err := a.runs.conductor.WorkflowDef(ctx, s.Name, 0)
			if err != nil {
				a.log.Debug("could not read an adopted definition", zap.String("adopt", s.String()), zap.Error(err))
				continue
			}
			versions = versions[:0]
			for v := int32(1); v <= def.Version; v++ {
				versions = append(versions, v)
			}
		}
		for _, v := range versions {
			ids, err := a.runs.conductor.RunningWorkflows(ctx, s.Name, v)
			if err != nil {
				a.log.Debug("could not list an adopted definition's running workflows", zap.String("adopt", s.String()), zap.Error(err))
				continue
			}
			for _, id := range ids {
				a.mu.Lock()
				_, known := a.known[id]
				_, isForeign := a.foreign[id]
				a.mu.Unlock()
				if known || isForeign || !a.opts.Owner.Owns(id) {
					continue
				}
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				switch err := a.Ensure(rctx, id); {
				case errors.Is(err, ErrNotFound):
					// Not adopted (another task domain, a plan run's):
					// remembered, not read again.
					a.log.Debug("a running workflow of an adopted definition is not adopted", zap.String("workflowId", id), zap.Error(err))
				case err != nil:
					a.log.Warn("could not adopt a workflow; trying again", zap.String("workflowId", id), zap.Error(err))
				}
				cancel()
			}
		}
	}
}
