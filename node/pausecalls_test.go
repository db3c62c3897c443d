package node

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/membership"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestNode_LateCallIsNotTakenForConductor: serve's drain controller and
// its run watcher's pause follower share the requests under way, so a
// resume whose call reaches Conductor after a later pause's is not
// recorded as a resume made in Conductor by a check of the watcher in
// that window (drain: TestFollower_StaleCallOfAConcurrentRequestIsNotTakenForConductor
// is the rule; this is the node's wiring of it). The node reaches the
// real Conductor through a proxy that holds chosen calls.
func TestNode_LateCallIsNotTakenForConductor(t *testing.T) {
	lateCall(t, false)
}

// TestNode_AnotherReplicasLateCallIsNotTakenForConductor: two serve
// replicas on one NATS. A resume through replica 1 has its call reach
// Conductor after a later pause through replica 2; replica 2's watcher
// checks the run in that window. Replica 2 does not see replica 1's
// request, and knows it is not alone (membership): its follower waits
// for the difference to last its grace, and the run ends PAUSED, with
// nothing put down to Conductor.
func TestNode_AnotherReplicasLateCallIsNotTakenForConductor(t *testing.T) {
	lateCall(t, true)
}

// lateCall is a resume whose call lands after a later pause's, the
// watcher checking the run in the window: the requests and the check
// through one node, or (replicas) the resume through another node on the
// same NATS and Conductor.
func lateCall(t *testing.T, replicas bool) {
	ctx := context.Background()
	hc, base := conductortest.NewHolding(t)
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", Permissions: natsstore.AllPermissions})
	open := func(domain string) (*Node, time.Time) {
		t.Helper()
		cfg := testConfig(t, srv.URL())
		cfg.ConductorURL = base
		if domain != "" {
			cfg.TaskDomain = domain
		}
		n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
		opened := time.Now()
		if err := n.Open(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close(ctx) })
		return n, opened
	}
	n, opened := open("")
	// first is the node of the stale resume: n, or another replica.
	first := n
	if replicas {
		first, _ = open(n.cfg.TaskDomain)
		// n must not take itself for alone by the time its watcher checks:
		// wait until its membership shows both replicas and it joined
		// longer ago than a replica may not know the others yet, so that
		// only the membership keeps it from deciding at once.
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			if live, _ := n.members.Live(); len(live) == 2 && time.Since(opened) > aloneAfter {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("timed out after 2m waiting for the replicas to see each other")
			}
		}
	}
	id := strings.ReplaceAll(filepath.Base(t.TempDir()), "-", "_")
	// One step of an outside worker's task type nobody polls: the workflow
	// stays RUNNING.
	compiled, err := plan.Compile(&plan.Plan{PlanID: "nodetest-late-" + id, PlanVersion: "1",
		Steps: []plan.Step{{StepID: "s1", Executor: plan.ExecutorSpec{Type: plan.ExecutorExternal, TaskType: "nodetest_late_" + id}}}})
	if err != nil {
		t.Fatal(err)
	}
	started, err := n.runs.StartRun(ctx, adapter.StartRequest{TenantID: "t", ProjectID: "p", EnvironmentID: "e", RunRequestID: "req", Plan: compiled})
	if err != nil {
		t.Fatal(err)
	}
	runID, wf := started.Run.RunID, started.Run.WorkflowID
	t.Cleanup(func() { _ = n.conductor.Terminate(context.Background(), wf, "test done") })
	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(2 * time.Minute):
			t.Fatalf("timed out after 2m waiting for %s", what)
		}
	}

	// Alone, the rule is the shared Calls: another replica's requests are
	// covered by the follower's grace, which would hide a missing shared
	// Calls. Wait until the node takes itself for the only replica.
	for deadline := time.Now().Add(2 * time.Minute); !replicas && !n.pauseAlone(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out after 2m waiting for the node to take itself for the only live replica")
		}
	}
	if _, err := first.drain.Pause(ctx, runID, drain.PauseRequest{Reason: "first"}); err != nil {
		t.Fatal(err)
	}
	late := hc.HoldNext("resume")
	resumed := make(chan error, 1)
	go func() {
		_, err := first.drain.Resume(ctx, runID, drain.ResumeRequest{Reason: "resume"})
		resumed <- err
	}()
	wait("the resume's call", late.Entered)
	if _, err := n.drain.Pause(ctx, runID, drain.PauseRequest{Reason: "second"}); err != nil {
		t.Fatal(err)
	}
	settle := hc.HoldNext("pause")
	late.Let()
	wait("the resume's call to land", late.Done)
	wait("the settle's pause", settle.Entered)
	// The watcher checks the run in the window: Conductor RUNNING, the log
	// and the ledger PAUSED in cycle 2.
	if err := n.watcher.Check(ctx, runID); err != nil {
		t.Fatal(err)
	}
	settle.Let()
	select {
	case err := <-resumed:
		if err != nil {
			t.Fatalf("resume: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("timed out after 2m waiting for the resume")
	}
	if err := n.watcher.Check(ctx, runID); err != nil {
		t.Fatal(err)
	}

	recs, err := n.store.Fetch(ctx, runID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := statestore.Reduce(nil, recs)
	byConductor := storetest.RequestedBy(recs, statestore.RequestedByConductor)
	status, err := n.conductor.WorkflowStatus(ctx, wf)
	if err != nil {
		t.Fatal(err)
	}
	if len(byConductor) > 0 || snap.Status != statestore.RunStatusPaused || status != drain.EnginePaused {
		t.Fatalf("put down to Conductor, which nobody used: %v; the run ends %s in the log and %s in Conductor, want PAUSED in both",
			byConductor, snap.Status, status)
	}
	if replicas {
		return // an action in Conductor is recorded a grace later (drain's tests)
	}
	// Alone, an action then taken in Conductor is recorded at the first
	// check.
	if err := n.conductor.Resume(ctx, wf); err != nil {
		t.Fatal(err)
	}
	if err := n.watcher.Check(ctx, runID); err != nil {
		t.Fatal(err)
	}
	if recs, err = n.store.Fetch(ctx, runID, 0, 0); err != nil {
		t.Fatal(err)
	}
	if got := storetest.RequestedBy(recs, statestore.RequestedByConductor); len(got) != 1 || got[0] != statestore.RunResumed {
		t.Fatalf("after a resume in Conductor and one check, put down to Conductor: %v, want [RunResumed]", got)
	}
}

// TestAlone: serve's follower takes its replica for the only live one
// only when the membership lists nothing else and it joined aloneAfter
// ago or more: until a heartbeat of each other replica has arrived since
// the join, the membership may not list them yet.
func TestAlone(t *testing.T) {
	js, _ := natstest.Start(t)
	m, err := membership.Open(context.Background(), js, membership.Options{Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, unknown := m.Live(); !unknown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out after 2m waiting for the membership to know the members")
		}
	}
	if alone(m, time.Now())() {
		t.Fatal("a replica that has just joined takes itself for alone")
	}
	if !alone(m, time.Now().Add(-aloneAfter))() {
		t.Fatal("a replica alone since aloneAfter does not take itself for alone")
	}
}
