package adapter

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestWatcher_PlanTasksEndedInConductor: a plan run's task ended in
// Conductor by someone else than the step's worker (an update made by
// hand, a skiptask) is recorded as Conductor ended it before the run's
// end: the log says what Conductor ran, and a worker's later outcome of
// that attempt is no longer a valid transition.
func TestWatcher_PlanTasksEndedInConductor(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	// Each case has a task domain of its own (newNATS): a poll takes only
	// its own run's task.
	var env *natsEnv
	var r *Runs
	var w *Watcher
	setUp := func(t *testing.T) {
		env = newNATS(t)
		r = env.newRuns(t, u, RunsOptions{})
		w = NewWatcher(r, env.store, WatcherOptions{Interval: time.Hour, Logger: zaptest.NewLogger(t)})
		if err := w.Open(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close(ctx) })
	}
	chain := func(t *testing.T) (Run, model.Task) {
		t.Helper()
		setUp(t)
		p := compilePlan(t, &plan.Plan{PlanID: "plan-" + suffix(t), PlanVersion: "1", Steps: []plan.Step{
			{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
			{StepID: "b", DependsOn: []string{"a"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
		}})
		res, err := r.StartRun(ctx, request(p, "req"))
		if err != nil {
			t.Fatal(err)
		}
		run := res.Run
		// The sidecar's worker took a and is running it.
		task := pollTask(t, r.Client(), plan.TaskTypeNoop, run.TaskDomain)
		started, err := statestore.NewEvent(statestore.RunRef{RunID: run.RunID, TenantID: run.TenantID, ProjectID: run.ProjectID,
			EnvironmentID: run.EnvironmentID, PlanID: run.PlanID, PlanVersion: run.PlanVersion}, statestore.StepStarted, "a", 1, 1,
			statestore.StepStartedPayload{EngineTaskID: task.TaskId})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.emitter.Emit(ctx, started); err != nil {
			t.Fatal(err)
		}
		return run, task
	}
	steps := func(t *testing.T, runID string) map[string]string {
		t.Helper()
		snap, err := env.store.ProjectSnapshot(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if snap.Inconsistent {
			t.Fatalf("the log of run %s is inconsistent", runID)
		}
		out := map[string]string{"run": snap.Status}
		for _, st := range snap.Steps {
			out[st.StepID] = st.Status
		}
		return out
	}

	t.Run("SkippedThenCompletedByHand", func(t *testing.T) {
		run, task := chain(t)
		// b is skipped before Conductor schedules it, a completed by hand
		// while its worker runs it.
		skipTask(t, u, run.WorkflowID, "b")
		if err := r.Client().UpdateTask(ctx, &model.TaskResult{TaskId: task.TaskId, WorkflowInstanceId: run.WorkflowID,
			Status: model.CompletedTask, OutputData: map[string]any{"byHand": true}}); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, r.Client(), run.WorkflowID, model.CompletedWorkflow)
		w.Nudge(run.RunID)
		recs := waitFinal(t, env, r, run.RunID)
		// In Conductor's order of the tasks: b's skip came first.
		if got, want := strings.Join(eventTypes(recs), " "), "RunStarted StepStarted StepSkipped StepCompleted RunCompleted"; got != want {
			t.Fatalf("log %s, want %s", got, want)
		}
		var done statestore.StepCompletedPayload
		_ = json.Unmarshal(recs[3].Payload, &done)
		if recs[3].StepID != "a" || done.EngineTaskID != task.TaskId {
			t.Fatalf("StepCompleted of %q, payload %s: want a's, naming its task", recs[3].StepID, recs[3].Payload)
		}
		if got := steps(t, run.RunID); got["run"] != statestore.RunStatusCompleted || got["a"] != statestore.StepStatusSuccess || got["b"] != statestore.StepStatusSkipped {
			t.Fatalf("snapshot %v, want the run COMPLETED, a SUCCESS, b SKIPPED", got)
		}
	})
	t.Run("Skipped", func(t *testing.T) {
		// a ran as the sidecar's worker runs it (its outcome in the log
		// first), b was skipped: only the count of the plan's steps says
		// that the log lacks one.
		run, task := chain(t)
		skipTask(t, u, run.WorkflowID, "b")
		done, err := statestore.NewEvent(statestore.RunRef{RunID: run.RunID, TenantID: run.TenantID, ProjectID: run.ProjectID,
			EnvironmentID: run.EnvironmentID, PlanID: run.PlanID, PlanVersion: run.PlanVersion}, statestore.StepCompleted, "a", 1, 1,
			statestore.StepCompletedPayload{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.emitter.Emit(ctx, done); err != nil {
			t.Fatal(err)
		}
		if err := r.Client().UpdateTask(ctx, &model.TaskResult{TaskId: task.TaskId, WorkflowInstanceId: run.WorkflowID, Status: model.CompletedTask}); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, r.Client(), run.WorkflowID, model.CompletedWorkflow)
		w.Nudge(run.RunID)
		recs := waitFinal(t, env, r, run.RunID)
		if got, want := strings.Join(eventTypes(recs), " "), "RunStarted StepStarted StepCompleted StepSkipped RunCompleted"; got != want {
			t.Fatalf("log %s, want %s", got, want)
		}
	})
	t.Run("FailedByHand", func(t *testing.T) {
		run, task := chain(t)
		if err := r.Client().UpdateTask(ctx, &model.TaskResult{TaskId: task.TaskId, WorkflowInstanceId: run.WorkflowID,
			Status: model.FailedWithTerminalErrorTask, ReasonForIncompletion: "failed by hand"}); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, r.Client(), run.WorkflowID, model.FailedWorkflow)
		w.Nudge(run.RunID)
		recs := waitFinal(t, env, r, run.RunID)
		if got, want := strings.Join(eventTypes(recs), " "), "RunStarted StepStarted StepFailed RunFailed"; got != want {
			t.Fatalf("log %s, want %s", got, want)
		}
		var failed statestore.StepFailedPayload
		_ = json.Unmarshal(recs[2].Payload, &failed)
		if failed.Error == nil || !strings.Contains(failed.Error.Message, "failed by hand") || failed.Error.Retryable {
			t.Fatalf("StepFailed payload %s, want Conductor's reason, not retryable", recs[2].Payload)
		}
		if got := steps(t, run.RunID); got["run"] != statestore.RunStatusFailed || got["a"] != statestore.StepStatusFailed {
			t.Fatalf("snapshot %v, want the run FAILED with a FAILED", got)
		}
		// The worker's own outcome, once its step ends, is refused.
		late, err := statestore.NewEvent(statestore.RunRef{RunID: run.RunID, TenantID: run.TenantID, ProjectID: run.ProjectID,
			EnvironmentID: run.EnvironmentID, PlanID: run.PlanID, PlanVersion: run.PlanVersion}, statestore.StepCompleted, "a", 1, 1,
			statestore.StepCompletedPayload{})
		if err != nil {
			t.Fatal(err)
		}
		snap, _ := env.store.ProjectSnapshot(ctx, run.RunID)
		if d := statestore.Decide(snap, late.EventType, "a", 1); d.Outcome == statestore.Apply {
			t.Fatal("the worker's StepCompleted of a step Conductor failed is still a valid transition")
		}
	})
}

// skipTask skips step stepID of workflow wfID in Conductor (skiptask), as
// an operator does by hand.
func skipTask(t *testing.T, base, wfID, stepID string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, base+"/workflow/"+wfID+"/skiptask/"+plan.StepRef(stepID), strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("skiptask: %d %s", resp.StatusCode, b)
	}
}

// TestRuns_PlanDefinitionEditedInConductor: a plan version's workflow
// definition edited in Conductor behind the sidecar's back (same name and
// version, a step dropped) is found by the check a registered plan gets
// again after PlanRecheck, and registered anew before the next run
// starts: that run runs the plan's steps, not the edit's.
func TestRuns_PlanDefinitionEditedInConductor(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, u, RunsOptions{PlanRecheck: 50 * time.Millisecond})
	p := compilePlan(t, &plan.Plan{PlanID: "plan-" + suffix(t), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
		{StepID: "b", DependsOn: []string{"a"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
	}})
	if _, err := r.StartRun(ctx, request(p, "first")); err != nil {
		t.Fatal(err)
	}
	name := plan.WorkflowName("tenant-a", p.Plan.PlanID, p.Plan.PlanVersion)
	def, err := r.Client().WorkflowDef(ctx, name, plan.WorkflowVersion)
	if err != nil {
		t.Fatal(err)
	}
	edited := *def
	edited.Tasks = edited.Tasks[:1]
	edited.Description = "edited by hand"
	body, _ := json.Marshal([]model.WorkflowDef{edited})
	req, _ := http.NewRequest(http.MethodPut, u+"/metadata/workflow", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("edit: %d", resp.StatusCode)
	}
	time.Sleep(100 * time.Millisecond) // past PlanRecheck
	if _, err := r.StartRun(ctx, request(p, "second")); err != nil {
		t.Fatal(err)
	}
	def, err = r.Client().WorkflowDef(ctx, name, plan.WorkflowVersion)
	if err != nil {
		t.Fatal(err)
	}
	if EmbeddedPlanHash(def) != p.ContentHash || len(plan.StepsOf(def)) != 2 {
		t.Fatalf("the definition after the next start: hash %q, %d steps; want the plan's (%s, 2)", EmbeddedPlanHash(def), len(plan.StepsOf(def)), p.ContentHash)
	}
}
