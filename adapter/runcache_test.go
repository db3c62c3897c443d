package adapter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap/zaptest"
)

// TestRunCache: the run cache holds the runs that are not FINAL, sorted by
// runId, follows updates in place, and drops a run when it becomes FINAL
// (it used to keep every run ever seen, and the watcher sorted and
// copied all of them every scan).
func TestRunCache(t *testing.T) {
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, unusedURL(t), RunsOptions{})
	// runIds are UUIDs; id("15") sorts between id("1") and id("2").
	id := func(s string) string { return "00000000-0000-4000-8000-" + s + strings.Repeat("0", 12-len(s)) }
	short := func(runID string) string { return strings.TrimRight(runID[24:], "0") }
	for _, i := range []string{"4", "2", "3", "1"} {
		if _, err := r.createRun(ctx, &Run{RunID: id(i), State: RunStateStarted, WorkflowID: "wf-" + i}); err != nil {
			t.Fatal(err)
		}
	}
	cache, err := r.watchRuns(ctx, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cache.close)
	settle := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			got := ""
			for _, c := range cache.open() {
				got += fmt.Sprintf("%s:%s ", short(c.rec.RunID), c.rec.WorkflowID)
			}
			if cache.ready() && got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("cache holds %q, want %q", got, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	settle("1:wf-1 2:wf-2 3:wf-3 4:wf-4 ")
	held := cache.open()
	update := func(id string, change func(*Run)) {
		t.Helper()
		rec, rev, err := r.get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		change(rec)
		if _, err := r.updateRun(ctx, rec, rev); err != nil {
			t.Fatal(err)
		}
	}
	update(id("3"), func(rec *Run) { rec.WorkflowID = "wf-3b" })
	settle("1:wf-1 2:wf-2 3:wf-3b 4:wf-4 ")
	if held[2].rec.WorkflowID != "wf-3" {
		t.Fatal("an update changed a slice a scan already holds")
	}
	update(id("2"), func(rec *Run) { rec.State = RunStateFinal })
	settle("1:wf-1 3:wf-3b 4:wf-4 ")
	if _, err := r.createRun(ctx, &Run{RunID: id("15"), State: RunStateStarting}); err != nil {
		t.Fatal(err)
	}
	settle("1:wf-1 15: 3:wf-3b 4:wf-4 ")
	cache.mu.Lock()
	n := len(cache.runs)
	cache.mu.Unlock()
	if n != 4 {
		t.Fatalf("the cache keeps %d runs, want the 4 not FINAL", n)
	}
}

// TestRunCache_SharesRepeatedStrings: the cache holds every open run
// (10,000 paused runs stay in it), so the strings that repeat across runs
// (scope, plan, workflow, task domain, state, labels) are held once, not
// once per run as each entry's decoding allocates them.
func TestRunCache_SharesRepeatedStrings(t *testing.T) {
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, unusedURL(t), RunsOptions{})
	hash := strings.Repeat("ab", 32)
	for _, id := range []string{"00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"} {
		if _, err := r.createRun(ctx, &Run{RunID: id, State: RunStateStarted, WorkflowID: "wf-" + id, TenantID: "tenant-a", ProjectID: "project-a",
			EnvironmentID: "env-a", PlanID: "plan-a", PlanVersion: "1", PlanHash: hash, WorkflowName: "sidecar_plan-a_" + hash[:16],
			TaskDomain: "domain-a", Labels: map[string]string{"team": "payments"}}); err != nil {
			t.Fatal(err)
		}
	}
	cache, err := r.watchRuns(ctx, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cache.close)
	deadline := time.Now().Add(2 * time.Minute)
	for !cache.ready() || len(cache.open()) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the cache holds %d runs after 2 minutes, want 2", len(cache.open()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	open := cache.open()
	a, b := open[0].rec, open[1].rec
	same := func(name, x, y string) {
		t.Helper()
		if x != y {
			t.Fatalf("%s differs: %q and %q", name, x, y)
		}
		if unsafe.StringData(x) != unsafe.StringData(y) {
			t.Errorf("%s %q is held twice, once per run", name, x)
		}
	}
	same("tenantId", a.TenantID, b.TenantID)
	same("projectId", a.ProjectID, b.ProjectID)
	same("environmentId", a.EnvironmentID, b.EnvironmentID)
	same("planId", a.PlanID, b.PlanID)
	same("planVersion", a.PlanVersion, b.PlanVersion)
	same("planHash", a.PlanHash, b.PlanHash)
	same("workflowName", a.WorkflowName, b.WorkflowName)
	same("taskDomain", a.TaskDomain, b.TaskDomain)
	same("state", a.State, b.State)
	for k, v := range a.Labels {
		for k2, v2 := range b.Labels {
			same("label key", k, k2)
			same("label value", v, v2)
		}
	}
}
