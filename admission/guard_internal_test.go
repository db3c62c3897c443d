package admission

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// unused stands for the collaborators a test of hold and cancelQueued
// never calls (the runs' starts, the run list).
type unused struct{}

func (unused) RunIDFor(context.Context, adapter.StartRequest) (string, error) { panic("not called") }
func (unused) Existing(context.Context, adapter.StartRequest) (adapter.StartResult, bool, error) {
	panic("not called")
}
func (unused) StartRun(context.Context, adapter.StartRequest) (adapter.StartResult, error) {
	panic("not called")
}
func (unused) ClaimPlan(context.Context, string, *plan.Compiled) error { panic("not called") }
func (unused) WaitIndexed(context.Context) (uint64, error)             { panic("not called") }
func (unused) ActiveCounts() (int, map[string]int, map[[2]string]int, bool) {
	panic("not called")
}
func (unused) ShowsStarted(string) bool { panic("not called") }

// TestHold_ProducerGuard: the queue records RunQueued only when the run's
// state allows it (Layer 1): for a run the log shows started already (a
// start that bypassed the queue, or raced it), nothing is appended.
// Without the check the log gets RunQueued after RunStarted.
func TestHold_ProducerGuard(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.Start(t)
	store, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ids, err := registry.Open(ctx, js, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	emit := registry.NewEmitter(ids, store)
	c, err := Open(ctx, js, Options{Limits: Limits{Global: 1}, Runs: unused{}, Log: emit, Snapshots: store, Active: unused{},
		Owner: nobody{}, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	started := storetest.Event("run-g", statestore.RunStarted, "")
	if _, err := store.Append(ctx, started); err != nil {
		t.Fatal(err)
	}
	e := &entry{RunID: "run-g", State: statePending, Policy: Queue, TenantID: started.TenantID, ProjectID: started.ProjectID,
		EnvironmentID: started.EnvironmentID, PlanID: started.PlanID, PlanVersion: started.PlanVersion, SubmittedAt: time.Now()}
	b := []byte(`{"runId":"run-g","state":"pending"}`)
	if e.rev, err = c.kv.Create(ctx, keyOf("run-g"), b); err != nil {
		t.Fatal(err)
	}
	if err := c.hold(ctx, e, "global limit 1", 1); err != nil {
		t.Fatal(err)
	}
	recs, err := store.Fetch(ctx, "run-g", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("the queue appended %s to a started run", recs[len(recs)-1].EventType)
	}
}

// nobody owns nothing: the decider of the test's controller stays idle.
type nobody struct{}

func (nobody) Owns(string) bool { return false }
