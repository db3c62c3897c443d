package adapter

import (
	"reflect"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/errcode"

	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zaptest"
)

func TestNewClient(t *testing.T) {
	for _, u := range []string{"localhost:8080", "ftp://x/api", "http://", "::"} {
		if _, err := NewClient(ClientOptions{BaseURL: u}); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("NewClient(%q): got %v, want ErrInvalidInput", u, err)
		}
	}
	c, err := NewClient(ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.BaseURL() != DefaultBaseURL {
		t.Errorf("got base %s, want %s", c.BaseURL(), DefaultBaseURL)
	}
}

func TestClient_Unavailable(t *testing.T) {
	ctx := context.Background()
	t.Run("ConnectionRefused", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		m := NewMetrics(reg)
		c, err := NewClient(ClientOptions{BaseURL: unusedURL(t), Timeout: time.Second, Logger: zaptest.NewLogger(t), Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		calls := map[string]func() error{
			"Workflow":  func() error { _, err := c.Workflow(ctx, "w", false); return err },
			"Start":     func() error { _, err := c.StartWorkflow(ctx, model.StartWorkflowRequest{Name: "x"}); return err },
			"Pause":     func() error { return c.Pause(ctx, "w") },
			"Resume":    func() error { return c.Resume(ctx, "w") },
			"Terminate": func() error { return c.Terminate(ctx, "w", "r") },
			"Retry":     func() error { return c.Retry(ctx, "w") },
			"Poll":      func() error { _, err := c.BatchPoll(ctx, "t", "w", 1, 0); return err },
			"Update": func() error {
				return c.UpdateTask(ctx, &model.TaskResult{TaskId: "t", WorkflowInstanceId: "w", Status: model.CompletedTask})
			},
			"Task":   func() error { _, err := c.Task(ctx, "t"); return err },
			"Health": func() error { return c.Health(ctx) },
			"Defs":   func() error { return c.RegisterTaskDefs(ctx, []model.TaskDef{{Name: "x"}}) },
		}
		for name, call := range calls {
			err := call()
			if !errors.Is(err, ErrEngineUnavailable) || errcode.CodeOf(err) != CodeEngineUnavailable {
				t.Errorf("%s: got %v (code %q), want ENGINE_UNAVAILABLE", name, err, errcode.CodeOf(err))
			}
		}
		if got := counterValue(t, m.requests[[2]string{opGetWorkflow, CodeEngineUnavailable}]); got != 1 {
			t.Errorf("get_workflow ENGINE_UNAVAILABLE counter = %v, want 1", got)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		// A listener that accepts and never answers: the call must end at
		// the client timeout with ENGINE_UNAVAILABLE.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				defer conn.Close()
			}
		}()
		c := newClient(t, "http://"+l.Addr().String()+"/api", 200*time.Millisecond)
		start := time.Now()
		_, err = c.Workflow(ctx, "w", false)
		if !errors.Is(err, ErrEngineUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want ENGINE_UNAVAILABLE wrapping context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("timeout took %s, want about 200ms", d)
		}
	})
	t.Run("Canceled", func(t *testing.T) {
		c := newClient(t, unusedURL(t), time.Second)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := c.Workflow(cctx, "w", false)
		if !errors.Is(err, context.Canceled) || errors.Is(err, ErrEngineUnavailable) {
			t.Fatalf("got %v, want context.Canceled and not ENGINE_UNAVAILABLE", err)
		}
	})
	t.Run("InvalidInput", func(t *testing.T) {
		c := newClient(t, unusedURL(t), time.Second)
		if _, err := c.BatchPoll(ctx, "t", "", 1, 0); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("poll without workerId: got %v, want ErrInvalidInput", err)
		}
		if err := c.UpdateTask(ctx, &model.TaskResult{TaskId: "t"}); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("update without workflowId: got %v, want ErrInvalidInput", err)
		}
		if err := c.RegisterWorkflowDefJSON(ctx, []byte("{")); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("register bad JSON: got %v, want ErrInvalidInput", err)
		}
	})
}

