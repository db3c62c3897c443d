package plan

import (
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"

	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// These tests run the compiled definitions on the real Conductor server
// named by SIDECAR_TEST_CONDUCTOR_URL (e.g. http://127.0.0.1:8080/api),
// driving the tasks by raw HTTP polls and updates. Each workflow is started
// with its own task domain, so that other pollers of the sidecar task types
// on the same server (other packages' tests) never see these tasks.

// conductor is a minimal raw-HTTP client for the tests.
type conductor struct {
	t    testing.TB
	base string
	hc   *http.Client
}

func newConductor(t testing.TB) *conductor {
	t.Helper()
	return &conductor{t: t, base: conductortest.URL(t), hc: &http.Client{Timeout: 30 * time.Second}}
}

// do sends one request; a transport error fails the test.
func (c *conductor) do(method, path string, body any) (int, []byte) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			c.t.Fatalf("encode %s %s: %v", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// with returns c reporting to t (a subtest).
func (c *conductor) with(t testing.TB) *conductor {
	d := *c
	d.t = t
	return &d
}

func (c *conductor) must(method, path string, body any) []byte {
	c.t.Helper()
	code, b := c.do(method, path, body)
	if code/100 != 2 {
		c.t.Fatalf("%s %s: status %d: %s", method, path, code, b)
	}
	return b
}

// register registers the compiled defs the way the adapter should:
// POST taskdefs (an upsert) and PUT the workflow def (an upsert), both
// from the exact JSON.
func (c *conductor) register(comp *Compiled) {
	c.t.Helper()
	tds, err := comp.TaskDefsJSON()
	if err != nil {
		c.t.Fatal(err)
	}
	wf, err := comp.WorkflowDefJSON()
	if err != nil {
		c.t.Fatal(err)
	}
	c.must("POST", "/metadata/taskdefs", json.RawMessage(tds))
	c.must("PUT", "/metadata/workflow", []json.RawMessage{wf})
}

func (c *conductor) workflowDef(name string, version int) *model.WorkflowDef {
	c.t.Helper()
	var def model.WorkflowDef
	if err := json.Unmarshal(c.must("GET", fmt.Sprintf("/metadata/workflow/%s?version=%d", name, version), nil), &def); err != nil {
		c.t.Fatalf("decode workflow def: %v", err)
	}
	return &def
}

// start starts a run of comp with its tasks in domain and returns the
// workflowId.
func (c *conductor) start(comp *Compiled, runID, domain string) string {
	c.t.Helper()
	p := comp.Plan
	id := c.must("POST", "/workflow", map[string]any{
		"name":         comp.Workflow.Name,
		"version":      comp.Workflow.Version,
		"input":        WorkflowInput(runID, "tenant-1", "project-1", "env-1", p.PlanID, p.PlanVersion),
		"taskToDomain": map[string]string{"*": domain},
	})
	return strings.TrimSpace(string(id))
}

// polledTask is the part of a polled Conductor task the tests read.
type polledTask struct {
	TaskID             string         `json:"taskId"`
	TaskType           string         `json:"taskType"`
	ReferenceTaskName  string         `json:"referenceTaskName"`
	WorkflowInstanceID string         `json:"workflowInstanceId"`
	RetryCount         int            `json:"retryCount"`
	InputData          map[string]any `json:"inputData"`
	ResponseTimeout    int64          `json:"responseTimeoutSeconds"`
}

// poll polls one task of taskType in domain; nil when none is queued.
func (c *conductor) poll(taskType, domain string) *polledTask {
	c.t.Helper()
	code, b := c.do("GET", "/tasks/poll/"+taskType+"?workerid=plan-test&domain="+domain, nil)
	switch {
	case code == 204 || code == 200 && len(bytes.TrimSpace(b)) == 0:
		return nil
	case code != 200:
		c.t.Fatalf("poll %s: status %d: %s", taskType, code, b)
	}
	var pt polledTask
	if err := json.Unmarshal(b, &pt); err != nil {
		c.t.Fatalf("decode polled task: %v: %s", err, b)
	}
	return &pt
}

// pollAll polls every task type until nothing more is queued.
func (c *conductor) pollAll(types []string, domain string) []*polledTask {
	c.t.Helper()
	var out []*polledTask
	for _, tt := range types {
		for {
			pt := c.poll(tt, domain)
			if pt == nil {
				break
			}
			out = append(out, pt)
		}
	}
	return out
}

func (c *conductor) update(pt *polledTask, status, reason string) {
	c.t.Helper()
	c.must("POST", "/tasks", map[string]any{
		"workflowInstanceId":    pt.WorkflowInstanceID,
		"taskId":                pt.TaskID,
		"status":                status,
		"reasonForIncompletion": reason,
		"outputData":            map[string]any{"by": "plan-test"},
	})
}

func (c *conductor) workflowStatus(id string) string {
	c.t.Helper()
	status, _ := c.workflowState(id)
	return status
}

// workflowState is Conductor's status of a workflow and its
// reasonForIncompletion.
func (c *conductor) workflowState(id string) (status, reason string) {
	c.t.Helper()
	var w struct {
		Status string `json:"status"`
		Reason string `json:"reasonForIncompletion"`
	}
	if err := json.Unmarshal(c.must("GET", "/workflow/"+id+"?includeTasks=false", nil), &w); err != nil {
		c.t.Fatalf("decode workflow: %v", err)
	}
	return w.Status, w.Reason
}

// waitStatus waits for the workflow to reach status. A workflow still
// RUNNING after 5 s gets one PUT /workflow/decide/{id} nudge, logged: on
// 3.21.14 with the default settings (no workflow execution lock), two
// decides of one workflow can race when two JOINs complete together, and
// the loser's write can leave a workflow RUNNING with every task done
// (seen once in this suite; docs/plans.md). The adapter's run watcher
// does the same nudge.
func (c *conductor) waitStatus(id, status string) {
	c.t.Helper()
	nudged := false
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := c.workflowStatus(id)
		if got == status {
			return
		}
		if time.Now().After(deadline) {
			if nudged || got != "RUNNING" {
				c.t.Fatalf("workflow %s is %s, want %s", id, got, status)
			}
			c.t.Logf("workflow %s still RUNNING 5 s after its last step: nudging it with a decide", id)
			c.must("PUT", "/workflow/decide/"+id, nil)
			nudged = true
			deadline = time.Now().Add(5 * time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// checkPolled decodes a polled task's input, as a worker does, and checks
// it against the plan and the run.
func checkPolled(t *testing.T, comp *Compiled, runID string, pt *polledTask) *TaskInput {
	t.Helper()
	in, err := DecodeTaskInput(pt.InputData)
	if err != nil {
		t.Fatalf("DecodeTaskInput(%s): %v", pt.ReferenceTaskName, err)
	}
	if in.RunID != runID || in.TenantID != "tenant-1" || in.PlanID != comp.Plan.PlanID || in.PlanVersion != comp.Plan.PlanVersion {
		t.Fatalf("task input ids %+v", in)
	}
	id, ok := StepIDFromRef(pt.ReferenceTaskName)
	if !ok || id != in.Step.StepID {
		t.Fatalf("ref %q gives step %q, input step %q", pt.ReferenceTaskName, id, in.Step.StepID)
	}
	want := comp.Plan.Steps[slices.IndexFunc(comp.Plan.Steps, func(s Step) bool { return s.StepID == id })]
	a, _ := json.Marshal(want)
	b, _ := json.Marshal(in.Step)
	if !bytes.Equal(a, b) {
		t.Fatalf("step %q came back as %s, want %s", id, b, a)
	}
	if pt.TaskType != TaskType(in.Step.Executor.Type) {
		t.Fatalf("step %q polled as %s", id, pt.TaskType)
	}
	if want := in.Step.TimeoutSeconds + ResponseTimeoutGraceSeconds; pt.ResponseTimeout != want {
		t.Fatalf("step %q: task responseTimeoutSeconds %d, want the inline %d", id, pt.ResponseTimeout, want)
	}
	return in
}

// runToCompletion drives a workflow: it polls every queued task, checks
// that each one's dependencies have completed, completes them, and stops
// when nothing is queued. It returns the waves of steps seen together.
func runToCompletion(t *testing.T, c *conductor, comp *Compiled, wfID, runID, domain string) [][]string {
	t.Helper()
	var types []string
	for _, d := range comp.TaskDefs {
		types = append(types, d.Name)
	}
	deps := map[string][]string{}
	for _, s := range comp.Plan.Steps {
		deps[s.StepID] = s.DependsOn
	}
	done := map[string]bool{}
	var waves [][]string
	deadline := time.Now().Add(30 * time.Second)
	for len(done) < len(comp.Plan.Steps) {
		if time.Now().After(deadline) {
			t.Fatalf("steps done %v after 30 s; workflow %s", keys(done), c.workflowStatus(wfID))
		}
		polled := c.pollAll(types, domain)
		if len(polled) == 0 {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		var wave []string
		for _, pt := range polled {
			in := checkPolled(t, comp, runID, pt)
			for _, d := range deps[in.Step.StepID] {
				if !done[d] {
					t.Fatalf("step %q was scheduled before its dependency %q completed", in.Step.StepID, d)
				}
			}
			wave = append(wave, in.Step.StepID)
		}
		for _, pt := range polled {
			c.update(pt, "COMPLETED", "")
		}
		for _, id := range wave {
			done[id] = true
		}
		slices.Sort(wave)
		waves = append(waves, wave)
	}
	c.waitStatus(wfID, "COMPLETED")
	return waves
}

func TestCompile_Conductor(t *testing.T) {
	c := newConductor(t)

	t.Run("RegisterIdempotentAndHashSurvives", func(t *testing.T) {
		c := c.with(t)
		p := diamondPlan()
		p.PlanVersion = "register-" + randomHex(t, 4)
		comp := mustCompile(t, p)
		c.register(comp)
		c.register(comp) // the same again: still 200
		def := c.workflowDef(comp.Workflow.Name, WorkflowVersion)
		if h, ok := ContentHashOf(def); !ok || h != comp.ContentHash {
			t.Fatalf("content hash read back %q %v, want %q", h, ok, comp.ContentHash)
		}
		if def.Restartable {
			t.Fatal("restartable came back true")
		}
		// The inline task definitions come back as sent, with
		// retryDelaySeconds 0 (omitted, the server would make it 60).
		first := def.Tasks[0]
		if td := first.TaskDefinition; td == nil || td.RetryCount != 1 || td.ResponseTimeoutSeconds != 60+ResponseTimeoutGraceSeconds ||
			td.RetryDelaySeconds != 0 || td.TimeoutSeconds != 0 || td.RetryLogic != "FIXED" || td.TimeoutPolicy != "RETRY" {
			t.Fatalf("inline task def read back %+v", td)
		}
		for _, name := range []string{TaskTypeCommand, TaskTypeNoop, TaskTypeSleep} {
			var td model.TaskDef
			if err := json.Unmarshal(c.must("GET", "/metadata/taskdefs/"+name, nil), &td); err != nil {
				t.Fatal(err)
			}
			if td.RetryCount != 0 || td.RetryDelaySeconds != 0 || td.OwnerEmail != OwnerEmail {
				t.Fatalf("task def %s read back %+v", name, td)
			}
		}
		// A changed plan under the same name is told apart by its hash.
		p2 := p.Clone()
		p2.Steps[0].TimeoutSeconds = 61
		comp2 := mustCompile(t, p2)
		if comp2.Workflow.Name != comp.Workflow.Name || comp2.ContentHash == comp.ContentHash {
			t.Fatalf("same name %v, same hash %v", comp2.Workflow.Name == comp.Workflow.Name, comp2.ContentHash == comp.ContentHash)
		}
	})

	t.Run("Diamond", func(t *testing.T) {
		c := c.with(t)
		comp := mustCompile(t, diamondPlan())
		c.register(comp)
		domain, runID := "plantest"+randomHex(t, 6), "run-"+randomHex(t, 6)
		wf := c.start(comp, runID, domain)
		types := []string{TaskTypeCommand, TaskTypeNoop, TaskTypeSleep}

		// a alone.
		first := waitPoll(t, c, types, domain, 1)
		if id := checkPolled(t, comp, runID, first[0]).Step.StepID; id != "a" {
			t.Fatalf("first step %q, want a", id)
		}
		if more := c.pollAll(types, domain); len(more) != 0 {
			t.Fatalf("%d more tasks while a runs", len(more))
		}
		c.update(first[0], "COMPLETED", "")

		// b and c together.
		mid := waitPoll(t, c, types, domain, 2)
		var ids []string
		for _, pt := range mid {
			ids = append(ids, checkPolled(t, comp, runID, pt).Step.StepID)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, []string{"b", "c"}) {
			t.Fatalf("second wave %v, want [b c]", ids)
		}
		c.update(mid[0], "COMPLETED", "")
		time.Sleep(300 * time.Millisecond)
		if more := c.pollAll(types, domain); len(more) != 0 {
			t.Fatalf("a task was scheduled while one of b, c still runs: %s", more[0].ReferenceTaskName)
		}
		c.update(mid[1], "COMPLETED", "")

		// d last.
		last := waitPoll(t, c, types, domain, 1)
		if id := checkPolled(t, comp, runID, last[0]).Step.StepID; id != "d" {
			t.Fatalf("last step %q, want d", id)
		}
		c.update(last[0], "COMPLETED", "")
		c.waitStatus(wf, "COMPLETED")
		// Not restartable: a restart would rerun completed steps.
		if code, body := c.do("POST", "/workflow/"+wf+"/restart", nil); code/100 == 2 {
			t.Fatalf("restart of a compiled workflow succeeded (%d %s)", code, body)
		}
	})

	t.Run("NShape", func(t *testing.T) {
		c := c.with(t)
		p := dagPlan([]string{"a", "b", "c", "d"}, map[int][]int{2: {0, 1}, 3: {1}}, []int{0, 1, 2, 3})
		p.PlanID = "n-shape"
		comp := mustCompile(t, p)
		c.register(comp)
		domain, runID := "plantest"+randomHex(t, 6), "run-"+randomHex(t, 6)
		wf := c.start(comp, runID, domain)
		waves := runToCompletion(t, c, comp, wf, runID, domain)
		if got, want := fmt.Sprint(waves), "[[a b] [c d]]"; got != want {
			t.Fatalf("waves %s, want %s", got, want)
		}
	})

	t.Run("RandomDAGs", func(t *testing.T) {
		c := c.with(t)
		for i := range 3 {
			rng := newRand(uint64(i))
			p := randomDAG(rng, 6+rng.IntN(6), 0.35)
			p.PlanID = fmt.Sprintf("random-%d", i)
			comp := mustCompile(t, p)
			c.register(comp)
			domain, runID := "plantest"+randomHex(t, 6), "run-"+randomHex(t, 6)
			wf := c.start(comp, runID, domain)
			runToCompletion(t, c, comp, wf, runID, domain)
		}
	})

	t.Run("RetryBudget", func(t *testing.T) {
		c := c.with(t)
		// E=2, L=2: retryCount 3, so 4 tries, then the workflow fails.
		p := &Plan{PlanID: "retry-budget", PlanVersion: "1", Steps: []Step{{
			StepID:   "flaky step ${workflow.input.runId}",
			Executor: ExecutorSpec{Type: ExecutorCommand, Argv: []string{"false", "${workflow.input.runId}"}},
			Retries:  RetryPolicy{EngineTries: 2, LogicalAttempts: 2, DelaySeconds: 1},
		}}}
		comp := mustCompile(t, p)
		c.register(comp)
		domain, runID := "plantest"+randomHex(t, 6), "run-"+randomHex(t, 6)
		wf := c.start(comp, runID, domain)
		types := []string{TaskTypeCommand}
		wantAttempts := [][2]int64{{1, 1}, {2, 1}, {1, 2}, {2, 2}}
		var failedAt time.Time
		for r, want := range wantAttempts {
			pts := waitPoll(t, c, types, domain, 1)
			if r > 0 {
				if waited := time.Since(failedAt); waited < 900*time.Millisecond {
					t.Fatalf("retry %d was pollable after %v, before the 1 s delay", r, waited)
				}
			}
			pt := pts[0]
			in := checkPolled(t, comp, runID, pt)
			if in.Step.Executor.Argv[1] != "${workflow.input.runId}" {
				t.Fatalf("argv was interpolated: %q", in.Step.Executor.Argv)
			}
			if pt.RetryCount != r {
				t.Fatalf("try %d has retryCount %d", r+1, pt.RetryCount)
			}
			if e, l := in.Attempts(pt.RetryCount); [2]int64{e, l} != want {
				t.Fatalf("retryCount %d: attempts (%d, %d), want %v", r, e, l, want)
			}
			c.update(pt, "FAILED", fmt.Sprintf("try %d failed", r+1))
			failedAt = time.Now()
		}
		c.waitStatus(wf, "FAILED")
		time.Sleep(1500 * time.Millisecond)
		if more := c.pollAll(types, domain); len(more) != 0 {
			t.Fatalf("a fifth try was scheduled (retryCount %d)", more[0].RetryCount)
		}
	})
}

// waitPoll polls until n tasks have been received (at most 10 s).
func waitPoll(t *testing.T, c *conductor, types []string, domain string, n int) []*polledTask {
	t.Helper()
	var got []*polledTask
	// 30 s: Conductor 3.32 evaluates a JOIN in its asynchronous system
	// task worker, which beside the race-enabled suite on 2 cores took
	// more than 10 s to schedule the JOIN's successor.
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < n {
		if time.Now().After(deadline) {
			t.Fatalf("polled %d tasks in 30 s, want %d", len(got), n)
		}
		more := c.pollAll(types, domain)
		if len(more) == 0 {
			time.Sleep(20 * time.Millisecond)
		}
		got = append(got, more...)
	}
	if len(got) > n {
		t.Fatalf("polled %d tasks, want %d", len(got), n)
	}
	return got
}

// diamondPlan is a -> {b, c} -> d with command, sleep and noop steps.
func diamondPlan() *Plan {
	return &Plan{PlanID: "itest-diamond", PlanVersion: "1", Steps: []Step{
		{StepID: "a", Executor: ExecutorSpec{Type: ExecutorCommand, Argv: []string{"echo", "a"}}, TimeoutSeconds: 60, Retries: RetryPolicy{EngineTries: 2}},
		{StepID: "b", Executor: ExecutorSpec{Type: ExecutorSleep, Seconds: 0.5}, DependsOn: []string{"a"}},
		{StepID: "c", Executor: ExecutorSpec{Type: ExecutorNoop}, DependsOn: []string{"a"}},
		{StepID: "d", Executor: ExecutorSpec{Type: ExecutorCommand, Argv: []string{"true"}}, DependsOn: []string{"b", "c"}},
	}}
}
