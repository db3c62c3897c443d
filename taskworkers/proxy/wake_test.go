package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/taskworkers"
)

// pollCounter is a pass-through to the real Conductor that counts the
// batch polls (GET .../tasks/poll/batch/{type}) per task type.
type pollCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *pollCounter) front(t *testing.T, conductorURL string) string {
	t.Helper()
	target, err := url.Parse(conductorURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if i := strings.Index(r.URL.Path, "/tasks/poll/batch/"); i >= 0 && r.Method == http.MethodGet {
			c.mu.Lock()
			c.counts[r.URL.Path[i+len("/tasks/poll/batch/"):]]++
			c.mu.Unlock()
		}
		rp.ServeHTTP(rw, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + target.Path
}

func (c *pollCounter) of(taskType string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[taskType]
}

// startPlan starts a run of p and returns its runId.
func (e *env) startPlan(t *testing.T, p *plan.Plan) string {
	t.Helper()
	c, err := plan.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.runs.StartRun(context.Background(), adapter.StartRequest{TenantID: "t", ProjectID: "p", EnvironmentID: "e",
		RunRequestID: uuid.NewString(), Plan: c})
	if err != nil {
		t.Fatal(err)
	}
	return res.Run.RunID
}

// TestProxy_OutsideOutcomesWakeOnlyLoopsWithWork: the outcomes outside
// workers report through the proxy for a plan whose steps are all
// external wake none of the sidecar's own poll loops (Conductor gets no
// batch poll for them), while an external step whose successor is a
// sidecar step wakes that step's loop, so the successor starts without
// waiting for the loop's idle interval.
func TestProxy_OutsideOutcomesWakeOnlyLoopsWithWork(t *testing.T) {
	polls := &pollCounter{counts: map[string]int{}}
	nudged := make(chan string, 64)
	e := newEnvOpts(t, envOpts{
		workerConductor: func(u string) string { return polls.front(t, u) },
		taskDone:        func(runID string, _, _ bool) { nudged <- runID },
		worker: func(o *taskworkers.Options) {
			// Idle loops poll once, then only when woken.
			o.PollInterval = time.Hour
			o.Concurrency = map[string]int{plan.TaskTypeNoop: 1, plan.TaskTypeSleep: 1}
		},
	})
	waitFor(t, "the first poll of each loop", 2*time.Minute, func() bool {
		return polls.of(plan.TaskTypeNoop) >= 1 && polls.of(plan.TaskTypeSleep) >= 1
	})

	const n = 4
	p := &plan.Plan{PlanID: "wake-ext-" + uuid.NewString()[:8], PlanVersion: "1"}
	for i := 0; i < n; i++ {
		p.Steps = append(p.Steps, plan.Step{StepID: fmt.Sprintf("x%d", i), TimeoutSeconds: 60,
			Executor: plan.ExecutorSpec{Type: plan.ExecutorExternal, TaskType: e.tt}})
	}
	runID := e.startPlan(t, p)
	var tasks []task
	waitFor(t, "the external tasks", 2*time.Minute, func() bool {
		tasks = append(tasks, e.pollBatch(t, n)...)
		return len(tasks) == n
	})
	before := map[string]int{plan.TaskTypeNoop: polls.of(plan.TaskTypeNoop), plan.TaskTypeSleep: polls.of(plan.TaskTypeSleep)}
	for _, tk := range tasks {
		resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": tk.TaskID, "workflowInstanceId": tk.WorkflowInstanceID,
			"status": "COMPLETED", "workerId": "sdk-worker"})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("update: %d %s", resp.StatusCode, body)
		}
		select {
		case id := <-nudged:
			if id != runID {
				t.Fatalf("nudged %s, want %s", id, runID)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("the forwarded outcome was not reported to the workers")
		}
	}
	time.Sleep(500 * time.Millisecond) // a woken loop polls within milliseconds
	for tt, was := range before {
		if got := polls.of(tt) - was; got != 0 {
			t.Errorf("%d outside outcomes of an all-external plan: %d batch polls of %s, want 0", n, got, tt)
		}
	}

	// An external step followed by a sidecar noop step: its outcome wakes
	// the noop loop (an idle interval of an hour would hold the step).
	mixed := &plan.Plan{PlanID: "wake-mixed-" + uuid.NewString()[:8], PlanVersion: "1", Steps: []plan.Step{
		{StepID: "x", TimeoutSeconds: 60, Executor: plan.ExecutorSpec{Type: plan.ExecutorExternal, TaskType: e.tt}},
		{StepID: "after", DependsOn: []string{"x"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
	}}
	e.startPlan(t, mixed)
	tk := e.pollOne(t)
	noop, sleep := polls.of(plan.TaskTypeNoop), polls.of(plan.TaskTypeSleep)
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": tk.TaskID, "workflowInstanceId": tk.WorkflowInstanceID,
		"status": "COMPLETED", "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("update: %d %s", resp.StatusCode, body)
	}
	waitFor(t, "a poll of the noop loop after the external step's outcome", 2*time.Minute, func() bool {
		return polls.of(plan.TaskTypeNoop) > noop
	})
	time.Sleep(500 * time.Millisecond)
	if got := polls.of(plan.TaskTypeSleep) - sleep; got != 0 {
		t.Errorf("the outcome of a plan with no sleep step: %d batch polls of %s, want 0", got, plan.TaskTypeSleep)
	}
}