// startTestWorkflow registers a one-task workflow of its own task type and
// starts it.
func startTestWorkflow(t *testing.T, c *Client) (def model.WorkflowDef, taskType, workflowID string) {
	t.Helper()
	ctx := context.Background()
	s := suffix(t)
	taskType = "sidecar_test_" + s
	def = model.WorkflowDef{
		Name: "sidecar_test_wf_" + s, Version: 1, OwnerEmail: "sidecar-tests@example.com", SchemaVersion: 2,
		Tasks: []model.WorkflowTask{{
			Name: taskType, TaskReferenceName: "step1", Type_: "SIMPLE",
			InputParameters: map[string]any{"runId": "${workflow.input.runId}"},
		}},
	}
	if err := c.RegisterTaskDefs(ctx, []model.TaskDef{{Name: taskType, OwnerEmail: "sidecar-tests@example.com",
		TimeoutSeconds: 120, ResponseTimeoutSeconds: 60, TimeoutPolicy: "TIME_OUT_WF"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.RegisterWorkflowDef(ctx, def); err != nil {
		t.Fatal(err)
	}
	id, err := c.StartWorkflow(ctx, model.StartWorkflowRequest{Name: def.Name, Version: 1, Input: map[string]any{"runId": "r"}})
	if err != nil {
		t.Fatal(err)
	}
	return def, taskType, id
}

func TestClient_Conductor(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	c := newClient(t, u, 30*time.Second)

	t.Run("Health", func(t *testing.T) {
		if err := c.Health(ctx); err != nil {
			t.Fatal(err)
		}
	})
	// The server's root instead of its API base (the most common mistake
	// in a Conductor URL): /health answers there, every API call 404.
	// Health says so, and what to give instead; before, it was healthy,
	// and serve ready while every Conductor call failed.
	t.Run("HealthOfTheServersRoot", func(t *testing.T) {
		root := strings.TrimSuffix(strings.TrimSuffix(u, "/"), "/api")
		err := newClient(t, root, 30*time.Second).Health(ctx)
		if !errors.Is(err, ErrConductorURLInvalid) || !strings.Contains(err.Error(), root+"/api") {
			t.Fatalf("Health of %s: %v, want %s naming %s/api", root, err, CodeConductorURLInvalid, root)
		}
		// A registration, which no API refuses with 404, says so too (a
		// run submitted to a sidecar on such a URL): NOT_FOUND before,
		// which the CLI read as "no such run".
		err = newClient(t, root, 30*time.Second).RegisterTaskDefs(ctx, plan.TaskDefs())
		if !errors.Is(err, ErrConductorURLInvalid) {
			t.Fatalf("a registration at %s: %v, want %s", root, err, CodeConductorURLInvalid)
		}
		// A path under which no Conductor is: nothing answers /health.
		wrong := root + "/conductor/api"
		if err := newClient(t, wrong, 30*time.Second).Health(ctx); !errors.Is(err, ErrConductorURLInvalid) {
			t.Fatalf("Health of %s: %v, want %s", wrong, err, CodeConductorURLInvalid)
		}
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		const unknown = "00000000-0000-4000-8000-000000000000"
		checks := map[string]error{}
		_, checks["Workflow"] = c.Workflow(ctx, unknown, false)
		checks["Terminate"] = c.Terminate(ctx, unknown, "x")
		checks["Pause"] = c.Pause(ctx, unknown)
		checks["Retry"] = c.Retry(ctx, unknown)
		_, checks["Task"] = c.Task(ctx, unknown) // 204 on 3.21, 404 on 3.32
		checks["UpdateTask"] = c.UpdateTask(ctx, &model.TaskResult{TaskId: unknown, WorkflowInstanceId: unknown, Status: model.CompletedTask})
		_, checks["WorkflowDef"] = c.WorkflowDef(ctx, "sidecar_no_such_wf_"+suffix(t), 1)
		_, checks["StartWorkflow"] = c.StartWorkflow(ctx, model.StartWorkflowRequest{Name: "sidecar_no_such_wf_" + suffix(t), Version: 1})
		for name, err := range checks {
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("%s: got %v, want NOT_FOUND", name, err)
			}
		}
	})
	t.Run("ErrEngineRejected", func(t *testing.T) {
		// A task without a reference name: refused with 400 by every supported
		// version (a missing ownerEmail is refused by 3.21 only).
		err := c.RegisterWorkflowDef(ctx, model.WorkflowDef{Name: "sidecar_bad_" + suffix(t), Version: 1, SchemaVersion: 2,
			OwnerEmail: "sidecar-test@example.com", Tasks: []model.WorkflowTask{{Name: "x", Type_: "SIMPLE"}}})
		var e *Error
		if !errors.Is(err, ErrEngineRejected) || !errors.As(err, &e) || e.Status != 400 {
			t.Fatalf("got %v, want ENGINE_REJECTED with HTTP 400", err)
		}
	})
	t.Run("Lifecycle", func(t *testing.T) {
		def, taskType, id := startTestWorkflow(t, c)
		wf, err := c.Workflow(ctx, id, true)
		if err != nil {
			t.Fatal(err)
		}
		if wf.Status != model.RunningWorkflow || wf.WorkflowName != def.Name || len(wf.Tasks) != 1 {
			t.Fatalf("got status %s name %s tasks %d", wf.Status, wf.WorkflowName, len(wf.Tasks))
		}
		// Without tasks, the workflow is decoded in part (workflowHead):
		// every field the adapter reads equals the SDK's whole decode.
		head, err := c.Workflow(ctx, id, false)
		if err != nil {
			t.Fatal(err)
		}
		type fields struct {
			ID, Name, Status, Reason, Correlation string
			Version                               int32
			Start, End                            int64
			Input                                 map[string]any
			Domains                               map[string]string
		}
		of := func(w *model.Workflow) fields {
			return fields{w.WorkflowId, w.WorkflowName, string(w.Status), w.ReasonForIncompletion, w.CorrelationId,
				w.WorkflowVersion, w.StartTime, w.EndTime, w.Input, w.TaskToDomain}
		}
		if got, want := of(head), of(wf); !reflect.DeepEqual(got, want) || got.Start == 0 || len(got.Input) == 0 {
			t.Fatalf("workflow without tasks:\n got %+v\nwant %+v", got, want)
		}
		// Resume of a RUNNING workflow: Conductor says 500, we say CONFLICT.
		var e *Error
		if err := c.Resume(ctx, id); !errors.Is(err, ErrConflict) || !errors.As(err, &e) || e.EngineStatus != "RUNNING" || e.Status != 500 {
			t.Fatalf("resume running: got %v, want CONFLICT with engine status RUNNING", err)
		}
		// Retry of a RUNNING workflow: Conductor says 404, we say CONFLICT.
		if err := c.Retry(ctx, id); !errors.Is(err, ErrConflict) {
			t.Fatalf("retry running: got %v, want CONFLICT", err)
		}
		for range 2 { // pause of a PAUSED workflow is a no-op
			if err := c.Pause(ctx, id); err != nil {
				t.Fatalf("pause: %v", err)
			}
		}
		if err := c.Resume(ctx, id); err != nil {
			t.Fatalf("resume paused: %v", err)
		}
		ids, err := c.RunningWorkflows(ctx, def.Name, 1)
		if err != nil || len(ids) != 1 || ids[0] != id {
			t.Fatalf("running: got %v %v, want [%s]", ids, err, id)
		}
		tasks, err := c.BatchPoll(ctx, taskType, "test-worker", 4, 100*time.Millisecond)
		if err != nil || len(tasks) != 1 {
			t.Fatalf("poll: got %d tasks, %v", len(tasks), err)
		}
		if got := tasks[0].InputData["runId"]; got != "r" {
			t.Errorf("task input runId = %v, want r", got)
		}
		empty, err := c.BatchPoll(ctx, taskType, "test-worker", 4, 100*time.Millisecond)
		if err != nil || empty == nil || len(empty) != 0 {
			t.Fatalf("empty poll: got %v %v, want [] and no error", empty, err)
		}
		got, err := c.Task(ctx, tasks[0].TaskId)
		if err != nil || got.TaskId != tasks[0].TaskId {
			t.Fatalf("task: %v %v", got, err)
		}
		// A poll decodes only the fields the workers read (PolledTask):
		// each of them as the full task has it.
		p := tasks[0]
		if p.TaskType != got.TaskType || p.Status != got.Status || p.ReferenceTaskName != got.ReferenceTaskName ||
			p.WorkflowInstanceId != id || got.WorkflowInstanceId != id || p.WorkerId != "test-worker" || p.WorkerId != got.WorkerId ||
			p.RetryCount != got.RetryCount || p.PollCount != got.PollCount || p.PollCount < 1 ||
			p.ScheduledTime != got.ScheduledTime || p.ScheduledTime == 0 ||
			p.ResponseTimeoutSeconds != got.ResponseTimeoutSeconds || p.ResponseTimeoutSeconds == 0 ||
			p.Domain != got.Domain || !reflect.DeepEqual(p.InputData, got.InputData) {
			t.Errorf("polled task %+v\ndiffers from the task %+v", p, got)
		}
		if err := c.UpdateTask(ctx, &model.TaskResult{TaskId: tasks[0].TaskId, WorkflowInstanceId: id,
			Status: model.FailedTask, ReasonForIncompletion: "boom",
			Logs: []model.TaskExecLog{{Log: "it broke", TaskId: tasks[0].TaskId}}}); err != nil {
			t.Fatal(err)
		}
		wf = waitStatus(t, c, id, model.FailedWorkflow)
		if wf.ReasonForIncompletion == "" {
			t.Error("failed workflow has no reasonForIncompletion")
		}
		if err := c.Retry(ctx, id); err != nil { // 204 on a FAILED workflow
			t.Fatalf("retry failed: %v", err)
		}
		waitStatus(t, c, id, model.RunningWorkflow)
		for range 2 { // terminate twice is fine
			if err := c.Terminate(ctx, id, "test over"); err != nil {
				t.Fatalf("terminate: %v", err)
			}
		}
		wf = waitStatus(t, c, id, model.TerminatedWorkflow)
		if wf.ReasonForIncompletion != "test over" {
			t.Errorf("reason %q, want %q", wf.ReasonForIncompletion, "test over")
		}
		if err := c.Pause(ctx, id); !errors.Is(err, ErrConflict) {
			t.Fatalf("pause terminated: got %v, want CONFLICT", err)
		}
		if err := c.Resume(ctx, id); !errors.Is(err, ErrConflict) || !errors.As(err, &e) || e.EngineStatus != "TERMINATED" {
			t.Fatalf("resume terminated: got %v, want CONFLICT (TERMINATED)", err)
		}
	})
}

// waitStatus polls the workflow until it has status (at most 10 s).
func waitStatus(t *testing.T, c *Client, id string, status model.WorkflowStatus) *model.Workflow {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		wf, err := c.Workflow(context.Background(), id, false)
		if err == nil && wf.Status == status {
			return wf
		}
		if time.Now().After(deadline) {
			t.Fatalf("workflow %s: status %v (err %v), want %s", id, wf, err, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestNotPausedStatus: Conductor's refusal to resume a workflow that is
// not paused is recognized by its words, with the status it names; a
// refusal read after a concurrent pause is still a refusal.
func TestNotPausedStatus(t *testing.T) {
	for _, tt := range []struct {
		msg, status string
		ok          bool
	}{
		{"The workflow 8d7a is not PAUSED so cannot resume. Current status is RUNNING", "RUNNING", true},
		{"The workflow 8d7a is not PAUSED so cannot resume. Current status is COMPLETED.", "COMPLETED", true},
		{"The workflow 8d7a is not PAUSED so cannot resume.", "", true},
		{"Error while executing the request: connection reset", "", false},
	} {
		status, ok := notPausedStatus(tt.msg)
		if status != tt.status || ok != tt.ok {
			t.Errorf("notPausedStatus(%q) = %q, %v; want %q, %v", tt.msg, status, ok, tt.status, tt.ok)
		}
	}
}

// TestClient_Many: the bulk calls pause, resume and terminate workflows
// in requests of bulkMax ids (here 2: 5 workflows and an unknown take 3), and
// answer a workflow Conductor refused with the single call's error:
// NOT_FOUND for an unknown one, CONFLICT (engine status RUNNING) for the
// resume of one that runs, INVALID_INPUT for an empty id.
func TestClient_Many(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	c, err := NewClient(ClientOptions{BaseURL: u, Timeout: 30 * time.Second, Logger: zaptest.NewLogger(t), Metrics: NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	c.bulkMax = 2
	def, _, first := startTestWorkflow(t, c)
	ids := []string{first}
	for range 4 {
		id, err := c.StartWorkflow(ctx, model.StartWorkflowRequest{Name: def.Name, Version: 1, Input: map[string]any{"runId": "r"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	const unknown = "00000000-0000-4000-8000-000000000000"
	requests := func(op string) float64 {
		return counterValue(t, c.metrics.requests[[2]string{op, resultOK}])
	}
	before := requests(opBulkPause)
	errs := c.PauseMany(ctx, append(append([]string{}, ids...), unknown, ""))
	if got := requests(opBulkPause) - before; got != 3 {
		t.Errorf("%v bulk pause requests for 6 ids, 2 a request, want 3 (the empty id is not sent)", got)
	}
	if len(errs) != 2 || !errors.Is(errs[unknown], ErrNotFound) || !errors.Is(errs[""], ErrInvalidInput) {
		t.Fatalf("pause: errors %v, want NOT_FOUND for the unknown and INVALID_INPUT for the empty id only", errs)
	}
	for _, id := range ids {
		waitStatus(t, c, id, model.PausedWorkflow)
	}
	if errs := c.ResumeMany(ctx, ids[:3]); len(errs) != 0 {
		t.Fatalf("resume: %v", errs)
	}
	var e *Error
	errs = c.ResumeMany(ctx, ids)
	if len(errs) != 3 || !errors.As(errs[ids[0]], &e) || !errors.Is(e, ErrConflict) || e.EngineStatus != "RUNNING" {
		t.Fatalf("resume of 3 running and 2 paused: errors %v, want CONFLICT (RUNNING) for the 3", errs)
	}
	if errs := c.TerminateMany(ctx, ids, "over"); len(errs) != 0 {
		t.Fatalf("terminate: %v", errs)
	}
	for _, id := range ids {
		if wf := waitStatus(t, c, id, model.TerminatedWorkflow); wf.ReasonForIncompletion != "over" {
			t.Errorf("%s: reason %q, want over", id, wf.ReasonForIncompletion)
		}
	}
}
