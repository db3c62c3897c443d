package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// replicaPair is two serve replicas on one NATS cluster, each reaching the
// shared Conductor through a proxy of its own that can hold its pause and
// resume calls.
type replicaPair struct {
	reps [2]*proc
	hold [2]*conductortest.Holding
	// workflow is each run's Conductor workflow id.
	workflow map[string]string
}

// startReplicaPair starts the two replicas and waits until each counts
// both live and neither can take itself for alone any more (it joined
// more than the 10 s a replica may not know the others yet).
func startReplicaPair(t *testing.T) *replicaPair {
	t.Helper()
	cl := startNATSCluster(t)
	url := cl.url(t)
	domain := uniq("e2e-twor")
	rp := &replicaPair{workflow: map[string]string{}}
	for i := range rp.reps {
		h, base := conductortest.NewHolding(t)
		rp.hold[i] = h
		rp.reps[i] = newProc(sidecartest.Start(t, sidecartest.Options{ConductorURL: base,
			Args: []string{"--nats-url", url, "--nats-replicas", "3", "--task-domain", domain}}))
	}
	sidecartest.WaitFor(t, "both replicas to count two live replicas", 2*time.Minute, func() bool {
		for _, p := range rp.reps {
			if metricValue(t, p.addr, "sidecar_members_live") != 2 {
				return false
			}
		}
		return true
	})
	time.Sleep(12 * time.Second) // past the 10 s after its join a replica still takes itself for maybe alone
	return rp
}

// startHeld starts n runs of one sleep step through the replicas in turn
// and waits until each step has started.
func (rp *replicaPair) startHeld(t *testing.T, prefix string, n int) []string {
	t.Helper()
	pl := &plan.Plan{PlanID: uniq(prefix), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "long", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 600}},
	}}
	var runs []string
	for i := range n {
		s := submit(t, rp.reps[i%2], pl, fmt.Sprintf("req-%d", i))
		runs = append(runs, s.RunID)
		wf := s.WorkflowID
		rp.workflow[s.RunID] = wf
		t.Cleanup(func() { _, _ = conductorTry(t, "DELETE", "/workflow/"+wf+"?reason=test+done", "") })
	}
	for _, id := range runs {
		sidecartest.WaitFor(t, "the step of "+id+" to start", 2*time.Minute, func() bool {
			return eventIndex(allEvents(t, rp.reps[0], id), statestore.StepStarted, "long", 0) >= 0
		})
	}
	return runs
}

// noneByConductor fails the test if a pause or resume of run was put down
// to Conductor: nobody used Conductor's API.
func (rp *replicaPair) noneByConductor(t *testing.T, when, runID string) {
	t.Helper()
	if got := storetest.RequestedBy(allEvents(t, rp.reps[0], runID), statestore.RequestedByConductor); len(got) > 0 {
		t.Fatalf("%s: run %s: %v put down to Conductor, which nobody used", when, runID, got)
	}
}

