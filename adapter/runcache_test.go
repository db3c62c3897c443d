package adapter

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
