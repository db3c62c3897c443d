package drain_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// wait waits for ch, with a deadline that only a hang reaches.
func wait(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(2 * time.Minute):
		t.Fatalf("timed out after 2m waiting for %s", what)
	}
}

func randomSuffix(t *testing.T) string {
	t.Helper()
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// staleCallCase is one order of concurrent requests in which a request's
// call to Conductor lands after a later request's.
type staleCallCase struct {
	name string
	// before brings the run to where the case starts.
	before []func(context.Context, *drain.Controller, string) error
	// stale is the request whose call (staleCall: "pause" or "resume") is
	// held until between's requests have answered.
	stale     func(context.Context, *drain.Controller, string) error
	staleCall string
	between   []func(context.Context, *drain.Controller, string) error
	// settleCall is the call the stale request's settle makes once its own
	// call landed: held while the follower checks. window is Conductor's
	// status meanwhile, want the run's status at the end, in the log and
	// in Conductor.
	settleCall, window, want string
}

func pauseRun(ctx context.Context, c *drain.Controller, runID string) error {
	_, err := c.Pause(ctx, runID, drain.PauseRequest{Reason: "test"})
	return err
}

func resumeRun(ctx context.Context, c *drain.Controller, runID string) error {
	_, err := c.Resume(ctx, runID, drain.ResumeRequest{Reason: "test"})
	return err
}

func pauseMany(ctx context.Context, c *drain.Controller, runID string) error {
	return c.PauseMany(ctx, []string{runID}, drain.PauseRequest{Reason: "test"})[0].Err
}

// staleCallCases are the orders of requests in which one request's call
// lands after a later request's, run in one process and across two
// replicas.
var staleCallCases = []staleCallCase{{
	name:   "a resume lands after a later pause",
	before: []func(context.Context, *drain.Controller, string) error{pauseRun},
	stale:  resumeRun, staleCall: "resume",
	between:    []func(context.Context, *drain.Controller, string) error{pauseRun},
	settleCall: "pause", window: drain.EngineRunning, want: drain.EnginePaused,
}, {
	name:   "a pause lands after a later resume, pause and resume",
	before: []func(context.Context, *drain.Controller, string) error{pauseRun, resumeRun},
	stale:  pauseRun, staleCall: "pause",
	between:    []func(context.Context, *drain.Controller, string) error{resumeRun, pauseRun, resumeRun},
	settleCall: "resume", window: drain.EnginePaused, want: drain.EngineRunning,
}, {
	name:   "a bulk pause lands after a later resume, pause and resume",
	before: []func(context.Context, *drain.Controller, string) error{pauseRun, resumeRun},
	stale:  pauseMany, staleCall: "pause",
	between:    []func(context.Context, *drain.Controller, string) error{resumeRun, pauseRun, resumeRun},
	settleCall: "resume", window: drain.EnginePaused, want: drain.EngineRunning,
}}

// TestFollower_StaleCallOfAConcurrentRequestIsNotTakenForConductor:
// concurrent pauses and resumes of a run, one of whose calls reaches
// Conductor after a later request's, must end as the log says, with no
// pause or resume put down to Conductor. On the real Conductor behind a
// proxy that holds chosen calls, with the log on embedded JetStream:
//
//  1. a request (pause or resume) is recorded; its call to Conductor is
//     held;
//  2. later requests are recorded and reach Conductor, and note the
//     engine ledger;
//  3. the held call lands: Conductor's workflow is as the log was before
//     step 2. The request's settle reads the log and applies it to
//     Conductor; that call is held;
//  4. the follower checks the run now, as the watcher would: ledger and
//     log agree, Conductor differs. Nobody acted in Conductor.
//
// Then everything is let through, and the follower checks again.
func TestFollower_StaleCallOfAConcurrentRequestIsNotTakenForConductor(t *testing.T) {
	for _, tc := range staleCallCases {
		t.Run(tc.name, func(t *testing.T) { staleCall(t, tc, false) })
	}
}

// TestFollower_StaleCallOfAnotherReplicasRequestIsNotTakenForConductor:
// the same orders of requests across two replicas sharing one log and
// one engine ledger: the stale request goes through replica 1's
// Controller, the later requests and the follower's checks through
// replica 2's, each replica with its own requests under way (Calls).
// Replica 2 knows nothing of replica 1's request when it checks the run
// in the late call's window; the run must still end as the log says,
// with nothing put down to Conductor. An action then taken in Conductor
// is recorded once the difference has lasted the follower's grace.
func TestFollower_StaleCallOfAnotherReplicasRequestIsNotTakenForConductor(t *testing.T) {
	for _, tc := range staleCallCases {
		t.Run(tc.name, func(t *testing.T) { staleCall(t, tc, true) })
	}
}

// raceEnv is one sidecar process's drain on a run of the real Conductor,
// reached through a holdingConductor, with the log on embedded JetStream.
type raceEnv struct {
	hc        *conductortest.Holding
	client    *adapter.Client
	store     *natsstore.Store
	emit      *registry.Emitter
	c         *drain.Controller
	f         *drain.Follower
	runID, wf string
	// c2 is the Controller of the follower's replica: c itself, or
	// another replica's (newReplicasEnv).
	c2 *drain.Controller
	// clock is the follower's clock: the time now plus advance.
	clock *testClock
}

// testClock is time.Now moved on by the test.
type testClock struct {
	mu      sync.Mutex
	advance time.Duration
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.advance)
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.advance += d
	c.mu.Unlock()
}

