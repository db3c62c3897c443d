package admission_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// otherContent is e's plan id and version with other steps.
func (e *env) otherContent() *plan.Plan {
	return &plan.Plan{PlanID: e.plan.PlanID, PlanVersion: e.plan.PlanVersion, Steps: []plan.Step{
		{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
		{StepID: "b", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}, DependsOn: []string{"a"}}}}
}

// submitPlan submits a start of p.
func (e *env) submitPlan(c *admission.Controller, tenant, id string, p *plan.Plan) (*admission.Decision, error) {
	e.t.Helper()
	compiled, err := plan.Compile(p)
	if err != nil {
		e.t.Fatal(err)
	}
	return c.Submit(context.Background(), adapter.StartRequest{TenantID: tenant, ProjectID: "p", EnvironmentID: "test",
		RunRequestID: id, Plan: compiled}, p, "test")
}

// A start whose plan version the tenant registered with other content is
// answered 409 PLAN_VERSION_CONFLICT at once, as without limits, and
// nothing waits: before, it was answered PENDING and the decider tried to
// start it again every 2 s, holding every later start of every tenant.
func TestAdmission_ConflictingPlanIsRefusedAtSubmit(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{PerTenant: 2}, Wait: 5 * time.Second})
	defer c.Close(context.Background())
	if d, err := e.submit(c, "t1", "p-1"); err != nil || d.Started == nil {
		t.Fatalf("first: %+v %v", d, err)
	}
	d, err := e.submitPlan(c, "t1", "p-2", e.otherContent())
	if !errors.Is(err, adapter.ErrPlanConflict) || !errors.Is(err, errcode.Conflict) {
		t.Fatalf("other content under the same version: %+v %v, want PLAN_VERSION_CONFLICT", d, err)
	}
	if d, err := e.submit(c, "t2", "p-3"); err != nil || d.Started == nil {
		t.Fatalf("another tenant after the conflict: %+v %v, want started", d, err)
	}
}

// A queued start whose plan version turns out taken when its turn comes
// (another deployment of the sidecar, on the same Conductor, registered
// other content under the same names while it waited) cannot start: the
// decider ends it (RunCancelled, the reason naming the conflict; a repeat
// of the request is answered 409) and goes on with the queue, instead of
// trying it again every 2 s ahead of every other start.
func TestAdmission_AStartThatCannotSucceedDoesNotHoldTheQueue(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{Global: 1}, Policy: admission.Queue, Wait: 5 * time.Second})
	defer c.Close(context.Background())
	first, err := e.submit(c, "t1", "h-1")
	if err != nil || first.Started == nil {
		t.Fatalf("first: %+v %v", first, err)
	}
	other := &plan.Plan{PlanID: "adm-late-" + e.domain, PlanVersion: "1", Steps: []plan.Step{{StepID: "x", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}}}
	queued, err := e.submitPlan(c, "t1", "h-2", other)
	if err != nil || queued.State != statestore.RunStatusQueued {
		t.Fatalf("second: %+v %v, want QUEUED", queued, err)
	}
	// Meanwhile another deployment registers other content under the
	// same names in Conductor.
	elsewhere := otherDeployment(t, e.domain)
	winner := &plan.Plan{PlanID: other.PlanID, PlanVersion: "1", Steps: []plan.Step{{StepID: "y", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}}}
	compiled, err := plan.Compile(winner)
	if err != nil {
		t.Fatal(err)
	}
	if err := elsewhere.RegisterPlan(context.Background(), "t1", compiled); err != nil {
		t.Fatal(err)
	}
	third, err := e.submit(c, "t2", "h-3")
	if err != nil || third.State != statestore.RunStatusQueued {
		t.Fatalf("third: %+v %v, want QUEUED behind the limit", third, err)
	}
	e.end(first.RunID)
	e.waitStarted(third.RunID)
	recs := e.events(queued.RunID)
	if got := types(recs); got != statestore.RunQueued+" "+statestore.RunCancelled || !strings.Contains(string(recs[len(recs)-1].Payload), adapter.CodePlanVersionConflict) {
		t.Fatalf("the run that could not start: %s %s, want RunQueued RunCancelled naming %s", got, recs[len(recs)-1].Payload, adapter.CodePlanVersionConflict)
	}
	d, err := e.submitPlan(c, "t1", "h-2", other)
	if errcode.CodeOf(err) != adapter.CodePlanVersionConflict || !errors.Is(err, errcode.Conflict) {
		t.Fatalf("a repeat of the request: %+v %v, want PLAN_VERSION_CONFLICT", d, err)
	}
}

// otherDeployment is another sidecar's adapter (a log of its own) on the
// same Conductor.
func otherDeployment(t *testing.T, domain string) *adapter.Runs {
	t.Helper()
	_, _, _, runs := deployment(t, domain)
	return runs
}
