package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// startRetried starts a run of one external step x0 whose task Conductor
// times out after timeout seconds without a report, and then tries again
// (engineTries tries in all); it returns the runId and workflowId.
func (e *env) startRetried(t *testing.T, timeout int64, engineTries int) (string, string) {
	t.Helper()
	return e.startPlan(t, &plan.Plan{PlanID: "proxy-" + uuid.NewString()[:8], PlanVersion: "1", Steps: []plan.Step{{StepID: "x0",
		TimeoutSeconds: timeout, Retries: plan.RetryPolicy{EngineTries: engineTries},
		Executor: plan.ExecutorSpec{Type: plan.ExecutorExternal, TaskType: e.tt}}}})
}

// timeOut has Conductor time the task out (its response timeout passed;
// Conductor's sweeper does the same, later), as a dead worker leaves it.
func (e *env) timeOut(t *testing.T, wfID, taskID string) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, "Conductor to time the task out", time.Minute, func() bool {
		if err := e.client.Decide(ctx, wfID); err != nil {
			t.Fatal(err)
		}
		got, err := e.client.Task(ctx, taskID)
		return err == nil && got.Status == "TIMED_OUT"
	})
}

// heldReads is a front before Conductor for the task workers that holds
// their first read of one task (GET /tasks/{id}: the watch's) until
// released; every other call passes.
type heldReads struct {
	mu       sync.Mutex
	taskID   string
	held     chan struct{} // closed when the read is held
	release  chan struct{}
	answered chan struct{} // closed when the held read was answered
	once     bool
	stop     sync.Once
}

// let releases the held read (at once for a read held later).
func (h *heldReads) let() { h.stop.Do(func() { close(h.release) }) }

func newHeldReads() *heldReads {
	return &heldReads{held: make(chan struct{}), release: make(chan struct{}), answered: make(chan struct{})}
}

func (h *heldReads) hold(taskID string) {
	h.mu.Lock()
	h.taskID = taskID
	h.mu.Unlock()
}

func (h *heldReads) front(t *testing.T) func(string) string {
	return func(curl string) string {
		u, err := url.Parse(curl)
		if err != nil {
			t.Fatal(err)
		}
		rp := conductortest.ReverseProxy(t, u)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.mu.Lock()
			hold := !h.once && h.taskID != "" && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/tasks/"+h.taskID)
			if hold {
				h.once = true
			}
			h.mu.Unlock()
			if !hold {
				rp.ServeHTTP(w, r)
				return
			}
			close(h.held)
			select {
			case <-h.release:
			case <-time.After(2 * time.Minute):
			}
			rp.ServeHTTP(w, r)
			close(h.answered)
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(h.let) // before the front closes: a failed test does not wait on the held read
		return srv.URL + u.Path
	}
}

// TestProxy_NextTryBeforeTheWatchSawTheTimeout: Conductor times a dead
// worker's try out and hands its next try to another worker before the
// watch has read the first one back. The next try's start is recorded
// (RunStepTryStarted with its engine attempt), and the watch's late
// finding that the first try ended does not end the next one: the step
// stays in flight, so a drain waits for the worker that runs it. A late
// report of the first try is refused (409 PROXY_TRY_TIMED_OUT), not
// recorded. Before, the next try was run with nothing recorded, and the
// first try's RunStepTryEnded marked the step idle while it ran: a pause
// ended its drain at once.
func TestProxy_NextTryBeforeTheWatchSawTheTimeout(t *testing.T) {
	h := newHeldReads()
	done := make(chan string, 16)
	e := newEnvOpts(t, envOpts{workerConductor: h.front(t),
		taskDone: func(runID string, _, _ bool) { done <- runID }})
	runID, wfID := e.startRetried(t, 2, 2)
	first := e.pollOne(t)
	h.hold(first.TaskID)
	select { // the watch reads the first try back after its 2 s, and is held
	case <-h.held:
	case <-time.After(time.Minute):
		t.Fatal("the watch did not read the task back")
	}
	e.timeOut(t, wfID, first.TaskID)
	next := e.pollOne(t)
	if next.TaskID == first.TaskID {
		t.Fatal("the same try handed out twice")
	}
	snap, err := e.store.ProjectSnapshot(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	if st := snap.Step("x0"); st == nil || st.Idle || st.EngineAttemptID != 2 {
		t.Fatalf("the step as the next try is handed out: %+v, want in flight at engine attempt 2", st)
	}
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": first.TaskID, "workflowInstanceId": first.WorkflowInstanceID,
		"status": "COMPLETED", "outputData": map[string]any{"late": true}, "workerId": "dead-worker"})
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), proxy.CodeTryTimedOut) {
		t.Fatalf("the first try's late report: %d %s, want 409 %s", resp.StatusCode, body, proxy.CodeTryTimedOut)
	}
	h.let()
	<-h.answered
	select { // the watch's finding, handed to the drain monitor
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the watch did not finish its check")
	}
	snap, err = e.store.ProjectSnapshot(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	if st := snap.Step("x0"); st == nil || st.Idle || st.EngineAttemptID != 2 {
		t.Fatalf("the step after the watch found the first try ended: %+v, want the next try still in flight", st)
	}
	// The first try's end, found by the refused report, is recorded once
	// at most, and none is recorded after the next try started.
	var ends []statestore.RunEventRecord
	for _, r := range e.events(t, runID) {
		if r.EventType == statestore.RunStepTryEnded {
			ends = append(ends, r)
		}
	}
	if len(ends) > 0 {
		t.Fatalf("%d RunStepTryEnded recorded after the next try started (%s): an end of a try the log shows replaced", len(ends), ends[0].Payload)
	}
	resp, body = call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": next.TaskID, "workflowInstanceId": next.WorkflowInstanceID,
		"status": "COMPLETED", "outputData": map[string]any{"by": "worker"}, "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the next try's report: %d %s", resp.StatusCode, body)
	}
	recs := e.events(t, runID)
	var completed []statestore.RunEventRecord
	for _, r := range recs {
		if r.EventType == statestore.StepCompleted {
			completed = append(completed, r)
		}
	}
	if len(completed) != 1 || completed[0].EngineAttemptID != 2 {
		t.Fatalf("StepCompleted records %+v, want one of engine attempt 2", completed)
	}
}

