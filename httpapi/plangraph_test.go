package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// definitions answers each workflow definition's steps by its name, and
// a tenant's plan version by the name plan ids give it now.
type definitions map[string][]plan.Step

func (d definitions) WorkflowSteps(_ context.Context, name string) ([]plan.Step, error) {
	return d[name], nil
}

func (d definitions) PlanSteps(_ context.Context, tenantID, planID, planVersion string) ([]plan.Step, error) {
	return d[plan.WorkflowName(tenantID, planID, planVersion)], nil
}

// TestServer_PlanGraphOfTheRunsWorkflow: a run's plan graph is the one
// its workflow runs, read by the workflow name in its RunStarted: a run
// started before plan ids were each tenant's runs the shared definition,
// and shows it even once its tenant published other content under the
// same plan id and version.
func TestServer_PlanGraphOfTheRunsWorkflow(t *testing.T) {
	store := memstore.New(statestore.ProjectorOptions{})
	w := storetest.Event("old-run", statestore.RunStarted, "")
	shared := plan.WorkflowName("", w.PlanID, w.PlanVersion)
	storetest.WithPayload(w, statestore.RunStartedPayload{EngineRunRef: statestore.ConductorRunRef(shared, "wf-1"), EngineType: "conductor", StartedAt: w.EmittedAt})
	if _, err := store.Append(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	defs := definitions{
		shared: {{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}, {StepID: "b", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}, DependsOn: []string{"a"}}},
		plan.WorkflowName(w.TenantID, w.PlanID, w.PlanVersion): {{StepID: "z", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}},
	}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: store, Plans: defs, Logger: zaptest.NewLogger(t)}).Handler())
	t.Cleanup(srv.Close)
	var g httpapi.PlanGraph
	if code := getJSON(t, srv.URL+"/v1/runs/old-run/plan", &g); code != http.StatusOK || len(g.Steps) != 2 || g.Steps[0].StepID != "a" {
		t.Fatalf("plan graph: %d %+v, want the shared definition's steps a, b", code, g)
	}
}
