package node

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestNode_WarnsOfAdoptedRunsItNoLongerAdopts: a sidecar started without
// the --adopt of a definition whose workflow an earlier process adopted,
// and which still runs, says so at start, naming the definition: the
// run's tasks are no longer recorded.
func TestNode_WarnsOfAdoptedRunsItNoLongerAdopts(t *testing.T) {
	ctx := context.Background()
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	name := "nodetest_adopt_outside_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cfg.Adopt = adapter.AdopterOptions{Specs: []adapter.AdoptSpec{{Name: name}}, Interval: 100 * time.Millisecond}
	n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.conductor.RegisterWorkflowDef(ctx, model.WorkflowDef{Name: name, Version: 1, OwnerEmail: "sidecar-tests@example.com", SchemaVersion: 2,
		Tasks: []model.WorkflowTask{{Name: "wait", TaskReferenceName: "wait", Type_: "WAIT", InputParameters: map[string]interface{}{"duration": "1 hour"}}}}); err != nil {
		t.Fatal(err)
	}
	wf, err := n.conductor.StartWorkflow(ctx, model.StartWorkflowRequest{Name: name, Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.conductor.Terminate(context.Background(), wf, "test over") })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if ids, _ := n.runs.ActiveRunIDs(ctx); len(ids) == 1 && ids[0] == wf {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the workflow was not adopted within 30 s")
		}
	}
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}

	cfg = testConfig(t, srv.URL()) // the same NATS, without --adopt
	core, logs := observer.New(zap.WarnLevel)
	n = New(cfg, zap.New(core), prometheus.NewRegistry())
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	for _, e := range logs.FilterMessageSnippet("adopted runs of definitions this sidecar does not adopt").All() {
		if defs, _ := e.ContextMap()["definitions"].([]interface{}); len(defs) == 1 && defs[0] == name+":1 (1)" {
			return
		}
	}
	t.Fatalf("no warning naming %s:1 at start; warnings: %v", name, logs.All())
}
