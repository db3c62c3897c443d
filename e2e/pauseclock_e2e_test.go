package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_PauseOutlastsTheStepTimeouts: a run paused for longer than its
// steps' timeouts (a step in flight at the pause, and one Conductor had
// scheduled that waited for a worker slot and that the gate then hands
// back while paused) resumes to COMPLETED with every step at
// attempt 1 and one Conductor task per step: the pause costs no timeout
// and no retry, and the handed-back task is polled once per callback,
// not in a loop.
func TestE2E_PauseOutlastsTheStepTimeouts(t *testing.T) {
	t.Parallel() // its own serve and data dir
	// One sleep at a time: of a and b, the one that does not start first
	// waits, scheduled, and is polled (and handed back) only once the
	// other has ended, in the pause.
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--concurrency", "sleep=1")
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-pause-clock")+`","planVersion":"1","steps":[
		{"stepId":"a","executor":{"type":"sleep","seconds":1.5},"timeoutSeconds":3,"retries":{"engineTries":2}},
		{"stepId":"b","executor":{"type":"sleep","seconds":1.5},"timeoutSeconds":3,"retries":{"engineTries":2}},
		{"stepId":"c","executor":{"type":"noop"},"timeoutSeconds":2,"dependsOn":["a","b"],"retries":{"engineTries":2}}]}`)
	started := submit(t, p, pl, uniq("req"))
	ctx := context.Background()
	// a or b starts (the worker takes them in either order); the other
	// waits for the slot.
	waiting := ""
	sidecartest.WaitFor(t, "step a or b to start", 30*time.Second, func() bool {
		evs := allEvents(t, p, started.RunID)
		switch {
		case eventIndex(evs, statestore.StepStarted, "a", 0) >= 0:
			waiting = "s_b"
		case eventIndex(evs, statestore.StepStarted, "b", 0) >= 0:
			waiting = "s_a"
		}
		return waiting != ""
	})
	if _, err := p.client.Pause(ctx, started.RunID, 60, "longer than the steps' timeouts"); err != nil {
		t.Fatal(err)
	}
	// Paused four times the longest step timeout, past several hand-backs.
	time.Sleep(12 * time.Second)
	if v, err := p.client.Run(ctx, started.RunID); err != nil || v.Status != statestore.RunStatusPaused {
		t.Fatalf("after the pause: %+v, %v; want PAUSED", v, err)
	}
	if _, err := p.client.Resume(ctx, started.RunID); err != nil {
		t.Fatal(err)
	}
	if v := waitTerminal(t, p, started.RunID, 60*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s, want COMPLETED", v.Status)
	}
	evs := allEvents(t, p, started.RunID)
	for _, e := range evs {
		if e.StepID != "" && (e.LogicalAttemptID != 1 || e.EngineAttemptID != 1) {
			t.Errorf("%s of step %s at attempt %d.%d, want 1.1", e.EventType, e.StepID, e.LogicalAttemptID, e.EngineAttemptID)
		}
	}
	for _, step := range []string{"a", "b", "c"} {
		if count(evs, statestore.StepCompleted, step) != 1 {
			t.Errorf("step %s: %d StepCompleted", step, count(evs, statestore.StepCompleted, step))
		}
	}
	resp, err := http.Get(conductortest.URL(t) + "/workflow/" + started.WorkflowID + "?includeTasks=true")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var wf struct {
		Tasks []struct {
			Ref        string `json:"referenceTaskName"`
			Status     string `json:"status"`
			RetryCount int    `json:"retryCount"`
			PollCount  int    `json:"pollCount"`
			TaskType   string `json:"taskType"`
		} `json:"tasks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&wf); err != nil {
		t.Fatal(err)
	}
	handedBack := false
	for _, task := range wf.Tasks {
		handedBack = handedBack || (task.Ref == waiting && task.PollCount > 1)
		if task.RetryCount != 0 || task.Status != "COMPLETED" {
			t.Errorf("Conductor task %s: %s, retryCount %d; want COMPLETED at its first try", task.Ref, task.Status, task.RetryCount)
		}
		// A task of the sidecar's that the gate hands back while the run
		// is paused is polled once per callback (5 s), never in a loop:
		// over 12 s, at most 1 + 12/5 polls and a margin (a pause of a day:
		// 17,280 polls, which no Conductor limit counts). Conductor's own
		// JOIN is evaluated every second by Conductor itself: not ours.
		t.Logf("Conductor task %s (%s): pollCount %d", task.Ref, task.TaskType, task.PollCount)
		if strings.HasPrefix(task.TaskType, "sidecar_") && task.PollCount > 1+12/5+2 {
			t.Errorf("Conductor task %s polled %d times during a 12 s pause: the hand-back does not wait its callback", task.Ref, task.PollCount)
		}
	}
	if !handedBack {
		t.Errorf("%s was not handed back during the pause: the test did not test it", waiting)
	}
}
