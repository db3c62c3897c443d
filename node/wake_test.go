package node

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// The resumes of the control API wake the poll loops, bulk ones included.
var _ httpapi.BulkControl = wakingControl{}

// TestNode_StartThroughTheAPIWakesIdleLoops: a run started through the
// API after the poll loops backed off to long pauses starts its first
// step at once (the start wakes the loops), not when the loop's pause
// ends. Here the pauses double from 100 ms without bound in sight: 13 s
// after Open the noop loop's pending pause ends 25 s after Open.
func TestNode_StartThroughTheAPIWakesIdleLoops(t *testing.T) {
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-wake-pw", Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	cfg.PollIntervalMax = time.Hour
	n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
	ctx := context.Background()
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	opened := time.Now()
	// Polls 0.1+0.2+...+6.4 s apart: the 8th poll comes 12.7 s after the
	// loop began, the 9th 25.5 s after.
	time.Sleep(13 * time.Second)

	body, _ := json.Marshal(httpapi.StartRequest{TenantID: "t", ProjectID: "p", EnvironmentID: "e", RunRequestID: uuid.NewString(),
		Plan: &plan.Plan{PlanID: "wake-" + uuid.NewString()[:8], PlanVersion: "1", Steps: []plan.Step{{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}}}})
	resp, err := http.Post("http://"+cfg.API.Addr().String()+"/v1/runs", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var started httpapi.Started
	err = json.NewDecoder(resp.Body).Decode(&started)
	resp.Body.Close()
	if err != nil || resp.StatusCode/100 != 2 || started.RunID == "" {
		t.Fatalf("start: %d %+v %v", resp.StatusCode, started, err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		snap, err := n.store.ProjectSnapshot(ctx, started.RunID)
		if err == nil {
			if st := snap.Step("a"); st != nil && st.Status != statestore.StepStatusPending {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the run's step did not start within 2 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Without the wake the step waits for the loop's poll 25.5 s after it
	// began (before opened).
	if at := time.Since(opened); at > 24*time.Second {
		t.Fatalf("the step started %v after Open: it waited for the loop's backed-off pause, not the start's wake", at.Round(time.Millisecond))
	}
}

// TestNode_ResumeThroughTheAPIWakesIdleLoops: a run resumed through the
// API after the poll loops backed off to long pauses has its next step
// polled at once (the resume wakes the loops), not when the loop's pause
// ends.
func TestNode_ResumeThroughTheAPIWakesIdleLoops(t *testing.T) {
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-wake-pw", Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	cfg.PollIntervalMax = time.Hour
	cfg.Concurrency = map[string]int{plan.ExecutorNoop: 1, plan.ExecutorSleep: 1}
	n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
	ctx := context.Background()
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	api := httpapi.NewClient("http://" + cfg.API.Addr().String())
	started, err := api.Start(ctx, httpapi.StartRequest{TenantID: "t", ProjectID: "p", EnvironmentID: "e", RunRequestID: uuid.NewString(),
		Plan: &plan.Plan{PlanID: "wake-resume-" + uuid.NewString()[:8], PlanVersion: "1", Steps: []plan.Step{
			{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 2}},
			{StepID: "b", DependsOn: []string{"a"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	// until waits (2 minutes at most) for the run's snapshot to satisfy ok.
	until := func(what string, ok func(*statestore.RunSnapshot) bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if snap, err := n.store.ProjectSnapshot(ctx, started.RunID); err == nil && ok(snap) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	status := func(snap *statestore.RunSnapshot, stepID string) string {
		if st := snap.Step(stepID); st != nil {
			return st.Status
		}
		return ""
	}
	until("step a running", func(s *statestore.RunSnapshot) bool { return status(s, "a") == statestore.StepStatusRunning })
	if _, err := api.Pause(ctx, started.RunID, 120, "test"); err != nil {
		t.Fatal(err)
	}
	until("step a done while paused", func(s *statestore.RunSnapshot) bool {
		return s.Status == statestore.RunStatusPaused && status(s, "a") == statestore.StepStatusSuccess
	})
	// a's outcome woke the loops last: their pauses double from 100 ms
	// again, the 8th poll 12.7 s later, the 9th 25.5 s later.
	quiet := time.Now()
	time.Sleep(13 * time.Second)
	if _, err := api.Resume(ctx, started.RunID); err != nil {
		t.Fatal(err)
	}
	until("step b started", func(s *statestore.RunSnapshot) bool {
		return status(s, "b") != "" && status(s, "b") != statestore.StepStatusPending
	})
	if at := time.Since(quiet); at > 24*time.Second {
		t.Fatalf("step b started %v after the loops' last wake: it waited for the backed-off pause, not the resume's wake", at.Round(time.Millisecond))
	}
}
