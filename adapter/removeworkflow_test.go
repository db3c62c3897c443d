package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestWorkflowRemover_ForgetRun, against the real Conductor: the
// workflow of a finished run whose RunStarted names it is gone from
// Conductor after ForgetRun, and forgetting it again (Conductor answers
// 404) is done; a run without a workflow and a run the log does not have
// are done too. A workflow whose run is not forgotten stays. The
// RunStarted is found past the first page of records read (run-late:
// 20 records of an extension type before it).
func TestWorkflowRemover_ForgetRun(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	c := newClient(t, u, 30*time.Second)
	log := memstore.New(statestore.ProjectorOptions{})
	_, _, gone := startTestWorkflow(t, c)
	_, _, kept := startTestWorkflow(t, c)
	_, _, late := startTestWorkflow(t, c)
	for i := range 20 {
		if _, err := log.Append(ctx, storetest.EventAt("run-late", "RunNoted", "", int64(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	for runID, wf := range map[string]string{"run-gone": gone, "run-kept": kept, "run-nowf": "", "run-late": late} {
		started := storetest.Event(runID, statestore.RunStarted, "")
		if wf != "" {
			b, _ := json.Marshal(statestore.RunStartedPayload{EngineRunRef: statestore.ConductorRunRef("wf", wf), EngineType: "conductor",
				StartedAt: time.Now().UTC().Format(time.RFC3339Nano)})
			started.Payload = b
		}
		for _, w := range []*statestore.RunEventWrite{started, storetest.Event(runID, statestore.RunCancelled, "")} {
			if _, err := log.Append(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, id := range []string{gone, kept, late} {
		if err := c.Terminate(ctx, id, "test"); err != nil {
			t.Fatal(err)
		}
	}
	f := NewWorkflowRemover(c, log, zaptest.NewLogger(t))
	for _, run := range []string{"run-gone", "run-gone", "run-nowf", "run-unknown", "run-late"} {
		if err := f.ForgetRun(ctx, run); err != nil {
			t.Fatalf("forget %s: %v", run, err)
		}
	}
	for _, id := range []string{gone, late} {
		if _, err := c.Workflow(ctx, id, false); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the forgotten run's workflow %s: %v, want NOT_FOUND (removed from Conductor)", id, err)
		}
	}
	if _, err := c.Workflow(ctx, kept, false); err != nil {
		t.Fatalf("the other workflow: %v, want it kept", err)
	}
	if err := c.RemoveWorkflow(ctx, ""); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("remove an empty workflowId: %v, want INVALID_INPUT", err)
	}
	_ = c.RemoveWorkflow(ctx, kept)
}

// TestWorkflowRemover_SavesNoSnapshot: finding a finished run's workflow
// saves no snapshot of the run (retention forgets the run moments before
// its removal purges whatever was saved): on a JetStream log that keeps
// durable snapshots, the run's workflow is gone from Conductor after
// ForgetRun and the snapshot bucket took no write.
func TestWorkflowRemover_SavesNoSnapshot(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	c := newClient(t, u, 30*time.Second)
	js, _ := natstest.Start(t)
	log, err := natsstore.Open(ctx, js, natsstore.Options{SnapshotBucket: natsstore.DefaultSnapshotBucket, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = log.Close() })
	_, _, wf := startTestWorkflow(t, c)
	if err := c.Terminate(ctx, wf, "test"); err != nil {
		t.Fatal(err)
	}
	const runID = "run-removed"
	started := storetest.Event(runID, statestore.RunStarted, "")
	started.Payload, _ = json.Marshal(statestore.RunStartedPayload{EngineRunRef: statestore.ConductorRunRef("wf", wf), EngineType: "conductor",
		StartedAt: time.Now().UTC().Format(time.RFC3339Nano)})
	for _, w := range []*statestore.RunEventWrite{started, storetest.Event(runID, statestore.RunCancelled, "")} {
		if _, err := log.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	if err := NewWorkflowRemover(c, log, zaptest.NewLogger(t)).ForgetRun(ctx, runID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Workflow(ctx, wf, false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the forgotten run's workflow: %v, want NOT_FOUND (removed from Conductor)", err)
	}
	st, err := js.Stream(ctx, "KV_"+natsstore.DefaultSnapshotBucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.LastSeq; n != 0 {
		t.Fatalf("the snapshot bucket took %d writes while the run's workflow was found and removed, want none", n)
	}
}

// TestWorkflowRemover_BoundsRemovalsInFlight: however many runs retention
// forgets at once, at most MaxRemovalsInFlight removals reach Conductor
// together (Conductor's SQLite store takes two connections of its pool for
// one removal, and a full pool of half-done removals never completes), and
// every workflow is removed.
func TestWorkflowRemover_BoundsRemovalsInFlight(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	target, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	proxy := conductortest.ReverseProxy(t, target)
	var inFlight, peak atomic.Int64
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete && strings.HasSuffix(r.URL.Path, "/remove") {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(100 * time.Millisecond) // a removal that takes a while
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	c := newClient(t, u, 30*time.Second)
	viaFront := newClient(t, front.URL+target.Path, 5*time.Second)
	log := memstore.New(statestore.ProjectorOptions{})
	const runs = 12
	wfs := make([]string, runs)
	for i := range wfs {
		_, _, wfs[i] = startTestWorkflow(t, c)
		if err := c.Terminate(ctx, wfs[i], "test"); err != nil {
			t.Fatal(err)
		}
		started := storetest.Event(fmt.Sprintf("run-%d", i), statestore.RunStarted, "")
		started.Payload, _ = json.Marshal(statestore.RunStartedPayload{EngineRunRef: statestore.ConductorRunRef("wf", wfs[i]), EngineType: "conductor",
			StartedAt: time.Now().UTC().Format(time.RFC3339Nano)})
		if _, err := log.Append(ctx, started); err != nil {
			t.Fatal(err)
		}
	}
	f := NewWorkflowRemover(viaFront, log, zaptest.NewLogger(t))
	var wg sync.WaitGroup
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.ForgetRun(ctx, fmt.Sprintf("run-%d", i)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > MaxRemovalsInFlight || p < 2 {
		t.Fatalf("%d removals reached Conductor at once, want 2 to %d", p, MaxRemovalsInFlight)
	}
	for _, wf := range wfs {
		if _, err := c.Workflow(ctx, wf, false); !errors.Is(err, ErrNotFound) {
			t.Fatalf("workflow %s: %v, want removed", wf, err)
		}
	}
}
