package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/google/uuid"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
)

func TestAdoptedStepID(t *testing.T) {
	for _, tt := range []struct {
		name      string
		ref       string
		iteration int32
		want      string
	}{
		{"plain reference name", "charge_card", 0, "charge_card"},
		{"loop task as Conductor names it", "poll_status__3", 3, "poll_status__3"},
		{"loop task without Conductor's suffix", "poll_status", 2, "poll_status__2"},
		{"first iteration", "step__1", 1, "step__1"},
		{"a suffix of another iteration is kept", "step__1", 2, "step__1__2"},
		{"dynamic fork task keeps the fork input's name", "resize_img_7", 0, "resize_img_7"},
		{"pipe escaped", "a|b", 0, "a%7Cb"},
		{"percent escaped first", "50%|x", 0, "50%25%7Cx"},
		{"escaped and looped", "a|b", 4, "a%7Cb__4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := AdoptedStepID(tt.ref, tt.iteration)
			if got != tt.want {
				t.Fatalf("AdoptedStepID(%q, %d) = %q, want %q", tt.ref, tt.iteration, got, tt.want)
			}
			if err := statestore.CheckID(got, true); err != nil {
				t.Fatalf("stepId %q refused by the contract: %v", got, err)
			}
		})
	}
	// Reversible: distinct reference names never share a stepId.
	seen := map[string]string{}
	for _, ref := range []string{"a|b", "a%7Cb", "a%b", "a%25b", "a_b"} {
		id := AdoptedStepID(ref, 0)
		if prev, dup := seen[id]; dup {
			t.Fatalf("%q and %q both map to %q", prev, ref, id)
		}
		seen[id] = ref
	}
}

func TestStepIDOf_LoopTaskItself(t *testing.T) {
	loop := &model.Task{TaskType: "DO_WHILE", ReferenceTaskName: "poll_loop", Iteration: 3}
	inner := &model.Task{TaskType: "check", ReferenceTaskName: "check__3", Iteration: 3}
	if got := stepIDOf(loop); got != "poll_loop" {
		t.Fatalf("the DO_WHILE task's stepId is %q, want poll_loop at every iteration", got)
	}
	if got := stepIDOf(inner); got != "check__3" {
		t.Fatalf("an inner task's stepId is %q, want check__3", got)
	}
}

