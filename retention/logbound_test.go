package retention_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/retention"
)

// TestRetention_PassFailureLogIsBounded: a pass in which every run of a
// full batch fails to be forgotten (as when the store refuses every
// write) logs one short line, naming a few runs' errors and counting the
// others, not every run's error joined.
func TestRetention_PassFailureLogIsBounded(t *testing.T) {
	const runs = retention.DefaultBatchRuns
	h := newHot(t, runs, 0, nil)
	refused := errors.New("adapter: record run request: RUN_REGISTRY_UNAVAILABLE: nats: API error: code=500 err_code=10051 description=write /var/lib/sidecar/jetstream/$G/streams/KV_SIDECAR_RUNS/msgs/2.blk: no space left on device")
	core, logs := observer.New(zap.WarnLevel)
	r, err := retention.New(h.store, h.archive(nil), h.remover(), retention.Options{
		RetainFinished: time.Hour,
		Now:            func() time.Time { return time.Now().Add(2 * time.Hour) },
		Interval:       10 * time.Millisecond,
		Forgetters:     []retention.Forgetter{forgetFunc(func(context.Context, string) error { return refused })},
		Logger:         zap.New(core),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
	failed := func() []observer.LoggedEntry {
		return logs.FilterMessageSnippet("retention pass failed").All()
	}
	for end := time.Now().Add(3 * time.Minute); len(failed()) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no pass failure logged within 3 minutes")
		}
	}
	e := failed()[0]
	msg, _ := e.ContextMap()["error"].(string)
	if n := len(e.Message) + len(msg); n > 4096 {
		t.Fatalf("the pass failure logged %d bytes in one line, want at most 4096: %.300s...", n, msg)
	}
	if !strings.Contains(msg, "RUN_REGISTRY_UNAVAILABLE") || !strings.Contains(msg, "and 197 more") {
		t.Fatalf("the pass failure logged %q, want a few runs' errors and the count of the others", msg)
	}
}
