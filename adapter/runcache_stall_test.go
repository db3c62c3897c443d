package adapter

import (
	"context"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"

	"go.uber.org/zap/zaptest"
)

// TestRunCache_AStalledWatch: the server keeps the cache's watch consumer
// but it delivers nothing (paused on the server here, as an overloaded
// server left one for good). A run created after that still reaches the
// cache, once.
func TestRunCache_AStalledWatch(t *testing.T) {
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, unusedURL(t), RunsOptions{})
	first, second := "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"
	if _, err := r.createRun(ctx, &Run{RunID: first, State: RunStateStarted, WorkflowID: "wf-1"}); err != nil {
		t.Fatal(err)
	}
	cache, err := r.watchRuns(ctx, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cache.close)
	holds := func(n int) bool {
		return cache.ready() && len(cache.open()) == n
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !holds(1) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !holds(1) {
		t.Fatalf("the cache holds %d runs, want 1", len(cache.open()))
	}
	st, err := env.js.Stream(ctx, "KV_"+r.kv.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	paused := natstest.StallConsumers(t, st)
	if paused != 1 {
		t.Fatalf("paused %d consumers, want the cache's one", paused)
	}
	if _, err := r.createRun(ctx, &Run{RunID: second, State: RunStateStarted, WorkflowID: "wf-2"}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(2 * time.Minute)
	for !holds(2) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	got := cache.open()
	if len(got) != 2 || got[0].rec.RunID != first || got[1].rec.RunID != second {
		t.Fatalf("the cache holds %d runs, want the run created while its watch was stalled too", len(got))
	}
}