func TestParseAdoptSpec(t *testing.T) {
	for in, want := range map[string]AdoptSpec{
		"orders":      {Name: "orders"},
		"orders:3":    {Name: "orders", Version: 3},
		" billing:1 ": {Name: "billing", Version: 1},
	} {
		got, err := ParseAdoptSpec(in)
		if err != nil || got != want {
			t.Fatalf("ParseAdoptSpec(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", ":2", "orders:", "orders:0", "orders:-1", "orders:x", "a|b", strings.Repeat("n", statestore.MaxIDBytes+1)} {
		if _, err := ParseAdoptSpec(bad); !errors.Is(err, ErrInvalidInput) {
			t.Fatalf("ParseAdoptSpec(%q): %v, want INVALID_INPUT", bad, err)
		}
	}
}

func TestIsWorkerTask(t *testing.T) {
	for typ, want := range map[string]bool{"resize_image": true, "HTTP": false, "SWITCH": false, "SUB_WORKFLOW": false,
		"DO_WHILE": false, "FORK_JOIN_DYNAMIC": false, "JOIN": false, "WAIT": false, "INLINE": false} {
		if got := IsWorkerTask(typ); got != want {
			t.Fatalf("IsWorkerTask(%q) = %v", typ, got)
		}
	}
}

// types lists the event types of evs.
func types(evs []*statestore.RunEventWrite) string {
	var s []string
	for _, e := range evs {
		s = append(s, e.EventType)
	}
	return strings.Join(s, ",")
}

func TestTaskEvents(t *testing.T) {
	rec := &Run{RunID: "0d7c5a3e-8a3b-4c55-9d0e-1f2a3b4c5d6e", TenantID: "default", ProjectID: "default", EnvironmentID: "default",
		PlanID: "orders", PlanVersion: "2"}
	running := &statestore.StepSnapshot{Status: statestore.StepStatusRunning, LogicalAttemptID: 1}
	done := &statestore.StepSnapshot{Status: statestore.StepStatusSuccess, LogicalAttemptID: 1}
	for _, tt := range []struct {
		name        string
		task        model.Task
		st          *statestore.StepSnapshot
		adoption    bool
		want        string
		wantPending bool
		paused      bool // Conductor's workflow is PAUSED
		failed      bool // Conductor's workflow is FAILED
	}{
		{"HTTP in progress starts", model.Task{TaskType: "HTTP", Status: "IN_PROGRESS"}, nil, false, "StepStarted", true, false, false},
		{"HTTP scheduled is in flight", model.Task{TaskType: "HTTP", Status: "SCHEDULED"}, nil, false, "StepStarted", true, false, false},
		{"HTTP scheduled, started already", model.Task{TaskType: "HTTP", Status: "SCHEDULED"}, running, false, "", true, false, false},
		{"HTTP completed unseen", model.Task{TaskType: "HTTP", Status: "COMPLETED"}, nil, false, "StepStarted,StepCompleted", false, false, false},
		{"HTTP completed while running", model.Task{TaskType: "HTTP", Status: "COMPLETED"}, running, false, "StepCompleted", false, false, false},
		{"completed already recorded", model.Task{TaskType: "HTTP", Status: "COMPLETED"}, done, false, "", false, false, false},
		{"HTTP failed, retried by Conductor", model.Task{TaskType: "HTTP", Status: "FAILED", Retried: true}, running, false, "", false, false, false},
		{"HTTP failed for good", model.Task{TaskType: "HTTP", Status: "FAILED"}, running, false, "StepFailed", false, false, false},
		{"JOIN in progress is not in flight", model.Task{TaskType: "JOIN", Status: "IN_PROGRESS"}, nil, false, "", false, false, false},
		{"WAIT scheduled", model.Task{TaskType: "WAIT", Status: "SCHEDULED"}, nil, false, "", false, false, false},
		{"SWITCH completed", model.Task{TaskType: "SWITCH", Status: "COMPLETED"}, nil, false, "StepStarted,StepCompleted", false, false, false},
		{"skipped", model.Task{TaskType: "HTTP", Status: "SKIPPED"}, nil, false, "StepSkipped", false, false, false},
		{"canceled before it ran", model.Task{TaskType: "HTTP", Status: "CANCELED"}, nil, false, "", false, false, false},
		{"canceled while running", model.Task{TaskType: "HTTP", Status: "CANCELED"}, running, false, "StepFailed", false, false, false},
		// A control task is recorded once it ends: one canceled with its
		// workflow (a loop, a JOIN, a WAIT under way) ran.
		{"loop canceled with its workflow", model.Task{TaskType: "DO_WHILE", Status: "CANCELED"}, nil, false, "StepStarted,StepFailed", false, false, true},
		{"worker task in progress is the proxy's", model.Task{TaskType: "resize", Status: "IN_PROGRESS"}, nil, false, "", false, false, false},
		{"worker task in progress at adoption", model.Task{TaskType: "resize", Status: "IN_PROGRESS"}, nil, true, "StepStarted", true, false, false},
		{"worker task completed before adoption", model.Task{TaskType: "resize", Status: "COMPLETED"}, nil, true, "StepStarted,StepCompleted", false, false, false},
		{"worker task reported straight to Conductor", model.Task{TaskType: "resize", Status: "COMPLETED"}, running, false, "StepCompleted", false, false, false},
		{"worker task scheduled", model.Task{TaskType: "resize", Status: "SCHEDULED"}, nil, true, "", false, false, false},
		// Conductor decides nothing for a PAUSED workflow: a try that failed
		// or timed out in it (a dead worker's, failed by the proxy's watch)
		// is retried, or not, at resume.
		{"worker task failed while paused", model.Task{TaskType: "resize", Status: "FAILED"}, running, false, "", false, true, false},
		{"worker task timed out while paused", model.Task{TaskType: "resize", Status: "TIMED_OUT"}, running, false, "", false, true, false},
		{"HTTP failed while paused", model.Task{TaskType: "HTTP", Status: "FAILED"}, running, false, "", false, true, false},
		{"terminal error while paused", model.Task{TaskType: "resize", Status: "FAILED_WITH_TERMINAL_ERROR"}, running, false, "StepFailed", false, true, false},
		{"canceled while paused", model.Task{TaskType: "resize", Status: "CANCELED"}, running, false, "StepFailed", false, true, false},
		// Conductor 3.32 shows a try FAILED before the decide that marks it
		// retried and schedules its retry: with retries left by its
		// definition, the step is not failed until Conductor decided.
		{"worker task failed, retries left, retry not yet scheduled", model.Task{TaskType: "resize", Status: "FAILED",
			WorkflowTask: &model.WorkflowTask{TaskDefinition: &model.TaskDef{RetryCount: 2}}}, running, false, "", true, false, false},
		{"worker task timed out, retries left, retry not yet scheduled", model.Task{TaskType: "resize", Status: "TIMED_OUT", RetryCount: 1,
			WorkflowTask: &model.WorkflowTask{TaskDefinition: &model.TaskDef{RetryCount: 2}}}, running, false, "", true, false, false},
		{"the workflow task's retry count overrides the definition's", model.Task{TaskType: "resize", Status: "FAILED",
			WorkflowTask: &model.WorkflowTask{RetryCount: 1, TaskDefinition: &model.TaskDef{RetryCount: 0}}}, running, false, "", true, false, false},
		{"worker task failed, its last try", model.Task{TaskType: "resize", Status: "FAILED", RetryCount: 2,
			WorkflowTask: &model.WorkflowTask{TaskDefinition: &model.TaskDef{RetryCount: 2}}}, running, false, "StepFailed", false, false, false},
		{"worker task failed, retries left, the workflow failed", model.Task{TaskType: "resize", Status: "FAILED",
			WorkflowTask: &model.WorkflowTask{TaskDefinition: &model.TaskDef{RetryCount: 2}}}, running, false, "StepFailed", false, false, true},
		{"terminal error, retries left", model.Task{TaskType: "resize", Status: "FAILED_WITH_TERMINAL_ERROR",
			WorkflowTask: &model.WorkflowTask{TaskDefinition: &model.TaskDef{RetryCount: 2}}}, running, false, "StepFailed", false, false, false},
		{"HTTP failed, retries left, retry not yet scheduled", model.Task{TaskType: "HTTP", Status: "FAILED",
			WorkflowTask: &model.WorkflowTask{TaskDefinition: &model.TaskDef{RetryCount: 1}}}, running, false, "", true, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			task := tt.task
			task.ReferenceTaskName, task.TaskId, task.StartTime, task.EndTime = "step_a", "task-1", 1_700_000_000_000, 1_700_000_001_000
			wf := model.RunningWorkflow
			switch {
			case tt.paused:
				wf = model.PausedWorkflow
			case tt.failed:
				wf = model.FailedWorkflow
			}
			evs, pending, err := taskEvents(rec, &task, tt.st, tt.adoption, wf)
			if err != nil {
				t.Fatal(err)
			}
			if got := types(evs); got != tt.want || pending != tt.wantPending {
				t.Fatalf("events %q pending %v, want %q pending %v", got, pending, tt.want, tt.wantPending)
			}
			for _, ev := range evs {
				if ev.StepID != "step_a" || ev.LogicalAttemptID != 1 || ev.PlanID != "orders" || ev.PlanVersion != "2" {
					t.Fatalf("event %+v", ev)
				}
				if ev.EventType != statestore.StepFailed {
					continue
				}
				// A failure Conductor reported is retryable as Conductor
				// retries it, on adopted runs as on plan runs.
				var p statestore.StepFailedPayload
				if err := json.Unmarshal(ev.Payload, &p); err != nil || p.Error == nil {
					t.Fatalf("StepFailed payload %s: %v", ev.Payload, err)
				}
				status := string(task.Status)
				want := status == "FAILED" || status == "TIMED_OUT"
				if p.Error.Code != statestore.CodeEngineTask+status || p.Error.Retryable != want {
					t.Fatalf("StepFailed error %+v, want code %s%s retryable %v", p.Error, statestore.CodeEngineTask, status, want)
				}
			}
		})
	}
	// A control task canceled before it started did not run.
	unstarted := model.Task{TaskType: "DO_WHILE", Status: "CANCELED", ReferenceTaskName: "loop", TaskId: "t8"}
	if evs, _, err := taskEvents(rec, &unstarted, nil, false, model.TerminatedWorkflow); err != nil || len(evs) != 0 {
		t.Fatalf("a loop canceled before it started: %s %v, want nothing", types(evs), err)
	}
	// A held step retried (logical attempt 2) whose task Conductor shows
	// ended (completed by hand) is recorded as that attempt.
	retried := &statestore.StepSnapshot{Status: statestore.StepStatusPending, LogicalAttemptID: 2, RetryRequested: true}
	byHand := model.Task{TaskType: "resize", Status: "COMPLETED", ReferenceTaskName: "flaky", TaskId: "t7", StartTime: 1_700_000_000_000, EndTime: 1_700_000_002_000}
	if evs, _, err := taskEvents(rec, &byHand, retried, false, model.RunningWorkflow); err != nil || types(evs) != "StepStarted,StepCompleted" ||
		evs[0].LogicalAttemptID != 2 || evs[1].LogicalAttemptID != 2 {
		t.Fatalf("a retried held step completed by hand: %s %v, want StepStarted and StepCompleted of logical attempt 2", types(evs), err)
	}
	// The engine attempt is Conductor's retryCount + 1; times are Conductor's.
	task := model.Task{TaskType: "HTTP", Status: "COMPLETED", ReferenceTaskName: "call", RetryCount: 2, TaskId: "t9", StartTime: 1_700_000_000_000, EndTime: 1_700_000_002_000}
	evs, _, err := taskEvents(rec, &task, nil, false, model.RunningWorkflow)
	if err != nil || len(evs) != 2 {
		t.Fatalf("%v %v", evs, err)
	}
	if evs[0].EngineAttemptID != 3 || !strings.Contains(string(evs[0].Payload), `"engineStartedAt":"2023-11-14T22:13:20Z"`) ||
		!strings.Contains(string(evs[1].Payload), `"engineEndedAt":"2023-11-14T22:13:22Z"`) || !strings.Contains(string(evs[1].Payload), `"engineTaskId":"t9"`) {
		t.Fatalf("payloads %s / %s, engine attempt %d", evs[0].Payload, evs[1].Payload, evs[0].EngineAttemptID)
	}
}

func TestAdoptedTaskInput(t *testing.T) {
	rec := &Run{RunID: "0d7c5a3e-8a3b-4c55-9d0e-1f2a3b4c5d6e", TenantID: "t", ProjectID: "p", EnvironmentID: "e", PlanID: "orders", PlanVersion: "2"}
	task := &model.Task{TaskDefName: "resize", TaskType: "resize", ReferenceTaskName: "resize_ref", Iteration: 2, RetryCount: 1,
		WorkflowTask: &model.WorkflowTask{TaskDefinition: &model.TaskDef{RetryCount: 3}}}
	a := AdoptedTaskInput(rec, task, "")
	if a.RunID != rec.RunID || a.PlanID != "orders" || a.PlanVersion != "2" || a.Step.StepID != "resize_ref__2" || a.EngineTries != 4 || a.LogicalAttempts != 1 {
		t.Fatalf("%+v", a)
	}
	if e, l := a.Attempts(int(task.RetryCount)); e != 2 || l != 1 {
		t.Fatalf("attempts %d/%d, want engine 2 logical 1", e, l)
	}
	// The workflow task's retryCount is what Conductor retries by.
	task.RetryCount, task.WorkflowTask.RetryCount = 0, 1
	if a := AdoptedTaskInput(rec, task, ""); a.EngineTries != 2 {
		t.Fatalf("engine tries %d with the workflow task's retryCount 1, want 2", a.EngineTries)
	}
}

// endAfterFirstRead is the adopter's view of the log (the real store),
// with the run's end landing right after its first read of run: between
// recordTasks' decision and the append of the tasks it decided to record.
type endAfterFirstRead struct {
	t    *testing.T
	env  *natsEnv
	run  *Run
	once sync.Once
}

func (e *endAfterFirstRead) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := e.env.store.ProjectSnapshot(ctx, runID)
	if err != nil || runID != e.run.RunID {
		return snap, err
	}
	e.once.Do(func() {
		ev, err := runEvent(e.run, statestore.RunCompleted, statestore.RunCompletedPayload{EngineStatus: "COMPLETED"})
		if err == nil {
			_, err = e.env.emitter.Emit(ctx, ev)
		}
		if err != nil {
			e.t.Errorf("the run's end: %v", err)
		}
	})
	return snap, nil
}

