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
	// held: a's attempt 1 failed under onStepFailure pause, the run is
	// paused (in the log and in Conductor), and a's task, handed back,
	// is completed by hand in Conductor; then the operator retries a.
	held := func(t *testing.T) (Run, model.Task, func(string, int64, statestore.Payload)) {
		t.Helper()
		run, task := chain(t)
		ref := statestore.RunRef{RunID: run.RunID, TenantID: run.TenantID, ProjectID: run.ProjectID,
			EnvironmentID: run.EnvironmentID, PlanID: run.PlanID, PlanVersion: run.PlanVersion}
		emit := func(stepID string, attempt int64, p statestore.Payload) {
			t.Helper()
			ev, err := statestore.NewEvent(ref, p.EventType(), stepID, 1, attempt, p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := env.emitter.Emit(ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
		emit("a", 1, statestore.StepFailedPayload{OnStepFailure: statestore.OnStepFailurePause,
			Error: &statestore.StepError{Code: "COMMAND_FAILED", Message: "exit 1", Retryable: true}})
		emit("", 1, statestore.RunPausedPayload{Reason: "stepFailed"})
		if err := r.Client().Pause(ctx, run.WorkflowID); err != nil {
			t.Fatal(err)
		}
		if err := r.Client().UpdateTask(ctx, &model.TaskResult{TaskId: task.TaskId, WorkflowInstanceId: run.WorkflowID,
			Status: model.CompletedTask, OutputData: map[string]any{"byHand": true}}); err != nil {
			t.Fatal(err)
		}
		emit("", 1, statestore.RunStepRetryRequestedPayload{StepID: "a", StepLogicalAttemptID: 2})
		return run, task, emit
	}
	// resumeAndFinish resumes the run and runs b as the sidecar's worker
	// would, to Conductor's end of the workflow.
	resumeAndFinish := func(t *testing.T, run Run, emit func(string, int64, statestore.Payload)) {
		t.Helper()
		emit("", 1, statestore.RunResumedPayload{})
		if err := r.Client().Resume(ctx, run.WorkflowID); err != nil {
			t.Fatal(err)
		}
		b := pollTask(t, r.Client(), plan.TaskTypeNoop, run.TaskDomain)
		emit("b", 1, statestore.StepStartedPayload{EngineTaskID: b.TaskId})
		emit("b", 1, statestore.StepCompletedPayload{})
		if err := r.Client().UpdateTask(ctx, &model.TaskResult{TaskId: b.TaskId, WorkflowInstanceId: run.WorkflowID, Status: model.CompletedTask}); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, r.Client(), run.WorkflowID, model.CompletedWorkflow)
		w.Nudge(run.RunID)
	}
	retriedAttempt := func(t *testing.T, recs []statestore.RunEventRecord, task model.Task) {
		t.Helper()
		var n int
		for _, rec := range recs {
			if rec.StepID != "a" || rec.LogicalAttemptID != 2 {
				continue
			}
			n++
			if !strings.Contains(string(rec.Payload), `"engineTaskId":"`+task.TaskId+`"`) {
				t.Fatalf("%s of a's retried attempt, payload %s: want it naming the task completed by hand", rec.EventType, rec.Payload)
			}
		}
		if n != 2 {
			t.Fatalf("a's retried attempt has %d events, want StepStarted and StepCompleted: %v", n, eventTypes(recs))
		}
	}
	t.Run("HeldThenCompletedByHand", func(t *testing.T) {
		// Nobody reads the held task back at the retry: the watcher
		// records it at the run's end.
		run, task, emit := held(t)
		resumeAndFinish(t, run, emit)
		recs := waitFinal(t, env, r, run.RunID)
		if got, want := strings.Join(eventTypes(recs), " "), "RunStarted StepStarted StepFailed RunPaused RunStepRetryRequested RunResumed StepStarted StepCompleted StepStarted StepCompleted RunCompleted"; got != want {
			t.Fatalf("log %s, want %s", got, want)
		}
		retriedAttempt(t, recs, task)
		if got := steps(t, run.RunID); got["run"] != statestore.RunStatusCompleted || got["a"] != statestore.StepStatusSuccess || got["b"] != statestore.StepStatusSuccess {
			t.Fatalf("snapshot %v, want the run COMPLETED, a and b SUCCESS", got)
		}
	})
	t.Run("HeldThenCompletedByHandAtTheRetry", func(t *testing.T) {
		run, task, emit := held(t)
		recorded, err := w.SettleRetriedStep(ctx, run.RunID, "a")
		if err != nil || !recorded {
			t.Fatalf("SettleRetriedStep: %t, %v; want the retried attempt recorded", recorded, err)
		}
		if got := steps(t, run.RunID); got["run"] != statestore.RunStatusPaused || got["a"] != statestore.StepStatusSuccess {
			t.Fatalf("snapshot %v after the retry, want the run PAUSED, a SUCCESS", got)
		}
		if again, err := w.SettleRetriedStep(ctx, run.RunID, "a"); err != nil || again {
			t.Fatalf("SettleRetriedStep again: %t, %v; want nothing more", again, err)
		}
		resumeAndFinish(t, run, emit)
		recs := waitFinal(t, env, r, run.RunID)
		if got, want := strings.Join(eventTypes(recs), " "), "RunStarted StepStarted StepFailed RunPaused RunStepRetryRequested StepStarted StepCompleted RunResumed StepStarted StepCompleted RunCompleted"; got != want {
			t.Fatalf("log %s, want %s", got, want)
		}
		retriedAttempt(t, recs, task)
	})
	t.Run("HeldTaskStillHeld", func(t *testing.T) {
		// A held task Conductor still holds is the retried attempt's to
		// run: nothing is recorded at the retry.
		run, task := chain(t)
		ref := statestore.RunRef{RunID: run.RunID, TenantID: run.TenantID, ProjectID: run.ProjectID,
			EnvironmentID: run.EnvironmentID, PlanID: run.PlanID, PlanVersion: run.PlanVersion}
		for _, p := range []struct {
			step string
			p    statestore.Payload
		}{
			{"a", statestore.StepFailedPayload{OnStepFailure: statestore.OnStepFailurePause, Error: &statestore.StepError{Code: "COMMAND_FAILED", Message: "exit 1"}}},
			{"", statestore.RunPausedPayload{Reason: "stepFailed"}},
			{"", statestore.RunStepRetryRequestedPayload{StepID: "a", StepLogicalAttemptID: 2}},
		} {
			ev, err := statestore.NewEvent(ref, p.p.EventType(), p.step, 1, 1, p.p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := env.emitter.Emit(ctx, ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Client().UpdateTask(ctx, &model.TaskResult{TaskId: task.TaskId, WorkflowInstanceId: run.WorkflowID,
			Status: model.InProgressTask, CallbackAfterSeconds: 60}); err != nil {
			t.Fatal(err)
		}
		if recorded, err := w.SettleRetriedStep(ctx, run.RunID, "a"); err != nil || recorded {
			t.Fatalf("SettleRetriedStep: %t, %v; want nothing recorded", recorded, err)
		}
		if got := steps(t, run.RunID); got["a"] != statestore.StepStatusPending {
			t.Fatalf("snapshot %v, want a PENDING (its retry to run)", got)
		}
	})
	t.Run("TerminatedWhileAStepRuns", func(t *testing.T) {
		// a's worker (an outside worker, or a replica's that died) never
		// reports: Conductor's CANCELED is the step's end.
		run, _ := chain(t)
		if err := r.Client().Terminate(ctx, run.WorkflowID, "terminated by hand"); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, r.Client(), run.WorkflowID, model.TerminatedWorkflow)
		w.Nudge(run.RunID)
		recs := waitFinal(t, env, r, run.RunID)
		if got, want := strings.Join(eventTypes(recs), " "), "RunStarted StepStarted StepFailed RunFailed"; got != want {
			t.Fatalf("log %s, want %s", got, want)
		}
		if !strings.Contains(string(recs[2].Payload), "ENGINE_TASK_CANCELED") {
			t.Fatalf("StepFailed %s, want ENGINE_TASK_CANCELED", recs[2].Payload)
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
