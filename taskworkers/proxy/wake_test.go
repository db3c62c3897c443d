package proxy_test

import (
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
	rp := conductortest.ReverseProxy(t, target)
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
	runID, _ := e.startPlan(t, p)
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

// TestWorker_IdleLoopsBackOff: an idle worker's poll loops, after
// consecutive empty polls, wait longer between polls (up to
// Options.PollIntervalMax, default 1 s) instead of polling Conductor
// every PollInterval (100 ms: 10 polls a second per task type).
func TestWorker_IdleLoopsBackOff(t *testing.T) {
	polls := &pollCounter{counts: map[string]int{}}
	newEnvOpts(t, envOpts{
		workerConductor: func(u string) string { return polls.front(t, u) },
		worker: func(o *taskworkers.Options) {
			o.Concurrency = map[string]int{plan.TaskTypeNoop: 1, plan.TaskTypeSleep: 1}
		},
	})
	// Backing off from 100 ms to 1 s takes 0.1+0.2+0.4+0.8 s of empty polls.
	waitFor(t, "the loops' first empty polls", 2*time.Minute, func() bool {
		return polls.of(plan.TaskTypeNoop) >= 5 && polls.of(plan.TaskTypeSleep) >= 5
	})
	noop, sleep := polls.of(plan.TaskTypeNoop), polls.of(plan.TaskTypeSleep)
	const window = 4 * time.Second
	time.Sleep(window)
	// At most one poll per second and type, plus one for the window's edge.
	for tt, n := range map[string]int{plan.TaskTypeNoop: polls.of(plan.TaskTypeNoop) - noop, plan.TaskTypeSleep: polls.of(plan.TaskTypeSleep) - sleep} {
		if n > 6 {
			t.Errorf("idle %s loop: %d batch polls in %v, want at most 6 (backed off to 1 s)", tt, n, window)
		}
	}
}

// TestWorker_WakeStartsTheBackoffOver: a loop backed off after a long
// idle period polls at once when woken (Wake: a run started or resumed
// through this replica) and then at PollInterval again, not after the
// doubled pause it had reached.
func TestWorker_WakeStartsTheBackoffOver(t *testing.T) {
	polls := &pollCounter{counts: map[string]int{}}
	e := newEnvOpts(t, envOpts{
		workerConductor: func(u string) string { return polls.front(t, u) },
		worker: func(o *taskworkers.Options) {
			o.PollInterval, o.PollIntervalMax = 20*time.Millisecond, time.Hour
			o.Concurrency = map[string]int{plan.TaskTypeNoop: 1}
		},
	})
	// Pauses of 20, 40, ... 1280 ms: after the 8th poll the loop waits
	// 2.56 s, after the 9th 5.12 s.
	waitFor(t, "eight empty polls", 2*time.Minute, func() bool { return polls.of(plan.TaskTypeNoop) >= 8 })
	before := polls.of(plan.TaskTypeNoop)
	e.worker.Wake()
	// Started over: polls after 0, 20, 40 ms; without the reset one poll,
	// then a pause of seconds.
	time.Sleep(2 * time.Second)
	if got := polls.of(plan.TaskTypeNoop) - before; got < 3 {
		t.Errorf("woken after a long idle period: %d polls in 2 s, want at least 3 (the pause back at 20 ms)", got)
	}
}
