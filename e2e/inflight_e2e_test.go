package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// drainEnd returns how long after RunPaused the drain of cycle 1 ended,
// and how (RunDrainCompleted or RunDrainTimedOut), or "" if it has not.
func drainEnd(t *testing.T, evs []statestore.RunEventRecord) (time.Duration, string) {
	t.Helper()
	var paused time.Time
	for _, e := range evs {
		at, _ := time.Parse(time.RFC3339Nano, e.PersistedAt)
		switch e.EventType {
		case statestore.RunPaused:
			paused = at
		case statestore.RunDrainCompleted, statestore.RunDrainTimedOut:
			return at.Sub(paused), e.EventType
		}
	}
	return 0, ""
}

// validLog fails if the log raises an invalid-transition alert.
func validLog(t *testing.T, evs []statestore.RunEventRecord) {
	t.Helper()
	if _, alerts := statestore.Reduce(nil, evs); len(alerts) != 0 {
		t.Fatalf("the log raises %d alerts, first %+v\n%v", len(alerts), alerts[0], types(evs))
	}
}

// TestE2E_DrainEndsWhenAnEngineTryFails: a step with engineTries 2 is
// paused mid-try; the try fails (Conductor would retry it), so nothing of
// the run is running any more. The drain ends then, with the reason in the
// log (RunStepTryEnded), not at the drain timeout (it paged after the whole
// timeout before). After RESUME the retry runs and the run
// completes with a valid log.
func TestE2E_DrainEndsWhenAnEngineTryFails(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	marker := filepath.Join(t.TempDir(), "tried")
	pl := &plan.Plan{PlanID: uniq("e2e-tryfail"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "flaky", Retries: plan.RetryPolicy{EngineTries: 2},
			Executor: plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c",
				"if [ -e " + marker + " ]; then exit 0; fi; touch " + marker + "; sleep 2; exit 1"}}},
	}}
	started := submit(t, p, pl, "req-1")
	sidecartest.WaitFor(t, "flaky to start", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "flaky", 0) >= 0
	})
	if code, out, errOut := sidecartest.Run(t, "pause", started.RunID, "--timeout", "20s", "--server", "http://"+p.addr); code != 0 {
		t.Fatalf("pause: exit %d\n%s%s", code, out, errOut)
	}
	sidecartest.WaitFor(t, "the drain to end", 30*time.Second, func() bool {
		_, how := drainEnd(t, allEvents(t, p, started.RunID))
		return how != ""
	})
	evs := allEvents(t, p, started.RunID)
	took, how := drainEnd(t, evs)
	if how != statestore.RunDrainCompleted {
		t.Fatalf("drain ended with %s after %s, want RunDrainCompleted once the try failed\n%v", how, took, types(evs))
	}
	if took > 10*time.Second {
		t.Fatalf("drain took %s (the try fails 2 s in): it waited for a step that was not running", took)
	}
	i := eventIndex(evs, statestore.RunStepTryEnded, "", 0)
	if i >= 0 {
		t.Logf("drain ended %s after RunPaused, %s after the try ended", took, sinceEvent(evs, i, statestore.RunDrainCompleted))
	}
	if i < 0 || !strings.Contains(string(evs[i].Payload), `"engineTryFailed"`) || !strings.Contains(string(evs[i].Payload), `"flaky"`) {
		t.Fatalf("RunStepTryEnded with reason engineTryFailed for step flaky expected\n%v", types(evs))
	}
	if _, err := p.client.Resume(t.Context(), started.RunID); err != nil {
		t.Fatal(err)
	}
	if v := waitTerminal(t, p, started.RunID, 60*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s after resume, want COMPLETED", v.Status)
	}
	evs = allEvents(t, p, started.RunID)
	validLog(t, evs)
	if eventIndex(evs, statestore.RunStepTryStarted, "", 0) < 0 {
		t.Fatalf("the retry's start is not in the log\n%v", types(evs))
	}
}

// TestE2E_DrainEndsAfterKillWhileDraining: kill -9 while draining; the
// restart hands the run's task back, so nothing runs: the drain ends at
// once, not at its timeout (status said "Waiting for 6 in-flight tasks"
// until the timeout before).
func TestE2E_DrainEndsAfterKillWhileDraining(t *testing.T) {
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	p := startServe(t, dataDir, addr)
	pl := &plan.Plan{PlanID: uniq("e2e-killdrain"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "long", Executor: plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sleep", "60"}}},
	}}
	started := submit(t, p, pl, "req-1")
	sidecartest.WaitFor(t, "long to start", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "long", 0) >= 0
	})
	if code, out, errOut := sidecartest.Run(t, "pause", started.RunID, "--timeout", "40s", "--server", "http://"+p.addr); code != 0 {
		t.Fatalf("pause: exit %d\n%s%s", code, out, errOut)
	}
	p.stop(syscall.SIGKILL)
	p2 := startServe(t, dataDir, addr)
	sidecartest.WaitFor(t, "the drain to end", 45*time.Second, func() bool {
		_, how := drainEnd(t, allEvents(t, p2, started.RunID))
		return how != ""
	})
	evs := allEvents(t, p2, started.RunID)
	if took, how := drainEnd(t, evs); how != statestore.RunDrainCompleted || took > 30*time.Second {
		t.Fatalf("drain ended with %s after %s, want RunDrainCompleted soon after the restart\n%v", how, took, types(evs))
	}
	i := eventIndex(evs, statestore.RunStepTryEnded, "", 0)
	if i >= 0 {
		t.Logf("drain ended %s after the restart handed the task back", sinceEvent(evs, i, statestore.RunDrainCompleted))
	}
	if i < 0 || !strings.Contains(string(evs[i].Payload), `"workerRestarted"`) {
		t.Fatalf("RunStepTryEnded with reason workerRestarted expected\n%v", types(evs))
	}
	validLog(t, evs)
	if _, err := p2.client.Cancel(t.Context(), started.RunID, "test done"); err != nil {
		t.Fatal(err)
	}
}

// sinceEvent is the time from evs[i] to the first later event of type et.
func sinceEvent(evs []statestore.RunEventRecord, i int, et string) time.Duration {
	from, _ := time.Parse(time.RFC3339Nano, evs[i].PersistedAt)
	for _, e := range evs[i:] {
		if e.EventType == et {
			at, _ := time.Parse(time.RFC3339Nano, e.PersistedAt)
			return at.Sub(from)
		}
	}
	return -1
}
