package node

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestNode_ACancelCutShortCompletes: a cancel whose process died between
// RunCancelRequested and Conductor's terminate (the request appended
// through the store, as the dead controller left it, and no terminate
// sent) is completed by the node: when the workers poll the run's next
// task, Conductor's workflow is TERMINATED (not FAILED by a refused task)
// and the run ends CANCELLED in the log.
func TestNode_ACancelCutShortCompletes(t *testing.T) {
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-cancel-pw", Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	cfg.Concurrency = map[string]int{plan.ExecutorNoop: 1, plan.ExecutorSleep: 1}
	n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
	ctx := context.Background()
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	api := httpapi.NewClient("http://" + cfg.API.Addr().String())
	started := startPlan(t, api, "cancel-cut",
		plan.Step{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 2}},
		plan.Step{StepID: "b", DependsOn: []string{"a"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}})
	waitStep(t, n, started.RunID, "a", time.Now().Add(2*time.Minute), "step a did not start", statestore.StepStatusRunning)

	snap, err := n.store.ProjectSnapshot(ctx, started.RunID)
	if err != nil {
		t.Fatal(err)
	}
	w, err := statestore.NewEvent(snap.Ref(), statestore.RunCancelRequested, "", 1, 1,
		statestore.RunCancelRequestedPayload{Reason: "cut short", RequestedBy: "test"})
	if err != nil {
		t.Fatal(err)
	}
	w.EmittedAt = time.Now().UTC().Format(time.RFC3339Nano)
	if _, err := n.emitter.Emit(ctx, w); err != nil {
		t.Fatal(err)
	}

	// Step a ends, Conductor schedules b, the workers poll it with the
	// cancel in the log: the cancel must complete from there.
	deadline := time.Now().Add(3 * time.Minute)
	var engine model.WorkflowStatus
	for {
		wf, err := n.conductor.Workflow(ctx, started.WorkflowID, false)
		if err != nil {
			t.Fatal(err)
		}
		engine = wf.Status
		if engine == model.TerminatedWorkflow {
			break
		}
		if engine != model.RunningWorkflow {
			t.Fatalf("Conductor's workflow of run %s with a cancel requested ended %s (%s), want TERMINATED", started.RunID, engine, wf.ReasonForIncompletion)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Conductor's workflow of run %s with a cancel requested still %s at the deadline, want TERMINATED", started.RunID, engine)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitRun(t, n, started.RunID, time.Now().Add(3*time.Minute), "a cancel requested, workflow TERMINATED, and the run not CANCELLED in the log",
		func(s *statestore.RunSnapshot) bool { return s.Status == statestore.RunStatusCancelled })
}