// inStep fails the test unless the run's log and Conductor say the same
// (PAUSED or RUNNING) and the log's state is the one its last pause or
// resume event, appended by a request, implies.
func (rp *replicaPair) inStep(t *testing.T, when, runID, want string) {
	t.Helper()
	ctx := t.Context()
	v, err := rp.reps[1].client.Run(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	logState := "RUNNING"
	if v.Status == statestore.RunStatusPaused {
		logState = "PAUSED"
	}
	last := ""
	for _, e := range allEvents(t, rp.reps[0], runID) {
		switch e.EventType {
		case statestore.RunPaused:
			last = "PAUSED"
		case statestore.RunResumed:
			last = "RUNNING"
		}
	}
	if want == "" {
		want = last
	}
	got := conductorStatus(t, rp.workflow[runID])
	if logState != want || last != want || got != want {
		t.Fatalf("%s: run %s: the log %s (last pause/resume event: %s), Conductor %s; want %s in both", when, runID, v.Status, last, got, want)
	}
}

// TestE2E_ReplicasPauseNeverChangesTheOutcome: two serve replicas on one
// NATS cluster and the real Conductor; pause and resume requests on the
// same runs, each of a pair through a different replica.
//
//   - a storm: rounds of one pause and one resume per run released
//     together, split across the replicas. Once both have answered, the
//     log and Conductor agree, on the state the last request's event
//     implies, and no answer says Conductor did not answer.
//   - late calls, both ways round: a resume through one replica whose call
//     reaches Conductor after a later pause through the other, its
//     correction held long enough for the run's watcher (on whichever
//     replica follows it) to read Conductor in the window several times.
//     The run ends PAUSED in the log and in Conductor.
//
// Throughout, no pause or resume is put down to Conductor (requestedBy
// conductor): nobody used Conductor's API.
func TestE2E_ReplicasPauseNeverChangesTheOutcome(t *testing.T) {
	t.Parallel() // its own serve and data dir
	rp := startReplicaPair(t)
	runs := rp.startHeld(t, "e2e-twor-storm", 2)
	ctx := t.Context()

	const rounds = 12
	var unavailable atomic.Int32
	for round := range rounds {
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for k, id := range runs {
			pauser, resumer := rp.reps[(round+k)%2], rp.reps[(round+k+1)%2]
			wg.Add(2)
			go func() {
				defer wg.Done()
				<-gate
				if _, err := pauser.client.Pause(ctx, id, 0, "storm"); apiCode(err) == "503 ENGINE_UNAVAILABLE" {
					unavailable.Add(1)
					t.Logf("round %d: pause %s: %v", round, id, err)
				}
			}()
			go func() {
				defer wg.Done()
				<-gate
				if _, err := resumer.client.Resume(ctx, id); apiCode(err) == "503 ENGINE_UNAVAILABLE" {
					unavailable.Add(1)
					t.Logf("round %d: resume %s: %v", round, id, err)
				}
			}()
		}
		close(gate)
		wg.Wait()
		for _, id := range runs {
			rp.inStep(t, fmt.Sprintf("storm round %d", round), id, "")
		}
	}
	for _, id := range runs {
		rp.noneByConductor(t, "after the storm", id)
	}
	// Conductor answered every call: a refusal is an answer, not 503.
	if n := unavailable.Load(); n > 0 {
		t.Errorf("%d answers said Conductor did not answer; it answered every call", n)
	}

	// Late calls: the window held for about four of the watcher's 2 s scans
	// (every run is read at each, there are two), well inside the grace.
	const window = 8 * time.Second
	run := runs[0]
	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(2 * time.Minute):
			t.Fatalf("timed out after 2m waiting for %s", what)
		}
	}
	for late := range 2 {
		first, second := rp.reps[late], rp.reps[1-late]
		when := fmt.Sprintf("late resume through replica %d", late)
		if v, err := first.client.Run(ctx, run); err != nil {
			t.Fatal(err)
		} else if v.Status == statestore.RunStatusPaused {
			if _, err := first.client.Resume(ctx, run); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := first.client.Pause(ctx, run, 0, "first"); err != nil {
			t.Fatal(err)
		}
		held := rp.hold[late].HoldNext("resume")
		resumed := make(chan error, 1)
		go func() {
			_, err := first.client.Resume(ctx, run)
			resumed <- err
		}()
		wait("the resume's call", held.Entered)
		if _, err := second.client.Pause(ctx, run, 0, "second"); err != nil {
			t.Fatal(err)
		}
		settle := rp.hold[late].HoldNext("pause")
		held.Let()
		wait("the resume's call to land", held.Done)
		// Conductor RUNNING, the log PAUSED: the resume's own re-read of
		// the log sends the pause that brings Conductor back; hold it. (A
		// watcher that put the resume down to Conductor before that
		// re-read leaves nothing to bring back: the resume answers first.)
		var answered error
		select {
		case <-settle.Entered:
			time.Sleep(window)
			settle.Let()
			select {
			case answered = <-resumed:
			case <-time.After(2 * time.Minute):
				t.Fatalf("%s: timed out after 2m waiting for the resume", when)
			}
		case answered = <-resumed:
			settle.Let()
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: timed out after 2m waiting for the resume's correcting pause", when)
		}
		if answered != nil {
			t.Logf("%s: resume: %v", when, answered)
		}
		rp.noneByConductor(t, when, run)
		rp.inStep(t, when, run, "PAUSED")
		if _, err := second.client.Resume(ctx, run); err != nil {
			t.Fatal(err)
		}
	}
}