// TestProxy_LateReportAfterARestartIsRefused: serve stops while an outside
// worker holds a task; Conductor times the task out while serve is down;
// the worker's report arrives at the restarted serve, which never watched
// the task. The report is refused (409 PROXY_TRY_TIMED_OUT) and not
// recorded (Conductor ignores a report of a timed-out task), the try is
// recorded ended, and the next try is handed to the worker and its
// outcome recorded. Before, the late report was recorded as the step's
// outcome, and the sidecar then completed Conductor's next try itself,
// with no output, without any worker running it.
func TestProxy_LateReportAfterARestartIsRefused(t *testing.T) {
	e := newEnv(t)
	runID, wfID := e.startRetried(t, 2, 2)
	first := e.pollOne(t)
	ctx := context.Background()
	_ = e.proxy.Close(ctx) // serve stops
	_ = e.worker.Close(ctx)
	e.timeOut(t, wfID, first.TaskID)
	e = newEnvOpts(t, envOpts{shareLogOf: e}) // serve starts again
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": first.TaskID, "workflowInstanceId": first.WorkflowInstanceID,
		"status": "COMPLETED", "outputData": map[string]any{"late": true}, "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), proxy.CodeTryTimedOut) {
		t.Fatalf("the report of the timed-out try: %d %s, want 409 %s", resp.StatusCode, body, proxy.CodeTryTimedOut)
	}
	recs := e.events(t, runID)
	if n := count(recs, statestore.StepCompleted); n != 0 {
		t.Fatalf("the report of the timed-out try was recorded: %d StepCompleted", n)
	}
	if n := count(recs, statestore.RunStepTryEnded); n != 1 {
		t.Fatalf("%d RunStepTryEnded after the refused report, want 1 (the timed-out try)", n)
	}
	next := e.pollOne(t)
	resp, body = call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": next.TaskID, "workflowInstanceId": next.WorkflowInstanceID,
		"status": "COMPLETED", "outputData": map[string]any{"by": "worker"}, "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the next try's report: %d %s", resp.StatusCode, body)
	}
	got, err := e.client.Task(ctx, next.TaskID)
	if err != nil || got.Status != "COMPLETED" || fmt.Sprint(got.OutputData["by"]) != "worker" {
		t.Fatalf("Conductor's next try: %v %v %v, want COMPLETED with the worker's output", got.Status, got.OutputData, err)
	}
	recs = e.events(t, runID)
	for _, r := range recs {
		if r.EventType == statestore.StepCompleted && r.EngineAttemptID != 2 {
			t.Fatalf("StepCompleted of engine attempt %d, want 2", r.EngineAttemptID)
		}
	}
}

// TestProxy_ReportOfAnEndedWorkflowsTaskOnEveryReplica: the workflow ends
// (terminated: a cancel) while an outside worker holds a task; its report
// in time is recorded and forwarded (Conductor keeps the task CANCELED
// and answers 200) whichever replica takes it: the one that handed the
// task out, or another, which reads the task from Conductor. No try
// follows a cancelled task, so the report is the step's last word, as an
// own worker's outcome after a cancel is.
func TestProxy_ReportOfAnEndedWorkflowsTaskOnEveryReplica(t *testing.T) {
	e := newEnv(t)
	other := newEnvOpts(t, envOpts{shareLogOf: e})
	runID, wfID := e.start(t, 2, 60)
	tasks := e.pollBatch(t, 2)
	waitFor(t, "both tasks", 10*time.Second, func() bool {
		if len(tasks) < 2 {
			tasks = append(tasks, e.pollBatch(t, 2-len(tasks))...)
		}
		return len(tasks) == 2
	})
	if err := e.client.Terminate(context.Background(), wfID, "cancelled by a test"); err != nil {
		t.Fatal(err)
	}
	for i, via := range []*env{e, other} {
		resp, body := call(t, http.MethodPost, via.url+"/tasks", map[string]any{"taskId": tasks[i].TaskID, "workflowInstanceId": tasks[i].WorkflowInstanceID,
			"status": "COMPLETED", "outputData": map[string]any{"by": "worker"}, "workerId": "sdk-worker"})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("report %d (through the %s replica): %d %s, want 200 as Conductor answers it", i, []string{"handing", "other"}[i], resp.StatusCode, body)
		}
	}
	if n := count(e.events(t, runID), statestore.StepCompleted); n != 2 {
		t.Fatalf("%d StepCompleted, want both reports recorded", n)
	}
}