func newRaceEnv(t *testing.T) *raceEnv {
	t.Helper()
	return newRaceEnvWith(t, nil)
}

// newRaceEnvWith is newRaceEnv whose Follower reads the log and the
// engine ledger through wrap (nil: directly).
func newRaceEnvWith(t *testing.T, wrap func(drain.SnapshotReader, drain.EngineLedger) (drain.SnapshotReader, drain.EngineLedger)) *raceEnv {
	t.Helper()
	return newEnv(t, wrap, false)
}

// newReplicasEnv is newRaceEnv with two replicas on one log and one
// engine ledger: c is replica 1's Controller, c2 and f replica 2's, and
// each replica has its own requests under way (Calls).
func newReplicasEnv(t *testing.T) *raceEnv {
	t.Helper()
	return newEnv(t, nil, true)
}

func newEnv(t *testing.T, wrap func(drain.SnapshotReader, drain.EngineLedger) (drain.SnapshotReader, drain.EngineLedger), replicas bool) *raceEnv {
	t.Helper()
	ctx := context.Background()
	e := &raceEnv{}
	var base string
	e.hc, base = conductortest.NewHolding(t)
	var err error
	logger := zaptest.NewLogger(t)

	js, _ := natstest.Start(t)
	if e.store, err = natsstore.Open(ctx, js, natsstore.Options{Logger: logger}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.store.Close() })
	reg, err := registry.Open(ctx, js, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.emit = registry.NewEmitter(reg, e.store)
	// Held calls wait for the test: the client's timeout is a safety net.
	if e.client, err = adapter.NewClient(adapter.ClientOptions{BaseURL: base, Timeout: 3 * time.Minute, Logger: logger}); err != nil {
		t.Fatal(err)
	}
	sfx := randomSuffix(t)
	runs, err := adapter.OpenRuns(ctx, js, e.client, e.emit, adapter.RunsOptions{TaskDomain: "drain-test-" + sfx, LeaseTTL: 7 * time.Minute, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	compiled, err := plan.Compile(&plan.Plan{PlanID: "drain-race-" + sfx, PlanVersion: "1",
		Steps: []plan.Step{{StepID: "step-1", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}}})
	if err != nil {
		t.Fatal(err)
	}
	// Nobody polls the test's task domain: the workflow stays RUNNING.
	started, err := runs.StartRun(ctx, adapter.StartRequest{TenantID: "t", ProjectID: "p", EnvironmentID: "e", RunRequestID: "req", Plan: compiled})
	if err != nil {
		t.Fatal(err)
	}
	e.runID, e.wf = started.Run.RunID, started.Run.WorkflowID
	t.Cleanup(func() { _ = e.client.Terminate(context.Background(), e.wf, "test done") })

	keys, err := drain.OpenKeys(ctx, js, drain.KeysOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The Controller and the Follower of one process share its Calls.
	calls := drain.NewCalls()
	e.c = drain.New(e.store, e.emit, e.client, drain.Options{Ledger: keys, Drains: keys, Calls: calls, Logger: logger})
	e.c2 = e.c
	if replicas {
		calls = drain.NewCalls()
		e.c2 = drain.New(e.store, e.emit, e.client, drain.Options{Ledger: keys, Drains: keys, Calls: calls, Logger: logger})
	}
	var snaps drain.SnapshotReader = e.store
	var ledger drain.EngineLedger = keys
	if wrap != nil {
		snaps, ledger = wrap(snaps, ledger)
	}
	e.clock = &testClock{}
	// One process is alone: its Calls sees every request. Two replicas
	// are not.
	var alone func() bool
	if !replicas {
		alone = func() bool { return true }
	}
	e.f = drain.NewFollower(snaps, e.emit, e.client, ledger, drain.FollowerOptions{Calls: calls, Drains: keys, Alone: alone, Logger: logger, Now: e.clock.Now})
	return e
}

// status is the run's status in the log and its workflow's in Conductor.
func (e *raceEnv) status(t *testing.T) (inLog, inConductor string) {
	t.Helper()
	snap, err := e.store.ProjectSnapshot(context.Background(), e.runID)
	if err != nil {
		t.Fatal(err)
	}
	wf, err := e.client.WorkflowStatus(context.Background(), e.wf)
	if err != nil {
		t.Fatal(err)
	}
	return snap.Status, wf
}

// staleCall runs tc in one process, or across two replicas: the stale
// request through replica 1, the others and the follower through
// replica 2.
func staleCall(t *testing.T, tc staleCallCase, replicas bool) {
	ctx := context.Background()
	e := newRaceEnv(t)
	if replicas {
		e = newReplicasEnv(t)
	}
	hc, client, store, c, f, runID, wf := e.hc, e.client, e.store, e.c, e.f, e.runID, e.wf

	for i, req := range tc.before {
		if err := req(ctx, c, runID); err != nil {
			t.Fatalf("request %d before: %v", i+1, err)
		}
	}
	// 1. The request whose call to Conductor is held.
	stale := hc.HoldNext(tc.staleCall)
	staleDone := make(chan error, 1)
	go func() { staleDone <- tc.stale(ctx, c, runID) }()
	wait(t, "the stale call", stale.Entered)
	// 2. Later requests, which reach Conductor first.
	for i, req := range tc.between {
		if err := req(ctx, e.c2, runID); err != nil {
			t.Fatalf("request %d in between: %v", i+1, err)
		}
	}
	// 3. The stale call lands; the settle's call after it is held.
	settle := hc.HoldNext(tc.settleCall)
	stale.Let()
	wait(t, "the stale call to land", stale.Done)
	wait(t, "the settle's call", settle.Entered)

	// 4. The follower checks the run in that window.
	status, err := client.WorkflowStatus(ctx, wf)
	if err != nil {
		t.Fatal(err)
	}
	if status != tc.window {
		t.Fatalf("Conductor's workflow is %s in the window, want %s (the stale call landed)", status, tc.window)
	}
	if _, err := f.Saw(ctx, runID, wf, status); err != nil {
		t.Fatalf("follower: %v", err)
	}

	settle.Let()
	select {
	case err := <-staleDone:
		if err != nil {
			t.Fatalf("the stale request: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("timed out after 2m waiting for the stale request to return")
	}
	// A later check, with nothing under way, finds nothing to do.
	if status, err = client.WorkflowStatus(ctx, wf); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Saw(ctx, runID, wf, status); err != nil {
		t.Fatalf("follower: %v", err)
	}

	recs, err := store.Fetch(ctx, runID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	snap, alerts := statestore.Reduce(nil, recs)
	if len(alerts) != 0 {
		t.Fatalf("the log has an invalid transition: %s", alerts[0].Reason)
	}
	byConductor := storetest.RequestedBy(recs, statestore.RequestedByConductor)
	if status, err = client.WorkflowStatus(ctx, wf); err != nil {
		t.Fatal(err)
	}
	if len(byConductor) > 0 || snap.Status != tc.want || status != tc.want {
		t.Fatalf("put down to Conductor, which nobody used: %v; the run ends %s in the log and %s in Conductor, want %s in both (a concurrent request changed the run's outcome)",
			byConductor, snap.Status, status, tc.want)
	}

	// Once the requests are done, an action taken in Conductor is still
	// recorded as such, at the first check.
	act, want := client.Resume, drain.FollowConductorResumed
	if tc.want == drain.EngineRunning {
		act, want = client.Pause, drain.FollowConductorPaused
	}
	if err := act(ctx, wf); err != nil {
		t.Fatal(err)
	}
	if status, err = client.WorkflowStatus(ctx, wf); err != nil {
		t.Fatal(err)
	}
	if replicas {
		// Another replica's request may still have a call landing: the
		// first check remembers the difference, a check a grace later
		// records it.
		if did, err := f.Saw(ctx, runID, wf, status); err != nil || did != "" {
			t.Fatalf("the first check after an action in Conductor (%s) did %q (%v), want nothing before the grace", status, did, err)
		}
		e.clock.Advance(drain.DefaultGrace)
	}
	if did, err := f.Saw(ctx, runID, wf, status); err != nil || did != want {
		t.Fatalf("a check after an action in Conductor (%s) did %q (%v), want %q", status, did, err, want)
	}
}

// TestFollower_ConvergeRacedByAResume: the follower applies to Conductor a
// pause the log holds and Conductor does not (its call never reached
// Conductor); a resume recorded meanwhile reaches Conductor before the
// follower's pause. When the follower's check returns, Conductor is as
// the log says (RUNNING): it read the log again after its call.
func TestFollower_ConvergeRacedByAResume(t *testing.T) {
	ctx := context.Background()
	e := newRaceEnv(t)
	snap, err := e.store.ProjectSnapshot(ctx, e.runID)
	if err != nil {
		t.Fatal(err)
	}
	// A pause recorded whose call to Conductor never left.
	timeout := int64(300)
	w, err := statestore.NewEvent(snap.Ref(), statestore.RunPaused, "", 1, 1, statestore.RunPausedPayload{RequestedBy: "ops", DrainTimeoutSeconds: &timeout})
	if err != nil {
		t.Fatal(err)
	}
	w.EmittedAt = time.Now().UTC().Format(time.RFC3339Nano)
	if _, err := e.emit.Emit(ctx, w); err != nil {
		t.Fatal(err)
	}
	converge := e.hc.HoldNext("pause")
	checked := make(chan error, 1)
	go func() {
		_, err := e.f.Saw(ctx, e.runID, e.wf, drain.EngineRunning)
		checked <- err
	}()
	wait(t, "the follower's pause", converge.Entered)
	if _, err := e.c.Resume(ctx, e.runID, drain.ResumeRequest{Reason: "test"}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	converge.Let()
	select {
	case err := <-checked:
		if err != nil {
			t.Fatalf("follower: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("timed out after 2m waiting for the follower's check")
	}
	if inLog, inConductor := e.status(t); inLog != statestore.RunStatusRunning || inConductor != drain.EngineRunning {
		t.Fatalf("after the follower's check the run is %s in the log and %s in Conductor, want RUNNING in both", inLog, inConductor)
	}
}

// hooked reads the log and the engine ledger for the Follower, and runs a
// step of the test at a chosen read: before the next ledger read
// (beforeLedger), before the first log read after that (beforeLog).
type hooked struct {
	drain.SnapshotReader
	drain.EngineLedger
	mu           sync.Mutex
	beforeLedger func()
	beforeLog    func()
	ledgerRead   bool
}

// readLedger runs beforeLedger, once, before a read of the ledger.
func (h *hooked) readLedger() {
	h.mu.Lock()
	f := h.beforeLedger
	h.beforeLedger = nil
	h.ledgerRead = true
	h.mu.Unlock()
	if f != nil {
		f()
	}
}

func (h *hooked) EngineState(ctx context.Context, runID string) (bool, int64, error) {
	h.readLedger()
	return h.EngineLedger.EngineState(ctx, runID)
}

func (h *hooked) EngineRevision(ctx context.Context, runID string) (bool, int64, uint64, error) {
	h.readLedger()
	return h.EngineLedger.(drain.RevisionLedger).EngineRevision(ctx, runID)
}

func (h *hooked) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	h.mu.Lock()
	var f func()
	if h.ledgerRead {
		f, h.beforeLog = h.beforeLog, nil
	}
	h.mu.Unlock()
	if f != nil {
		f()
	}
	return h.SnapshotReader.ProjectSnapshot(ctx, runID)
}

// TestFollower_RequestWithinOneCheck: a request that starts and ends
// within one check of the follower can still make the check read
// Conductor in its late call's window. Run paused (cycle 1). The follower
// checks; after its first read and before its read of the ledger, a
// pause of the already paused run (which pauses Conductor's workflow
// again) and a resume start: the resume lands and notes the ledger
// (running, 1), then the pause lands after it (its answer held). The
// follower reads the ledger (running, 1) and Conductor (PAUSED); before
// it reads the log, the pause's answer is let through and the pause's
// settle resumes the workflow and returns. The log says RUNNING: nobody
// acted in Conductor, and the run must end RUNNING.
func TestFollower_RequestWithinOneCheck(t *testing.T) {
	ctx := context.Background()
	var h *hooked
	e := newRaceEnvWith(t, func(s drain.SnapshotReader, l drain.EngineLedger) (drain.SnapshotReader, drain.EngineLedger) {
		h = &hooked{SnapshotReader: s, EngineLedger: l}
		return h, h
	})
	if err := pauseRun(ctx, e.c, e.runID); err != nil {
		t.Fatal(err)
	}
	repause := e.hc.HoldNextAndAnswer("pause")
	repaused := make(chan error, 1)
	h.mu.Lock()
	h.beforeLedger = func() {
		go func() { repaused <- pauseRun(ctx, e.c, e.runID) }()
		wait(t, "the repeated pause's call", repause.Entered)
		if err := resumeRun(ctx, e.c, e.runID); err != nil {
			t.Errorf("resume: %v", err)
		}
		repause.Let()
		wait(t, "the repeated pause to land", repause.Done)
	}
	h.beforeLog = func() {
		// The repeated pause learns it landed; its settle resumes the
		// workflow (RunResumed is in the log) and it returns.
		repause.LetAnswer()
		select {
		case err := <-repaused:
			if err != nil {
				t.Errorf("repeated pause: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Error("timed out after 2m waiting for the repeated pause")
		}
	}
	h.mu.Unlock()
	// The watcher saw the workflow RUNNING: the follower looks.
	if _, err := e.f.Saw(ctx, e.runID, e.wf, drain.EngineRunning); err != nil {
		t.Fatalf("follower: %v", err)
	}
	recs, err := e.store.Fetch(ctx, e.runID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range storetest.RequestedBy(recs, statestore.RequestedByConductor) {
		t.Errorf("%s put down to Conductor, which nobody used", typ)
	}
	if inLog, inConductor := e.status(t); inLog != statestore.RunStatusRunning || inConductor != drain.EngineRunning {
		t.Fatalf("the run ends %s in the log and %s in Conductor, want RUNNING in both", inLog, inConductor)
	}
}

// TestFollower_NoConvergeWhileARequestIsUnderWay: the follower checks a
// run while a pause of it is under way (recorded, its call to Conductor
// not landed yet). The log says PAUSED and the engine ledger still holds
// the state before: the pause's own call has not reached Conductor, and
// its settle applies whatever the log says once it lands. The follower
// must leave the run to it. If it applied the log's state itself, its
// call could land after a resume recorded meanwhile had answered, and
// Conductor would show PAUSED under a RUNNING log with no request under
// way (its own settle repairs that only after one more call).
func TestFollower_NoConvergeWhileARequestIsUnderWay(t *testing.T) {
	ctx := context.Background()
	e := newRaceEnv(t)
	if err := pauseRun(ctx, e.c, e.runID); err != nil {
		t.Fatal(err)
	}
	if err := resumeRun(ctx, e.c, e.runID); err != nil {
		t.Fatal(err)
	}
	// A pause recorded; its call held before it reaches Conductor.
	first := e.hc.HoldNext("pause")
	paused := make(chan error, 1)
	go func() { paused <- pauseRun(ctx, e.c, e.runID) }()
	wait(t, "the pause's call", first.Entered)
	// The watcher saw the workflow RUNNING: the follower looks.
	converge := e.hc.HoldNext("pause")
	checked := make(chan error, 1)
	go func() {
		_, err := e.f.Saw(ctx, e.runID, e.wf, drain.EngineRunning)
		checked <- err
	}()
	converged := false
	select {
	case err := <-checked:
		if err != nil {
			t.Fatalf("follower: %v", err)
		}
	case <-converge.Entered:
		converged = true
	case <-time.After(2 * time.Minute):
		t.Fatal("timed out after 2m waiting for the follower's check")
	}
	// A resume is recorded and answers; then the pause lands, and its
	// settle applies the log (RUNNING).
	if err := resumeRun(ctx, e.c, e.runID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	first.Let()
	select {
	case err := <-paused:
		if err != nil {
			t.Fatalf("pause: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("timed out after 2m waiting for the pause")
	}
	if converged {
		// Both requests answered. The follower's call lands; its own
		// settle's call is held to show what Conductor is left with.
		settle := e.hc.HoldNext("resume")
		converge.Let()
		wait(t, "the follower's call to land", converge.Done)
		if inLog, inConductor := e.status(t); inLog != statestore.RunStatusRunning || inConductor != drain.EngineRunning {
			t.Errorf("with no request under way the run is %s in the log and %s in Conductor: the follower applied a pause state it read while a pause was under way", inLog, inConductor)
		}
		settle.Let()
		if err := <-checked; err != nil {
			t.Fatalf("follower: %v", err)
		}
	}
	if inLog, inConductor := e.status(t); inLog != statestore.RunStatusRunning || inConductor != drain.EngineRunning {
		t.Fatalf("the run ends %s in the log and %s in Conductor, want RUNNING in both", inLog, inConductor)
	}
}
