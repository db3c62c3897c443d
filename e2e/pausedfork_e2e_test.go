package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_PausedForkBranchTryFailure: in a fork, a step whose try fails
// while the run is paused (Conductor would retry it) does not fail the
// run. Conductor schedules no retry for a paused workflow but still
// evaluates its JOIN, which fails on a FAILED branch task: the sidecar
// holds the failed try (the task handed back, the failure kept on it)
// while the run is paused and reports it once the run is resumed, when
// Conductor retries it. The run completes, as it does without the pause.
// (On Conductor 3.32 it also needs the compiled JOIN to wait on the NOOP
// after the step, not on the step: docs/plans.md.)
func TestE2E_PausedForkBranchTryFailure(t *testing.T) {
	t.Parallel() // its own serve and data dir
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	marker := filepath.Join(t.TempDir(), "tried")
	pl := &plan.Plan{PlanID: uniq("e2e-forkpause"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "flaky", Retries: plan.RetryPolicy{EngineTries: 2},
			Executor: plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c",
				"if [ -e " + marker + " ]; then exit 0; fi; touch " + marker + "; sleep 2; exit 1"}}},
		{StepID: "other", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
		{StepID: "after", DependsOn: []string{"flaky", "other"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
	}}
	started := submit(t, p, pl, "req-1")
	sidecartest.WaitFor(t, "flaky to start", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "flaky", 0) >= 0
	})
	if code, out, errOut := sidecartest.Run(t, "pause", started.RunID, "--timeout", "30s", "--server", "http://"+p.addr); code != 0 {
		t.Fatalf("pause: exit %d\n%s%s", code, out, errOut)
	}
	sidecartest.WaitFor(t, "the drain to end", 40*time.Second, func() bool {
		_, how := drainEnd(t, allEvents(t, p, started.RunID))
		return how != ""
	})
	if _, how := drainEnd(t, allEvents(t, p, started.RunID)); how != statestore.RunDrainCompleted {
		t.Fatalf("drain ended with %s, want RunDrainCompleted once the try failed", how)
	}
	// Conductor evaluates the JOIN within a second of a branch failing;
	// give it several while the run stays paused, longer than the worker's
	// hand-back delay (5 s), so the held task comes back while paused too.
	time.Sleep(12 * time.Second)
	if s := conductorStatus(t, started.WorkflowID); s != "PAUSED" {
		t.Fatalf("Conductor workflow %s while the run is paused, want PAUSED", s)
	}
	if _, err := p.client.Resume(t.Context(), started.RunID); err != nil {
		t.Fatal(err)
	}
	v := waitTerminal(t, p, started.RunID, 90*time.Second)
	evs := allEvents(t, p, started.RunID)
	if v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s after a paused branch's try failed, want COMPLETED\n%v\n%s", v.Status, types(evs), conductorTasks(t, started.WorkflowID))
	}
	validLog(t, evs)
	if count(evs, statestore.StepCompleted, "flaky") != 1 || count(evs, statestore.StepCompleted, "after") != 1 {
		t.Fatalf("flaky and after must complete once each\n%v", types(evs))
	}
}

// TestE2E_ConcurrentPauseAndResume: rounds of one pause and one resume of
// the same run released together, on the real Conductor. Once both have
// answered, Conductor's workflow is as the log says (PAUSED or RUNNING),
// whichever order the two calls reached it in; no pause or resume is put
// down to Conductor (requestedBy conductor): nobody used Conductor; and no
// answer says Conductor did not answer: it answered every call.
func TestE2E_ConcurrentPauseAndResume(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	pl := &plan.Plan{PlanID: uniq("e2e-pauseresume"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "long", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 600}},
	}}
	started := submit(t, p, pl, "req-1")
	t.Cleanup(func() { _, _ = p.client.Cancel(context.Background(), started.RunID, "test done") })
	sidecartest.WaitFor(t, "long to start", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "long", 0) >= 0
	})
	ctx := t.Context()
	var unavailable atomic.Int32
	for round := range 200 {
		var wg sync.WaitGroup
		gate := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-gate
			if _, err := p.client.Pause(ctx, started.RunID, 0, "storm"); apiCode(err) == "503 ENGINE_UNAVAILABLE" {
				unavailable.Add(1)
				t.Logf("round %d: pause: %v", round, err)
			}
		}()
		go func() {
			defer wg.Done()
			<-gate
			if _, err := p.client.Resume(ctx, started.RunID); apiCode(err) == "503 ENGINE_UNAVAILABLE" {
				unavailable.Add(1)
				t.Logf("round %d: resume: %v", round, err)
			}
		}()
		close(gate)
		wg.Wait()
		v, err := p.client.Run(ctx, started.RunID)
		if err != nil {
			t.Fatal(err)
		}
		want := "RUNNING"
		if v.Status == statestore.RunStatusPaused {
			want = "PAUSED"
		}
		if got := conductorStatus(t, started.WorkflowID); got != want {
			t.Fatalf("round %d: Conductor %s, the log %s, once both requests answered", round, got, v.Status)
		}
	}
	// Conductor answered every call: a refusal is an answer, not 503
	// "Conductor did not answer" (which sends operators to Conductor by hand).
	if n := unavailable.Load(); n > 0 {
		t.Errorf("%d answers said Conductor did not answer; it answered every call", n)
	}
	for _, e := range allEvents(t, p, started.RunID) {
		if (e.EventType == statestore.RunPaused || e.EventType == statestore.RunResumed) &&
			strings.Contains(string(e.Payload), `"requestedBy":"conductor"`) {
			t.Fatalf("%s put down to Conductor, which nobody used: %s", e.EventType, e.Payload)
		}
	}
}
