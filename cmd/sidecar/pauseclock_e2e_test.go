package main

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_PauseOutlastsTheStepTimeouts: a run paused for longer than its
// steps' timeouts (a step in flight at the pause, and one Conductor had
// scheduled but the gate kept handing back while paused) resumes to
// COMPLETED with every step at attempt 1 and one Conductor task per step:
// the pause costs no timeout and no retry (issue #14 §6).
func TestE2E_PauseOutlastsTheStepTimeouts(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t))
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-pause-clock")+`","planVersion":"1","steps":[
		{"stepId":"a","executor":{"type":"sleep","seconds":1.5},"timeoutSeconds":3,"retries":{"engineTries":2}},
		{"stepId":"b","executor":{"type":"noop"},"timeoutSeconds":2,"retries":{"engineTries":2}},
		{"stepId":"c","executor":{"type":"sleep","seconds":0.5},"timeoutSeconds":2,"dependsOn":["a","b"],"retries":{"engineTries":2}}]}`)
	started := submit(t, p, pl, uniq("req"))
	ctx := context.Background()
	waitFor(t, "step a to start", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "a", 0) >= 0
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
		} `json:"tasks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&wf); err != nil {
		t.Fatal(err)
	}
	for _, task := range wf.Tasks {
		if task.RetryCount != 0 || task.Status != "COMPLETED" {
			t.Errorf("Conductor task %s: %s, retryCount %d; want COMPLETED at its first try", task.Ref, task.Status, task.RetryCount)
		}
	}
}
