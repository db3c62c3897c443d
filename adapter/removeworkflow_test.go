package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestWorkflowRemover_ForgetRun, against the real Conductor: the
// workflow of a finished run whose RunStarted names it is gone from
// Conductor after ForgetRun, and forgetting it again (Conductor answers
// 404) is done; a run without a workflow and a run the log does not have
// are done too. A workflow whose run is not forgotten stays.
func TestWorkflowRemover_ForgetRun(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	c := newClient(t, u, 5*time.Second)
	log := memstore.New(statestore.ProjectorOptions{})
	_, _, gone := startTestWorkflow(t, c)
	_, _, kept := startTestWorkflow(t, c)
	for runID, wf := range map[string]string{"run-gone": gone, "run-kept": kept, "run-nowf": ""} {
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
	for _, id := range []string{gone, kept} {
		if err := c.Terminate(ctx, id, "test"); err != nil {
			t.Fatal(err)
		}
	}
	f := NewWorkflowRemover(c, log, zaptest.NewLogger(t))
	for _, run := range []string{"run-gone", "run-gone", "run-nowf", "run-unknown"} {
		if err := f.ForgetRun(ctx, run); err != nil {
			t.Fatalf("forget %s: %v", run, err)
		}
	}
	if _, err := c.Workflow(ctx, gone, false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the forgotten run's workflow: %v, want NOT_FOUND (removed from Conductor)", err)
	}
	if _, err := c.Workflow(ctx, kept, false); err != nil {
		t.Fatalf("the other workflow: %v, want it kept", err)
	}
	if err := c.RemoveWorkflow(ctx, ""); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("remove an empty workflowId: %v, want INVALID_INPUT", err)
	}
	_ = c.RemoveWorkflow(ctx, kept)
}
