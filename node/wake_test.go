package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// idlePause is the poll loops' idle pause in the tests of their wakes:
// every empty poll is followed by this pause
// (Config.PollInterval = PollIntervalMax), so a task that only the
// pause's end would find waits about this long.
const idlePause = time.Minute

// wakeDeadline bounds how long after the loops last polled a woken step
// may take to start: generous for a loaded machine, and far enough below
// idlePause that a step which waited for the pause's end fails.
const wakeDeadline = 45 * time.Second

// openIdle opens a node whose poll loops (noop and sleep, one slot each)
// pause idlePause after every empty poll, with adjust applied to its
// config, and returns it with a client of its control API.
func openIdle(t *testing.T, adjust func(*Config)) (*Node, *httpapi.Client) {
	t.Helper()
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-wake-pw", Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	cfg.PollInterval, cfg.PollIntervalMax = idlePause, idlePause
	cfg.Concurrency = map[string]int{plan.ExecutorNoop: 1, plan.ExecutorSleep: 1}
	if adjust != nil {
		adjust(&cfg)
	}
	n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
	ctx := context.Background()
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	// Every loop sent its first poll, which finds nothing (no run is
	// started yet): a task the test makes pollable from now on is found
	// by a wake, or idlePause after that poll.
	for _, kind := range []string{plan.ExecutorNoop, plan.ExecutorSleep} {
		deadline := time.Now().Add(2 * time.Minute)
		for polls(t, n, plan.TaskType(kind)) < 1 {
			if time.Now().After(deadline) {
				t.Fatalf("the %s loop did not poll within 2 minutes of Open", kind)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return n, httpapi.NewClient("http://" + cfg.API.Addr().String())
}

// polls is how many polls the loops of taskType sent
// (sidecar_worker_polls_total).
func polls(t *testing.T, n *Node, taskType string) float64 {
	t.Helper()
	families, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "sidecar_worker_polls_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "task_type" && l.GetValue() == taskType {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// startPlan starts (or submits) a run of one plan version of steps.
func startPlan(t *testing.T, api *httpapi.Client, name string, steps ...plan.Step) *httpapi.Started {
	t.Helper()
	started, err := api.Start(context.Background(), httpapi.StartRequest{TenantID: "t", ProjectID: "p", EnvironmentID: "e", RunRequestID: uuid.NewString(),
		Plan: &plan.Plan{PlanID: name + "-" + uuid.NewString()[:8], PlanVersion: "1", Steps: steps}})
	if err != nil {
		t.Fatal(err)
	}
	return started
}

// stepStatus is the status of runID's step stepID in the log ("" before
// the run or the step is in it).
func stepStatus(n *Node, runID, stepID string) string {
	snap, err := n.store.ProjectSnapshot(context.Background(), runID)
	if err != nil {
		return ""
	}
	if st := snap.Step(stepID); st != nil {
		return st.Status
	}
	return ""
}

// waitStep waits until runID's step stepID has a status in want, or fails
// the test at deadline with why.
func waitStep(t *testing.T, n *Node, runID, stepID string, deadline time.Time, why string, want ...string) {
	t.Helper()
	waitRun(t, n, runID, deadline, fmt.Sprintf("step %s not in %q: %s", stepID, want, why), func(snap *statestore.RunSnapshot) bool {
		st := snap.Step(stepID)
		return st != nil && slices.Contains(want, st.Status)
	})
}

// waitRun waits until runID's snapshot satisfies ok, or fails the test at
// deadline with why and the run's steps.
func waitRun(t *testing.T, n *Node, runID string, deadline time.Time, why string, ok func(*statestore.RunSnapshot) bool) {
	t.Helper()
	for {
		snap, err := n.store.ProjectSnapshot(context.Background(), runID)
		if err == nil && ok(snap) {
			return
		}
		if time.Now().After(deadline) {
			var steps []string
			if snap != nil {
				for _, st := range snap.Steps {
					steps = append(steps, fmt.Sprintf("%s %s #%d", st.StepID, st.Status, st.LogicalAttemptID))
				}
			}
			t.Fatalf("run %s at the deadline (%v; steps %q): %s", runID, err, steps, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// begun are the statuses of a step that started.
var begun = []string{statestore.StepStatusRunning, statestore.StepStatusSuccess, statestore.StepStatusFailed}

// TestNode_StartThroughTheAPIWakesIdleLoops: a run started through the
// API while the poll loops are idle has its first step polled at once,
// not when the noop loop's pause ends: the start wakes the loops, through
// admission control (its decider wakes them) and without it.
func TestNode_StartThroughTheAPIWakesIdleLoops(t *testing.T) {
	for _, tc := range []struct {
		name      string
		admission Admission
	}{
		{"Admitted", Admission{Limits: admission.Limits{Global: 100}, Policy: admission.Queue}},
		{"NoAdmission", Admission{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opening := time.Now()
			n, api := openIdle(t, func(cfg *Config) { cfg.Admission = tc.admission })
			started := startPlan(t, api, "wake-start", plan.Step{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}})
			waitStep(t, n, started.RunID, "a", opening.Add(wakeDeadline),
				fmt.Sprintf("it waited for the noop loop's %v idle pause, not the start's wake", idlePause), begun...)
			t.Logf("the step started %v after Open began", time.Since(opening).Round(time.Millisecond))
		})
	}
}

// TestNode_ResumeThroughTheAPIWakesIdleLoops: a run resumed through the
// API has its next step polled at once, not when the noop loop's pause
// ends. Step a ends while the run is paused; its outcome wakes the plan's
// loops, which find nothing (Conductor schedules b only once the workflow
// is resumed).
func TestNode_ResumeThroughTheAPIWakesIdleLoops(t *testing.T) {
	n, api := openIdle(t, nil)
	ctx := context.Background()
	started := startPlan(t, api, "wake-resume",
		plan.Step{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 2}},
		plan.Step{StepID: "b", DependsOn: []string{"a"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}})
	waitStep(t, n, started.RunID, "a", time.Now().Add(2*time.Minute), "step a did not start", begun...)
	if _, err := api.Pause(ctx, started.RunID, 120, "test"); err != nil {
		t.Fatal(err)
	}
	waitStep(t, n, started.RunID, "a", time.Now().Add(2*time.Minute), "step a did not end while paused", statestore.StepStatusSuccess)
	ended := time.Now()
	if _, err := api.Resume(ctx, started.RunID); err != nil {
		t.Fatal(err)
	}
	waitStep(t, n, started.RunID, "b", ended.Add(wakeDeadline),
		fmt.Sprintf("after the resume it waited for the noop loop's %v idle pause, not the resume's wake", idlePause), begun...)
	t.Logf("step b started %v after step a ended", time.Since(ended).Round(time.Millisecond))
}

// TestNode_AdmissionReleaseWakesIdleLoops: a run that admission control
// queued has its first step polled at once when the decider releases it
// (capacity freed up), not when the idle loop's pause ends. The queued
// run's noop step is of a type the first run's plan does not use, so the
// first run's outcome wakes only the sleep loop; the first run's start
// woke the noop loop last before the release.
func TestNode_AdmissionReleaseWakesIdleLoops(t *testing.T) {
	n, api := openIdle(t, func(cfg *Config) {
		cfg.Admission = Admission{Limits: admission.Limits{Global: 1}, Policy: admission.Queue}
	})
	submitted := time.Now()
	first := startPlan(t, api, "wake-admit-first", plan.Step{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 2}})
	waitStep(t, n, first.RunID, "a", time.Now().Add(2*time.Minute), "the first run's step did not start", begun...)
	queued := startPlan(t, api, "wake-admit-queued", plan.Step{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}})
	if queued.Status != statestore.RunStatusQueued {
		t.Fatalf("the second run under a global limit of 1: status %q, want %q", queued.Status, statestore.RunStatusQueued)
	}
	waitStep(t, n, queued.RunID, "a", submitted.Add(wakeDeadline),
		fmt.Sprintf("released, it waited for the noop loop's %v idle pause, not the release's wake", idlePause), begun...)
	t.Logf("the queued run's step started %v after the first run was submitted", time.Since(submitted).Round(time.Millisecond))
	if stepStatus(n, first.RunID, "a") != statestore.StepStatusSuccess {
		t.Fatalf("the queued run started before the first run's step ended: %q", stepStatus(n, first.RunID, "a"))
	}
}

// TestNode_ScheduledResumeWakesIdleLoops: a run paused with a scheduled
// resume (resumeAt) has its next step polled at once when the drain
// monitor resumes it, not when the idle loop's pause ends. Step a ends
// while the run is paused; its outcome wakes the plan's loops, which find
// nothing (Conductor schedules b only once the workflow is resumed).
func TestNode_ScheduledResumeWakesIdleLoops(t *testing.T) {
	n, api := openIdle(t, nil)
	ctx := context.Background()
	started := startPlan(t, api, "wake-schedule",
		plan.Step{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 2}},
		plan.Step{StepID: "b", DependsOn: []string{"a"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}})
	waitStep(t, n, started.RunID, "a", time.Now().Add(2*time.Minute), "step a did not start", begun...)
	if _, err := api.PauseWith(ctx, started.RunID, httpapi.PauseOptions{TimeoutSeconds: 120, Reason: "test", ResumeAfter: 4 * time.Second}); err != nil {
		t.Fatal(err)
	}
	waitStep(t, n, started.RunID, "a", time.Now().Add(2*time.Minute), "step a did not end while paused", statestore.StepStatusSuccess)
	ended := time.Now()
	if snap, err := n.store.ProjectSnapshot(ctx, started.RunID); err != nil || snap.Status != statestore.RunStatusPaused {
		t.Fatalf("the run when step a ended: %+v %v, want PAUSED", snap, err)
	}
	waitStep(t, n, started.RunID, "b", ended.Add(wakeDeadline),
		fmt.Sprintf("after the scheduled resume it waited for the noop loop's %v idle pause, not the resume's wake", idlePause), begun...)
	t.Logf("step b started %v after step a ended", time.Since(ended).Round(time.Millisecond))
	snap, err := n.store.ProjectSnapshot(ctx, started.RunID)
	if err != nil || snap.Pause == nil || snap.Pause.ResumedAt == "" {
		t.Fatalf("the run after step b started: %+v %v, want it resumed", snap, err)
	}
}

// TestNode_RetriedStepStartsAtItsCallback: a step held after a failure
// (onStepFailure: pause), retried (RETRY_STEP) and resumed starts its next
// attempt as soon as its task's callback ends, not when the idle loop's
// pause ends. The task was handed back with a callback when it was held:
// the resume's wake polls while the callback still runs and finds
// nothing, so only a wake when the callback ends finds it in time.
func TestNode_RetriedStepStartsAtItsCallback(t *testing.T) {
	n, api := openIdle(t, func(cfg *Config) { cfg.Concurrency[plan.ExecutorCommand] = 1 })
	ctx := context.Background()
	marker := filepath.Join(t.TempDir(), "fixed")
	started, err := api.Start(ctx, httpapi.StartRequest{TenantID: "t", ProjectID: "p", EnvironmentID: "e", RunRequestID: uuid.NewString(),
		Plan: &plan.Plan{PlanID: "wake-retry-" + uuid.NewString()[:8], PlanVersion: "1", OnStepFailure: plan.OnFailurePause, Steps: []plan.Step{
			{StepID: "flaky", Executor: plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"test", "-f", marker}}},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	waitRun(t, n, started.RunID, time.Now().Add(2*time.Minute), "the run did not pause on the step's failure", func(s *statestore.RunSnapshot) bool {
		st := s.Step("flaky")
		return s.Status == statestore.RunStatusPaused && st != nil && st.Held
	})
	held := time.Now()
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := api.RetryStep(ctx, started.RunID, "flaky", "fixed"); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Resume(ctx, started.RunID); err != nil {
		t.Fatal(err)
	}
	resumed := time.Since(held)
	waitRun(t, n, started.RunID, held.Add(wakeDeadline),
		fmt.Sprintf("the retried attempt waited for the command loop's %v idle pause, not a wake at its task's callback (resumed %v after the hold was seen)", idlePause, resumed.Round(time.Millisecond)),
		func(s *statestore.RunSnapshot) bool {
			st := s.Step("flaky")
			return st != nil && st.LogicalAttemptID >= 2 && slices.Contains(begun, st.Status)
		})
	t.Logf("resumed %v and the retried attempt started %v after the hold was seen", resumed.Round(time.Millisecond), time.Since(held).Round(time.Millisecond))
}

// TestNode_QueuedRunsStartOnceLimitsAreRemoved: a run admission control
// queued is started by a node opened without limits on the same store
// (an operator who removed --max-active-runs), not left QUEUED for good.
func TestNode_QueuedRunsStartOnceLimitsAreRemoved(t *testing.T) {
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-queue-pw", Permissions: natsstore.AllPermissions})
	ctx := context.Background()
	open := func(adm Admission) (*Node, *httpapi.Client) {
		cfg := testConfig(t, srv.URL())
		cfg.Concurrency = map[string]int{plan.ExecutorNoop: 1, plan.ExecutorSleep: 1}
		cfg.Admission = adm
		n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
		if err := n.Open(ctx); err != nil {
			t.Fatal(err)
		}
		return n, httpapi.NewClient("http://" + cfg.API.Addr().String())
	}
	limited, api := open(Admission{Limits: admission.Limits{Global: 1}, Policy: admission.Queue})
	first := startPlan(t, api, "queue-first", plan.Step{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 600}})
	waitStep(t, limited, first.RunID, "a", time.Now().Add(2*time.Minute), "the first run's step did not start", begun...)
	queued := startPlan(t, api, "queue-second", plan.Step{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}})
	if queued.Status != statestore.RunStatusQueued {
		t.Fatalf("the second run under a global limit of 1: status %q, want %q", queued.Status, statestore.RunStatusQueued)
	}
	// Stopped with a short grace: the first run's step is interrupted and
	// handed back, still running in the log, still counted by admission.
	grace, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := limited.Close(grace); err != nil {
		t.Fatal(err)
	}

	unlimited, _ := open(Admission{})
	t.Cleanup(func() { _ = unlimited.Close(ctx) })
	waitStep(t, unlimited, queued.RunID, "a", time.Now().Add(2*time.Minute), "the queued run was not started by a node without limits", begun...)
}
