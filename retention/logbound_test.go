package retention_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/retention"
)

// TestRetention_PassFailureLogIsBounded: a failed pass logs one short
// line, however long its error. Every run of a full batch failing to be
// forgotten (as when the store refuses every write) names a few runs'
// errors and counts the others; a remover whose error lists every run of
// the batch is cut, saying how much was left out.
func TestRetention_PassFailureLogIsBounded(t *testing.T) {
	const runs = retention.DefaultBatchRuns
	refused := errors.New("adapter: record run request: RUN_REGISTRY_UNAVAILABLE: nats: API error: code=500 err_code=10051 description=write /var/lib/sidecar/jetstream/$G/streams/KV_SIDECAR_RUNS/msgs/2.blk: no space left on device")
	var changed []string
	for i := range runs {
		changed = append(changed, fmt.Sprintf("run %q changed since it was read: %v", fmt.Sprintf("run-%d", i), refused))
	}
	for _, tc := range []struct {
		name   string
		forget retention.Forgetter
		remove error
		want   []string
	}{
		{name: "EveryRunForgetFails", forget: forgetFunc(func(context.Context, string) error { return refused }),
			want: []string{"RUN_REGISTRY_UNAVAILABLE", fmt.Sprintf("and %d more", runs-3)}},
		{name: "RemoverErrorListsEveryRun", remove: errors.New(strings.Join(changed, "\n")),
			want: []string{"RUN_REGISTRY_UNAVAILABLE", "bytes more)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHot(t, runs, 0, nil)
			var rm retention.Remover = h.remover()
			if tc.remove != nil {
				rm = crashRemover{rm, tc.remove, false}
			}
			var forget []retention.Forgetter
			if tc.forget != nil {
				forget = append(forget, tc.forget)
			}
			core, logs := observer.New(zap.WarnLevel)
			r, err := retention.New(h.store, h.archive(nil), rm, retention.Options{
				RetainFinished: time.Hour,
				Now:            func() time.Time { return time.Now().Add(2 * time.Hour) },
				Interval:       10 * time.Millisecond,
				Forgetters:     forget,
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
				// A pass that failed, or one that could not remove some runs
				// (ErrRunsKept: every run's keys refused).
				return logs.Filter(func(e observer.LoggedEntry) bool {
					return strings.Contains(e.Message, "retention pass failed") || strings.Contains(e.Message, "could not remove some runs")
				}).All()
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
			for _, want := range tc.want {
				if !strings.Contains(msg, want) {
					t.Fatalf("the pass failure logged %q, want it to say %q", msg, want)
				}
			}
		})
	}
}
