package taskworkers_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// TestWorker_StartAlreadyInTheLog: a task whose StepStarted is already in
// the log for the same attempt (a sidecar recorded it and was killed
// before it reported; Conductor hands the task out again) runs to its
// outcome. Its StepStarted is not recorded twice, and the task is not
// handed back for good because a second StepStarted would be invalid on a
// RUNNING step.
func TestWorker_StartAlreadyInTheLog(t *testing.T) {
	e := newBenchEnv(t)
	ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorNoop}, plan.RetryPolicy{})
	ctx := context.Background()
	wf, err := e.client.Workflow(ctx, ids[0], false)
	if err != nil {
		t.Fatal(err)
	}
	runID, _ := wf.Input[plan.InputRunID].(string)
	snap, err := e.store.ProjectSnapshot(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	w := &statestore.RunEventWrite{EventType: statestore.StepStarted, EmittedAt: time.Now().UTC().Format(time.RFC3339Nano),
		RunID: runID, TenantID: snap.TenantID, ProjectID: snap.ProjectID, EnvironmentID: snap.EnvironmentID,
		PlanID: snap.PlanID, PlanVersion: snap.PlanVersion, StepID: "s00", EngineAttemptID: 1, LogicalAttemptID: 1,
		Payload: json.RawMessage(`{}`)}
	w.IdempotencyKey = w.KeyInput().Key()
	if _, err := e.emit.Emit(ctx, w); err != nil {
		t.Fatal(err)
	}

	wk := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: "restart-test", Concurrency: map[string]int{plan.TaskType(plan.ExecutorNoop): 1}, PollTimeout: 100 * time.Millisecond,
		HandBackAfter: time.Second, Logger: zaptest.NewLogger(t),
	})
	if err := wk.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wk.Close(context.Background()) })

	deadline := time.Now().Add(30 * time.Second)
	for {
		snap, err := e.store.ProjectSnapshot(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if st := snap.Step("s00"); st != nil && st.Status == statestore.StepStatusSuccess {
			break
		}
		if time.Now().After(deadline) {
			st := snap.Step("s00")
			t.Fatalf("step s00 not completed after 30 s (step %+v): the task was handed back instead of run", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	recs, err := e.store.Fetch(ctx, runID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	started := 0
	for _, r := range recs {
		if r.EventType == statestore.StepStarted {
			started++
		}
	}
	if started != 1 {
		t.Fatalf("%d StepStarted in the log, want 1", started)
	}
}
