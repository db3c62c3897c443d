package adapter

import (
	"github.com/conductor-sdk/conductor-go/sdk/model"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
)

// InputStartAttemptID is the workflow input key, besides
// plan.WorkflowInputKeys, that names the start attempt which started the
// workflow (Run.AttemptID). Together with runId it marks a workflow as
// started by the adapter (orphan detection).
const InputStartAttemptID = "startAttemptId"

// EmbeddedPlanHash returns the plan content hash recorded in a workflow
// definition read back from Conductor (plan.ContentHashOf: the description
// of a compiled definition), or "" if def carries none.
func EmbeddedPlanHash(def *model.WorkflowDef) string {
	h, _ := plan.ContentHashOf(def)
	return h
}

// planDefs is what the adapter registers and starts for one tenant's plan
// version.
type planDefs struct {
	TenantID    string
	PlanID      string
	PlanVersion string
	Hash        string
	Workflow    model.WorkflowDef
	// compiled encodes what is registered (encode): only on a registration,
	// not on every start of a plan already registered.
	compiled *plan.Compiled
}

// defsOf checks a compiled plan and returns its definitions as tenantID's
// (plan.WorkflowName: plan ids are each tenant's).
func defsOf(op, tenantID string, c *plan.Compiled) (*planDefs, error) {
	if c == nil || c.Plan == nil {
		return nil, invalidInput(op, "compiled plan is required")
	}
	if err := validateField(op, "tenantId", tenantID); err != nil {
		return nil, err
	}
	if err := validateField(op, "planId", c.Plan.PlanID); err != nil {
		return nil, err
	}
	if err := validateField(op, "planVersion", c.Plan.PlanVersion); err != nil {
		return nil, err
	}
	if c.ContentHash == "" {
		return nil, invalidInput(op, "plan %s@%s has no content hash", c.Plan.PlanID, c.Plan.PlanVersion)
	}
	if c.Workflow.Name == "" {
		return nil, invalidInput(op, "plan %s@%s has no workflow name", c.Plan.PlanID, c.Plan.PlanVersion)
	}
	c = c.Named(plan.WorkflowName(tenantID, c.Plan.PlanID, c.Plan.PlanVersion))
	return &planDefs{TenantID: tenantID, PlanID: c.Plan.PlanID, PlanVersion: c.Plan.PlanVersion, Hash: c.ContentHash,
		Workflow: c.Workflow, compiled: c}, nil
}

// encode returns the exact JSON registered for d (plan.Compiled): the
// workflow definition, and the task definitions' list or nil.
func (d *planDefs) encode(op string) (workflow, taskDefs []byte, err error) {
	if workflow, err = d.compiled.WorkflowDefJSON(); err != nil {
		return nil, nil, invalidInput(op, "plan %s@%s: %v", d.PlanID, d.PlanVersion, err)
	}
	if len(d.compiled.TaskDefs) > 0 {
		if taskDefs, err = d.compiled.TaskDefsJSON(); err != nil {
			return nil, nil, invalidInput(op, "plan %s@%s: %v", d.PlanID, d.PlanVersion, err)
		}
	}
	return workflow, taskDefs, nil
}