// TestE2E_ReplicasRecordAPauseMadeInConductor: with two replicas live, a
// pause made in Conductor's own API is recorded (RunPaused, requestedBy
// conductor): on a run never paused at the first check, on a run the
// sidecar paused and resumed before once two checks a grace apart saw it
// (docs/drain.md, "Who decides 'Conductor moved'"). The never-paused
// run's pause is made 6 s after the other's and recorded first.
func TestE2E_ReplicasRecordAPauseMadeInConductor(t *testing.T) {
	t.Parallel() // its own serve and data dir
	rp := startReplicaPair(t)
	runs := rp.startHeld(t, "e2e-twor-ui", 2)
	before, never := runs[0], runs[1]
	ctx := context.Background()
	if _, err := rp.reps[0].client.Pause(ctx, before, 0, "before"); err != nil {
		t.Fatal(err)
	}
	if _, err := rp.reps[1].client.Resume(ctx, before); err != nil {
		t.Fatal(err)
	}
	rp.inStep(t, "paused and resumed", before, "RUNNING")

	// serve's grace: its Conductor client's longest pause or resume call
	// (the default timeout and a bulk request's time per workflow), twice,
	// and the re-read between them.
	client, err := adapter.NewClient(adapter.ClientOptions{BaseURL: conductortest.URL(t)})
	if err != nil {
		t.Fatal(err)
	}
	grace := drain.GraceFor(client.LongestPauseCall())
	wf := rp.workflow
	byConductor := func(id string) bool {
		got := storetest.RequestedBy(allEvents(t, rp.reps[0], id), statestore.RequestedByConductor)
		return len(got) == 1 && got[0] == statestore.RunPaused
	}
	paused := time.Now()
	conductorCall(t, "PUT", "/workflow/"+wf[before]+"/pause", "")
	// The never-paused run's pause a few of the watcher's 2 s scans later:
	// recorded first all the same, for it alone waits no grace.
	time.Sleep(6 * time.Second)
	neverPaused := time.Now()
	conductorCall(t, "PUT", "/workflow/"+wf[never]+"/pause", "")

	sidecartest.WaitFor(t, "the pause of the never-paused run to be put down to Conductor", 3*time.Minute, func() bool {
		return byConductor(never)
	})
	neverAfter := time.Since(neverPaused)
	if byConductor(before) {
		t.Fatalf("the pause of the run paused before, made 6 s earlier, was recorded by the time the never-paused run's was (%s after it was made); want it a grace (%s) after it was first seen",
			neverAfter, grace)
	}
	sidecartest.WaitFor(t, "the pause of the run paused before to be put down to Conductor", 3*time.Minute, func() bool {
		return byConductor(before)
	})
	beforeAfter := time.Since(paused)
	if beforeAfter < grace {
		t.Fatalf("the pause of the run paused before was recorded %s after it was made; want at least the grace, %s", beforeAfter, grace)
	}
	t.Logf("recorded after: never paused %s, paused before %s", neverAfter.Round(100*time.Millisecond), beforeAfter.Round(100*time.Millisecond))
	for _, id := range runs {
		v, err := rp.reps[1].client.Run(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if v.Status != statestore.RunStatusPaused {
			t.Fatalf("run %s: the log says %s after a pause in Conductor was recorded", id, v.Status)
		}
	}
}