// runOfWorkflow is a run index on embedded NATS and a run of workflow
// wf-1 in its log (RunStarted); emit appends a run-level event to it.
func runOfWorkflow(t *testing.T) (env *natsEnv, r *Runs, rec *Run, emit func(eventType string, payload any)) {
	t.Helper()
	ctx := context.Background()
	env = newNATS(t)
	r, err := OpenRuns(ctx, env.connect(t), newClient(t, "http://127.0.0.1:1/api", 100*time.Millisecond), env.emitter, RunsOptions{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	rec = &Run{RunID: uuid.NewString(), TenantID: "t", ProjectID: "p", EnvironmentID: "e", PlanID: "orders", PlanVersion: "2"}
	emit = func(eventType string, payload any) {
		t.Helper()
		ev, err := runEvent(rec, eventType, payload)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.emitter.Emit(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	emit(statestore.RunStarted, statestore.RunStartedPayload{EngineType: EngineType, EngineRunRef: statestore.ConductorRunRef("orders", "wf-1")})
	return env, r, rec, emit
}

// TestRecordTasks_RunEndsMeanwhile: the step events of an adopted run's
// tasks are appended on the state they were decided on; a run that ended
// between recordTasks' read and its append gets no StepStarted after its
// RunCompleted (not valid on a COMPLETED run): the tasks are decided again
// and nothing is left to record.
func TestRecordTasks_RunEndsMeanwhile(t *testing.T) {
	ctx := context.Background()
	env, r, rec, _ := runOfWorkflow(t)
	wf := &model.Workflow{WorkflowId: "wf-1", Tasks: []model.Task{{TaskType: "HTTP", Status: "COMPLETED", ReferenceTaskName: "call",
		TaskId: "t1", StartTime: 1_700_000_000_000, EndTime: 1_700_000_001_000}}}
	if _, _, err := r.recordTasks(ctx, &endAfterFirstRead{t: t, env: env, run: rec}, rec, wf, true, ""); err != nil {
		t.Fatal(err)
	}
	recs := env.events(t, rec.RunID)
	if _, alerts := statestore.Reduce(nil, recs); len(alerts) != 0 {
		t.Fatalf("recordTasks appended an event the projector flags: %s (log %s)", alerts[0].Reason, strings.Join(eventTypes(recs), " "))
	}
	if got := strings.Join(eventTypes(recs), " "); got != "RunStarted RunCompleted" {
		t.Fatalf("log %s, want RunStarted RunCompleted", got)
	}
}

// TestRecordTasks_WorkerTaskFollowedWhileDraining: a worker task of an
// adopted run in progress while the run's pause drains keeps the run's
// interval reads going (pending), so that its end is recorded from
// Conductor's report when its worker reports straight to Conductor (a task
// in progress at adoption): the drain ends then, not at its timeout. Before
// the pause, or once the drain ended, it costs no reads (its worker reports
// through the proxy, or the gate records the next step's reads).
func TestRecordTasks_WorkerTaskFollowedWhileDraining(t *testing.T) {
	ctx := context.Background()
	env, r, rec, emit := runOfWorkflow(t)
	wf := &model.Workflow{WorkflowId: "wf-1", Tasks: []model.Task{{TaskType: "resize", Status: "IN_PROGRESS", ReferenceTaskName: "f2",
		TaskId: "t2", StartTime: 1_700_000_000_000}}}
	if pending, _, err := r.recordTasks(ctx, env.store, rec, wf, true, ""); err != nil || !pending {
		t.Fatalf("adoption: pending %v %v, want the task started and followed", pending, err)
	}
	if pending, _, err := r.recordTasks(ctx, env.store, rec, wf, false, ""); err != nil || pending {
		t.Fatalf("running: pending %v %v, want no interval reads", pending, err)
	}
	timeout := int64(60)
	emit(statestore.RunPaused, statestore.RunPausedPayload{DrainTimeoutSeconds: &timeout})
	if pending, _, err := r.recordTasks(ctx, env.store, rec, wf, false, ""); err != nil || !pending {
		t.Fatalf("draining: pending %v %v, want the run read every interval until the task ends", pending, err)
	}
}

// TestAdoptedLabels_KeepsTheFirstByKey: a workflow input with more valid
// labels than a run may have keeps the first MaxLabels by key, the same
// ones on every replica; invalid ones are left out first.
func TestAdoptedLabels_KeepsTheFirstByKey(t *testing.T) {
	in := map[string]any{"bad key!": "x", "n": 3}
	for i := range MaxLabels + 36 {
		in[fmt.Sprintf("k%03d", i)] = "v"
	}
	for range 20 {
		got := adoptedLabels(&model.Workflow{Input: map[string]any{InputLabels: in}, CorrelationId: "order-42"})
		if len(got) != MaxLabels {
			t.Fatalf("%d labels, want %d", len(got), MaxLabels)
		}
		// correlationId sorts before k000: it and k000..k062 are kept.
		if _, ok := got[LabelCorrelationID]; !ok {
			t.Fatalf("correlationId dropped although it sorts first")
		}
		for i := range MaxLabels - 1 {
			if _, ok := got[fmt.Sprintf("k%03d", i)]; !ok {
				t.Fatalf("label k%03d dropped; want the first %d by key", i, MaxLabels)
			}
		}
	}
}

// TestRecordTasks_NoWorkerTaskStartedInsideAPause: a run the log has
// PAUSED, read again as at its adoption (the running-list read after a
// restart) while Conductor shows a worker task in progress (a worker that
// polls Conductor itself took it after a resume made there): the
// mid-flight rule records nothing inside the pause (docs/events.md,
// "Fences"); the step is recorded from Conductor's report, after the
// resume is in the log.
func TestRecordTasks_NoWorkerTaskStartedInsideAPause(t *testing.T) {
	ctx := context.Background()
	env, r, rec, emit := runOfWorkflow(t)
	timeout := int64(60)
	emit(statestore.RunPaused, statestore.RunPausedPayload{DrainTimeoutSeconds: &timeout})
	wf := &model.Workflow{WorkflowId: "wf-1", Tasks: []model.Task{{TaskType: "resize", Status: "IN_PROGRESS", ReferenceTaskName: "c1",
		TaskId: "t1", StartTime: 1_700_000_000_000}}}
	if _, _, err := r.recordTasks(ctx, env.store, rec, wf, true, ""); err != nil {
		t.Fatal(err)
	}
	if got := typesOf(env.events(t, rec.RunID)); strings.Join(got, " ") != "RunStarted RunPaused" {
		t.Fatalf("log %v, want nothing after RunPaused", got)
	}
}

// TestRecordTasks_WorkerTaskEndedInsideAPauseWaitsForTheResume: a worker
// task the gate never started (its worker polled Conductor directly) that
// ended while the log has the run PAUSED is not recorded inside the pause
// (no StepStarted after RunPaused, docs/events.md "Fences"): it is
// recorded, started and completed, once the log has the run running
// again.
func TestRecordTasks_WorkerTaskEndedInsideAPauseWaitsForTheResume(t *testing.T) {
	ctx := context.Background()
	env, r, rec, emit := runOfWorkflow(t)
	timeout := int64(60)
	emit(statestore.RunPaused, statestore.RunPausedPayload{DrainTimeoutSeconds: &timeout})
	wf := &model.Workflow{WorkflowId: "wf-1", Tasks: []model.Task{{TaskType: "resize", Status: "COMPLETED", ReferenceTaskName: "d1",
		TaskId: "t1", StartTime: 1_700_000_000_000, EndTime: 1_700_000_001_000}}}
	for _, adoption := range []bool{false, true} {
		if _, _, err := r.recordTasks(ctx, env.store, rec, wf, adoption, ""); err != nil {
			t.Fatal(err)
		}
		if got := typesOf(env.events(t, rec.RunID)); strings.Join(got, " ") != "RunStarted RunPaused" {
			t.Fatalf("adoption=%v: log %v, want nothing after RunPaused", adoption, got)
		}
	}
	emit(statestore.RunResumed, statestore.RunResumedPayload{})
	if _, _, err := r.recordTasks(ctx, env.store, rec, wf, false, ""); err != nil {
		t.Fatal(err)
	}
	if got := typesOf(env.events(t, rec.RunID)); strings.Join(got, " ") != "RunStarted RunPaused RunResumed StepStarted:d1 StepCompleted:d1" {
		t.Fatalf("log %v, want the step recorded after the resume", got)
	}
}

// TestRuns_AdoptedOutside: the active adopted runs of definitions that no
// spec adopts any more are counted by definition (serve warns of them at
// start: their steps are no longer recorded); runs of adopted definitions,
// finished runs and plan runs are not.
func TestRuns_AdoptedOutside(t *testing.T) {
	ctx := context.Background()
	env := newNATS(t)
	r, err := OpenRuns(ctx, env.connect(t), newClient(t, "http://127.0.0.1:1/api", 100*time.Millisecond), env.emitter, RunsOptions{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	adopt := func(name string, version int32) {
		t.Helper()
		wf := &model.Workflow{WorkflowId: uuid.NewString(), WorkflowName: name, WorkflowVersion: version, Status: "RUNNING", StartTime: 1_700_000_000_000}
		if _, err := r.adoptRun(ctx, wf, AdoptedIdentity{TenantID: "t", ProjectID: "p", EnvironmentID: "e"}); err != nil {
			t.Fatal(err)
		}
	}
	adopt("orders", 1)
	adopt("orders", 2)
	adopt("billing", 1)
	adopt("billing", 1)
	got, err := r.AdoptedOutside(ctx, []AdoptSpec{{Name: "orders", Version: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"orders:1": 1, "billing:1": 2}; !reflect.DeepEqual(got, want) {
		t.Fatalf("adopted runs outside the specs: %v, want %v", got, want)
	}
	if got, err := r.AdoptedOutside(ctx, []AdoptSpec{{Name: "orders"}, {Name: "billing"}}); err != nil || len(got) != 0 {
		t.Fatalf("every definition adopted: %v %v, want none", got, err)
	}
}

// TestRecordTasks_AnEndedJoinOrLoopAfterWhatItWaitedFor: one read that
// finds a JOIN (or a loop) ended together with tasks of its branches (its
// body) the log lacks records the JOIN's end after their starts and ends,
// though Conductor created the JOIN first (its order of tasks); a task
// that began after the JOIN ended comes after it, and a FORK stays before
// its branches whatever its end time. Times as Conductor reported them.
func TestRecordTasks_AnEndedJoinOrLoopAfterWhatItWaitedFor(t *testing.T) {
	const t0 = 1_700_000_000_000
	task := func(typ, ref, status string, scheduled, start, end int64) model.Task {
		return model.Task{TaskType: typ, ReferenceTaskName: ref, TaskId: ref, Status: model.TaskResultStatus(status),
			ScheduledTime: t0 + scheduled, StartTime: t0 + start, EndTime: t0 + end}
	}
	for _, c := range []struct {
		name  string
		tasks []model.Task
		want  string
	}{
		{"Join", []model.Task{
			// Conductor may end a FORK (a SWITCH) a moment after the
			// start of what it scheduled: it stays first.
			task("FORK", "fork", "COMPLETED", 0, 0, 3),
			task("INLINE", "b1", "COMPLETED", 0, 1, 2),
			task("JOIN", "join", "COMPLETED", 0, 0, 199),
			task("INLINE", "inl", "COMPLETED", 100, 120, 125),
			task("JSON_JQ_TRANSFORM", "jq", "COMPLETED", 125, 126, 126),
			task("INLINE", "after", "COMPLETED", 199, 200, 201),
		}, "fork fork b1 b1 inl inl jq jq join join after after"},
		{"Loop", []model.Task{
			task("DO_WHILE", "loop", "COMPLETED", 0, 0, 239),
			task("INLINE", "inl__1", "COMPLETED", 1, 2, 3),
			task("INLINE", "inl__2", "COMPLETED", 100, 101, 102),
			task("INLINE", "inl__3", "COMPLETED", 200, 220, 226),
			task("INLINE", "next", "COMPLETED", 239, 240, 241),
		}, "inl__1 inl__1 inl__2 inl__2 inl__3 inl__3 loop loop next next"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			env, r, rec, _ := runOfWorkflow(t)
			wf := &model.Workflow{WorkflowId: "wf-1", Status: model.RunningWorkflow, Tasks: c.tasks}
			if _, _, err := r.recordTasks(ctx, env.store, rec, wf, false, ""); err != nil {
				t.Fatal(err)
			}
			var steps []string
			for _, ev := range env.events(t, rec.RunID)[1:] {
				steps = append(steps, ev.StepID)
			}
			if got := strings.Join(steps, " "); got != c.want {
				t.Fatalf("steps of the log in order: %s\nwant %s", got, c.want)
			}
		})
	}
}

// TestRecordTasks_ATimedOutTryNobodyHeld: a worker task the mid-flight
// rule recorded started (in progress at adoption: its poll's worker hung
// up, or polled Conductor directly and died) that Conductor timed out and
// retries ends its try in the log (RunStepTryEnded, taskTimedOut), so
// that a pause's drain does not wait for it; the retry, not polled yet,
// adds nothing.
func TestRecordTasks_ATimedOutTryNobodyHeld(t *testing.T) {
	ctx := context.Background()
	env, r, rec, _ := runOfWorkflow(t)
	running := &model.Workflow{WorkflowId: "wf-1", Status: model.RunningWorkflow, Tasks: []model.Task{
		{TaskType: "resize", Status: "IN_PROGRESS", ReferenceTaskName: "h", TaskId: "t1", StartTime: 1_700_000_000_000}}}
	if _, _, err := r.recordTasks(ctx, env.store, rec, running, true, ""); err != nil {
		t.Fatal(err)
	}
	timedOut := &model.Workflow{WorkflowId: "wf-1", Status: model.RunningWorkflow, Tasks: []model.Task{
		{TaskType: "resize", Status: "TIMED_OUT", Retried: true, ReferenceTaskName: "h", TaskId: "t1", StartTime: 1_700_000_000_000, EndTime: 1_700_000_015_000},
		{TaskType: "resize", Status: "SCHEDULED", RetryCount: 1, ReferenceTaskName: "h", TaskId: "t2", ScheduledTime: 1_700_000_015_000}}}
	for range 2 { // the second read adds nothing
		if _, _, err := r.recordTasks(ctx, env.store, rec, timedOut, false, ""); err != nil {
			t.Fatal(err)
		}
	}
	recs := env.events(t, rec.RunID)
	if got := strings.Join(typesOf(recs), " "); got != "RunStarted StepStarted:h RunStepTryEnded" {
		t.Fatalf("log %s, want the timed-out try ended", got)
	}
	snap, _ := statestore.Reduce(nil, recs)
	if st := snap.Step("h"); len(snap.InFlight()) != 0 || st.IdleReason != statestore.TryEndedTaskTimedOut {
		t.Fatalf("step h %+v, in flight %v: want idle, taskTimedOut", st, snap.InFlight())
	}
}

// TestRecordTasks_AHeldTaskEndedByHandIsTheRetrysFirstTry: an adopted
// run's held step, retried by the operator, whose held task was completed
// in Conductor by hand after two engine retries: the retried attempt is
// recorded as one try of its own (engineAttemptId 1), as when a worker
// runs it, not at the held task's retryCount + 1.
func TestRecordTasks_AHeldTaskEndedByHandIsTheRetrysFirstTry(t *testing.T) {
	ctx := context.Background()
	env, r, rec, emit := runOfWorkflow(t)
	step := func(eventType string, engine, logical int64, payload any) {
		t.Helper()
		ev, err := statestore.NewEvent(statestore.RunRef{RunID: rec.RunID, TenantID: rec.TenantID, ProjectID: rec.ProjectID,
			EnvironmentID: rec.EnvironmentID, PlanID: rec.PlanID, PlanVersion: rec.PlanVersion}, eventType, "r", engine, logical, payload)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.emitter.Emit(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	step(statestore.StepStarted, 3, 1, statestore.StepStartedPayload{})
	step(statestore.StepFailed, 3, 1, statestore.StepFailedPayload{Error: &statestore.StepError{Code: "EXTERNAL_WORKER_FAILED", Message: "no", Retryable: true}, OnStepFailure: "pause"})
	timeout := int64(60)
	emit(statestore.RunPaused, statestore.RunPausedPayload{DrainTimeoutSeconds: &timeout, Reason: "stepFailed", StepID: "r"})
	emit(statestore.RunStepRetryRequested, statestore.RunStepRetryRequestedPayload{StepID: "r", StepLogicalAttemptID: 2})
	emit(statestore.RunResumed, statestore.RunResumedPayload{})
	wf := &model.Workflow{WorkflowId: "wf-1", Status: model.PausedWorkflow, Tasks: []model.Task{{TaskType: "resize", Status: "COMPLETED", RetryCount: 2,
		ReferenceTaskName: "r", TaskId: "t3", StartTime: 1_700_000_000_000, EndTime: 1_700_000_001_000}}}
	if _, _, err := r.recordTasks(ctx, env.store, rec, wf, false, ""); err != nil {
		t.Fatal(err)
	}
	recs := env.events(t, rec.RunID)
	var got []string
	for _, ev := range recs {
		if ev.StepID == "r" && ev.LogicalAttemptID == 2 {
			got = append(got, fmt.Sprintf("%s %d.%d", ev.EventType, ev.LogicalAttemptID, ev.EngineAttemptID))
		}
	}
	if strings.Join(got, ", ") != "StepStarted 2.1, StepCompleted 2.1" {
		t.Fatalf("the retried attempt: %v, want StepStarted 2.1, StepCompleted 2.1 (log %v)", got, typesOf(recs))
	}
}
