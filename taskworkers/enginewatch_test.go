package taskworkers_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/google/uuid"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// TestWorker_StepEndedInConductorWhileItRuns: a step the sidecar's own
// worker runs whose task is ended in Conductor meanwhile (an update made
// by hand, a terminate) is interrupted, and the log records what
// Conductor made of it, not the step's own outcome (which Conductor
// would not take): a task completed by hand is the step's StepCompleted,
// naming the task; a workflow terminated is the step's StepFailed
// ENGINE_TASK_CANCELED, as Conductor cancelled its task. Before, the step ran to its end
// and its own outcome was recorded: a failure Conductor never had, or a
// success after the run had failed.
func TestWorker_StepEndedInConductorWhileItRuns(t *testing.T) {
	e := newBenchEnv(t)
	ctx := context.Background()
	running := taskworkers.NewRunning()
	w := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: "enginewatch-test", Concurrency: map[string]int{plan.TaskType(plan.ExecutorSleep): 2}, PollTimeout: 100 * time.Millisecond,
		Tasks: e.client, EngineTaskCheck: 200 * time.Millisecond, Running: running, Logger: zaptest.NewLogger(t),
	})
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	started := func(t *testing.T) (runID, taskID string, wfID string) {
		t.Helper()
		wfID = e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 60}, plan.RetryPolicy{})[0]
		runID, taskID = runningStep(t, e, wfID)
		return runID, taskID, wfID
	}
	waitIdle := func(t *testing.T, runID string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for running.Steps(runID) != 0 {
			if time.Now().After(deadline) {
				t.Fatal("the step still runs 15 s after Conductor ended its task")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("CompletedByHand", func(t *testing.T) {
		runID, taskID, wfID := started(t)
		if err := e.client.UpdateTask(ctx, &model.TaskResult{TaskId: taskID, WorkflowInstanceId: wfID, Status: model.CompletedTask,
			OutputData: map[string]any{"byHand": true}}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			recs, _ := e.store.Fetch(ctx, runID, 0, 0)
			if n := countEvents(recs, statestore.StepCompleted); n == 1 {
				var p statestore.StepCompletedPayload
				_ = json.Unmarshal(recs[len(recs)-1].Payload, &p)
				if p.EngineTaskID != taskID || countEvents(recs, statestore.StepFailed) != 0 {
					t.Fatalf("StepCompleted %s; want Conductor's end of task %s, and no failure", recs[len(recs)-1].Payload, taskID)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no StepCompleted 15 s after the task was completed in Conductor (the step sleeps 60 s)")
			}
			time.Sleep(100 * time.Millisecond)
		}
		waitIdle(t, runID)
	})
	t.Run("FailedByHandConductorRetries", func(t *testing.T) {
		// Two engine tries: Conductor retries the try failed by hand.
		// The running try is interrupted (it would have run beside the
		// retry) and ended in the log as Conductor ended it.
		wfID := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 60}, plan.RetryPolicy{EngineTries: 2})[0]
		runID, taskID := runningStep(t, e, wfID)
		t.Cleanup(func() { _ = e.client.Terminate(context.Background(), wfID, "test over") })
		if err := e.client.UpdateTask(ctx, &model.TaskResult{TaskId: taskID, WorkflowInstanceId: wfID, Status: model.FailedTask,
			ReasonForIncompletion: "failed by hand"}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			recs, _ := e.store.Fetch(ctx, runID, 0, 0)
			var ended *statestore.RunStepTryEndedPayload
			for _, r := range recs {
				if r.EventType == statestore.RunStepTryEnded {
					ended = &statestore.RunStepTryEndedPayload{}
					_ = json.Unmarshal(r.Payload, ended)
				}
			}
			if ended != nil {
				if ended.Reason != statestore.TryEndedEngineTryFailed || ended.EngineAttemptID != 1 || countEvents(recs, statestore.StepCompleted)+countEvents(recs, statestore.StepFailed) != 0 {
					t.Fatalf("try ended %+v, with %d outcomes; want try 1 ended engineTryFailed and no outcome", ended, countEvents(recs, statestore.StepCompleted)+countEvents(recs, statestore.StepFailed))
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no RunStepTryEnded 15 s after the try was failed in Conductor")
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	t.Run("Terminated", func(t *testing.T) {
		runID, _, wfID := started(t)
		if err := e.client.Terminate(ctx, wfID, "terminated by hand"); err != nil {
			t.Fatal(err)
		}
		waitIdle(t, runID)
		time.Sleep(500 * time.Millisecond) // what the interrupted step would record
		recs, _ := e.store.Fetch(ctx, runID, 0, 0)
		var failed statestore.StepFailedPayload
		for _, r := range recs {
			if r.EventType == statestore.StepFailed {
				_ = json.Unmarshal(r.Payload, &failed)
			}
		}
		if countEvents(recs, statestore.StepCompleted) != 0 || countEvents(recs, statestore.StepFailed) != 1 || failed.Error == nil || failed.Error.Code != statestore.CodeEngineTask+"CANCELED" {
			t.Fatalf("log %v: want the step failed as Conductor cancelled its task (ENGINE_TASK_CANCELED), not its own outcome", recs)
		}
	})
}

// runningStep waits until workflow wfID's one task is in progress with its
// StepStarted in the log, and returns the run and the task.
func runningStep(t *testing.T, e *benchEnv, wfID string) (runID, taskID string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		wf, err := e.client.Workflow(context.Background(), wfID, true)
		if err == nil && len(wf.Tasks) == 1 && wf.Tasks[0].Status == "IN_PROGRESS" {
			if recs, _ := e.store.Fetch(context.Background(), wf.CorrelationId, 0, 0); countEvents(recs, statestore.StepStarted) == 1 {
				return wf.CorrelationId, wf.Tasks[0].TaskId
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the step did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func countEvents(recs []statestore.RunEventRecord, eventType string) int {
	n := 0
	for _, r := range recs {
		if r.EventType == eventType {
			n++
		}
	}
	return n
}

// TestWorker_StepEndedInConductorJustBeforeItEnds: a task ended in
// Conductor after the step's last periodic read and before its own end
// (here no periodic read comes at all) is still found: a step that ran a
// second or more has its task read back once more before its outcome is
// recorded. The step fails on its own (exit 3); Conductor has it
// completed by hand: the log says completed.
func TestWorker_StepEndedInConductorJustBeforeItEnds(t *testing.T) {
	e := newBenchEnv(t)
	ctx := context.Background()
	w := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: "enginewatch-final", Concurrency: map[string]int{plan.TaskType(plan.ExecutorCommand): 1}, PollTimeout: 100 * time.Millisecond,
		Tasks: e.client, EngineTaskCheck: time.Hour, Logger: zaptest.NewLogger(t),
	})
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	wfID := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c", "sleep 2; exit 3"}}, plan.RetryPolicy{})[0]
	runID, taskID := runningStep(t, e, wfID)
	if err := e.client.UpdateTask(ctx, &model.TaskResult{TaskId: taskID, WorkflowInstanceId: wfID, Status: model.CompletedTask}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs, _ := e.store.Fetch(ctx, runID, 0, 0)
		c, f := countEvents(recs, statestore.StepCompleted), countEvents(recs, statestore.StepFailed)
		if c+f > 0 {
			if c != 1 || f != 0 {
				t.Fatalf("%d StepCompleted, %d StepFailed: want Conductor's completion, not the step's own exit 3", c, f)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no outcome recorded")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWorker_StepInterruptedByACancelIsNotHeld: under onStepFailure
// pause, a step the run's cancel interrupts (Running.Interrupt) ends
// failed, not held: the run ends, so there is nothing to retry, and the
// worker does not try to pause the cancelled run.
func TestWorker_StepInterruptedByACancelIsNotHeld(t *testing.T) {
	e := newBenchEnv(t)
	ctx := context.Background()
	running := taskworkers.NewRunning()
	var pauses atomic.Int32
	w := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: "interrupt-test", Concurrency: map[string]int{plan.TaskType(plan.ExecutorSleep): 2}, PollTimeout: 100 * time.Millisecond,
		Running: running, Logger: zaptest.NewLogger(t),
		PauseOnFailure: func(context.Context, string, string, string) error { pauses.Add(1); return nil },
	})
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	wfID := e.startPlan(t, 1, &plan.Plan{PlanID: "interrupt-" + uuid.NewString()[:8], PlanVersion: "1", OnStepFailure: plan.OnFailurePause,
		Steps: []plan.Step{{StepID: "s00", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 60}}}})[0]
	t.Cleanup(func() { _ = e.client.Terminate(context.Background(), wfID, "test over") })
	runID, _ := runningStep(t, e, wfID)
	if n := len(running.Interrupt(runID)); n != 1 {
		t.Fatalf("interrupted %d steps, want 1", n)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		recs, _ := e.store.Fetch(ctx, runID, 0, 0)
		if i := slices.IndexFunc(recs, func(r statestore.RunEventRecord) bool { return r.EventType == statestore.StepFailed }); i >= 0 {
			if strings.Contains(string(recs[i].Payload), `"onStepFailure"`) {
				t.Fatalf("StepFailed %s of an interrupted step; want it not held", recs[i].Payload)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no StepFailed 15 s after the step was interrupted")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if n := pauses.Load(); n != 0 {
		t.Fatalf("the worker paused the run %d times after an interrupted step", n)
	}
}

// TestWorker_OwnTryOfferedAgainInAPauseIsNotRun: a try of the sidecar's own
// step whose StepStarted is in the log, offered again while the run is
// paused (its worker died, and the record of its try's end failed with
// the store), is not run again inside the pause: its end is recorded
// (RunStepTryEnded) and the task handed back until the resume. (An
// outside worker's try in flight, polled back after its own IN_PROGRESS
// with a callback, goes on: the proxy's case.)
func TestWorker_OwnTryOfferedAgainInAPauseIsNotRun(t *testing.T) {
	e := newBenchEnv(t)
	ctx := context.Background()
	ran := filepath.Join(t.TempDir(), "ran")
	wfID := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c", `echo x >> "$RAN"`}, Env: map[string]string{"RAN": ran}}, plan.RetryPolicy{})[0]
	t.Cleanup(func() { _ = e.client.Terminate(context.Background(), wfID, "test over") })
	// The worker that died: it took the task and recorded its start.
	var task model.Task
	deadline := time.Now().Add(30 * time.Second)
	for {
		tasks, err := e.client.BatchPollDomain(ctx, plan.TaskType(plan.ExecutorCommand), "dead-worker", e.domain, 1, 100*time.Millisecond)
		if err == nil && len(tasks) == 1 {
			task = tasks[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no task to take")
		}
	}
	runID, _ := task.InputData["runId"].(string)
	snap, err := e.store.ProjectSnapshot(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		eventType, stepID string
		p                 statestore.Payload
	}{
		{statestore.StepStarted, "s00", statestore.StepStartedPayload{}},
		{statestore.RunPaused, "", statestore.RunPausedPayload{Reason: "maintenance"}},
	} {
		ev, err := statestore.NewEvent(snap.Ref(), w.eventType, w.stepID, 1, 1, w.p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.emit.Emit(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	// Its restart handed the task back without the try's end recorded.
	if err := e.client.UpdateTask(ctx, &model.TaskResult{TaskId: task.TaskId, WorkflowInstanceId: wfID, Status: model.InProgressTask, CallbackAfterSeconds: 0}); err != nil {
		t.Fatal(err)
	}
	startWorker(t, e, e.emit)
	deadline = time.Now().Add(20 * time.Second)
	for {
		recs, _ := e.store.Fetch(ctx, runID, 0, 0)
		if countEvents(recs, statestore.RunStepTryEnded) == 1 {
			break
		}
		if b, _ := os.ReadFile(ran); len(b) > 0 || time.Now().After(deadline) {
			t.Fatalf("the step ran %d times inside the pause, log %v; want its try ended and the task handed back", strings.Count(string(b), "x"), eventTypesOf(recs))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // the task handed back comes again: still not run
	if b, _ := os.ReadFile(ran); len(b) > 0 {
		t.Fatalf("the step ran %d times inside the pause", strings.Count(string(b), "x"))
	}
}
