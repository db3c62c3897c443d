package adapter

// Plan registration: a plan version's task and workflow definitions in
// Conductor, claimed once in the run index by content hash.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
)

// planRecord is the run index's entry for a registered plan version.
type planRecord struct {
	TenantID        string    `json:"tenantId,omitempty"`
	PlanID          string    `json:"planId"`
	PlanVersion     string    `json:"planVersion"`
	Hash            string    `json:"hash"`
	WorkflowName    string    `json:"workflowName"`
	WorkflowVersion int32     `json:"workflowVersion"`
	RegisteredAt    time.Time `json:"registeredAt"`
}

// planKey is the run index's key of a tenant's plan version (with no
// tenant, that of a plan version before plan ids were each tenant's).
func planKey(tenantID, planID, planVersion string) string {
	in := planID + "|" + planVersion
	if tenantID != "" {
		in = tenantID + "|" + in
	}
	sum := sha256.Sum256([]byte(in))
	return keyPlan + hex.EncodeToString(sum[:])
}

// RegisterPlan registers the plan's task definitions and the tenant's
// workflow definition of it in Conductor (plan.WorkflowName), idempotently:
// registering the same plan again is a no-op (a cache hit after the first
// time in this process). A plan whose (planId, planVersion) the tenant
// already registered with a different content hash (recorded in the run
// index, or embedded in the workflow definition Conductor has) is refused
// with ErrPlanConflict and nothing is changed. Another tenant's plan of
// the same planId and planVersion is another definition.
func (r *Runs) RegisterPlan(ctx context.Context, tenantID string, compiled *plan.Compiled) error {
	defs, err := defsOf("register plan", tenantID, compiled)
	if err != nil {
		return err
	}
	return r.registerPlan(ctx, defs)
}

// ClaimPlan claims the tenant's (planId, planVersion) for the plan's
// content in the run index, as RegisterPlan does first, and registers
// nothing in Conductor: a start that waits for admission is refused a
// plan version its tenant claimed with other content at once, with
// ErrPlanConflict, as a start that does not wait is.
func (r *Runs) ClaimPlan(ctx context.Context, tenantID string, compiled *plan.Compiled) error {
	defs, err := defsOf("claim plan", tenantID, compiled)
	if err != nil {
		return err
	}
	pk, _, ok, err := r.registered(defs)
	if ok || err != nil {
		return err
	}
	return r.claimPlan(ctx, pk, defs)
}

// registered returns the plan key of defs and, when this process
// registered that plan version, what it registered (ok), or
// ErrPlanConflict when that was other content.
func (r *Runs) registered(defs *planDefs) (pk string, cached registeredPlan, ok bool, err error) {
	pk = planKey(defs.TenantID, defs.PlanID, defs.PlanVersion)
	r.mu.Lock()
	cached, ok = r.plans[pk]
	r.mu.Unlock()
	if ok && cached.hash != defs.Hash {
		return pk, cached, ok, planConflict(defs)
	}
	return pk, cached, ok, nil
}

func (r *Runs) registerPlan(ctx context.Context, defs *planDefs) error {
	pk, cached, ok, err := r.registered(defs)
	if err != nil {
		return err
	}
	if ok {
		if time.Since(cached.checked) < r.opts.PlanRecheck || r.unchangedInConductor(ctx, defs) {
			return nil
		}
		r.log.Warn("the plan's workflow definition in Conductor is not the plan's (edited or removed there); registering the plan's again",
			zap.String("planId", defs.PlanID), zap.String("planVersion", defs.PlanVersion), zap.String("workflow", defs.Workflow.Name))
	}
	workflowJSON, taskDefsJSON, err := defs.encode("register plan")
	if err != nil {
		return err
	}
	if err := r.claimPlan(ctx, pk, defs); err != nil {
		return err
	}
	existing, err := r.conductor.WorkflowDef(ctx, defs.Workflow.Name, defs.Workflow.Version)
	switch {
	case err == nil:
		if h := EmbeddedPlanHash(existing); h != "" && h != defs.Hash {
			return planConflict(defs)
		}
	case !errors.Is(err, ErrNotFound):
		return err
	}
	if taskDefsJSON != nil {
		if err := r.conductor.RegisterTaskDefsJSON(ctx, taskDefsJSON); err != nil {
			r.releaseRejected(ctx, pk, defs, err)
			return err
		}
	}
	if err := r.conductor.RegisterWorkflowDefJSON(ctx, workflowJSON); err != nil {
		r.releaseRejected(ctx, pk, defs, err)
		return err
	}
	r.mu.Lock()
	r.plans[pk] = registeredPlan{hash: defs.Hash, checked: time.Now()}
	r.mu.Unlock()
	r.log.Debug("plan registered", zap.String("planId", defs.PlanID), zap.String("planVersion", defs.PlanVersion),
		zap.String("workflow", defs.Workflow.Name), zap.Int32("workflowVersion", defs.Workflow.Version))
	return nil
}

// registeredPlan is a plan version this process registered: its content
// hash, and when its definition in Conductor was last known to be it.
type registeredPlan struct {
	hash    string
	checked time.Time
}

// unchangedInConductor reads defs' workflow definition back from
// Conductor and reports whether it is still the plan's: its content hash
// and its number of steps (an edit that kept the description keeps the
// hash). A read that fails says nothing about it: the plan counts as
// unchanged, and is read again at the next start.
func (r *Runs) unchangedInConductor(ctx context.Context, defs *planDefs) bool {
	def, err := r.conductor.WorkflowDef(ctx, defs.Workflow.Name, defs.Workflow.Version)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return true
	}
	if err != nil || EmbeddedPlanHash(def) != defs.Hash || len(plan.StepsOf(def)) != len(defs.compiled.Plan.Steps) {
		return false
	}
	pk := planKey(defs.TenantID, defs.PlanID, defs.PlanVersion)
	r.mu.Lock()
	r.plans[pk] = registeredPlan{hash: defs.Hash, checked: time.Now()}
	r.mu.Unlock()
	return true
}

// forgetPlan drops the plan from the in-process cache, so that the next
// RegisterPlan registers it in Conductor again (after a Conductor restart
// with the memory store lost the definitions).
func (r *Runs) forgetPlan(defs *planDefs) {
	r.mu.Lock()
	delete(r.plans, planKey(defs.TenantID, defs.PlanID, defs.PlanVersion))
	r.mu.Unlock()
}

// releaseRejected gives back the claim of a plan version whose
// definitions Conductor refused as invalid (ENGINE_REJECTED: nothing of it
// was registered), so that the plan, once fixed, can be published under
// the same version. The claim is removed only while it still holds this
// plan's hash, at the revision read; any other error keeps it (Conductor
// may have registered the definition before its answer was lost).
func (r *Runs) releaseRejected(ctx context.Context, pk string, defs *planDefs, err error) {
	if !errors.Is(err, ErrEngineRejected) {
		return
	}
	var stored planRecord
	rev, gerr := r.getJSON(ctx, pk, &stored)
	if gerr == nil && stored.Hash == defs.Hash {
		gerr = r.kv.Delete(ctx, pk, jetstream.LastRevision(rev))
	}
	if gerr != nil && !errors.Is(gerr, ErrNotFound) {
		r.log.Warn("could not give back the claim of a plan version Conductor refused; publish the fixed plan as a new planVersion",
			zap.String("planId", defs.PlanID), zap.String("planVersion", defs.PlanVersion), zap.Error(gerr))
	}
}

// The registered plan is the tenant's own (plan ids are each tenant's),
// or, in the definition Conductor has, another deployment's that chose the
// same names: the answer tells nothing of it, not even its content hash.
func planConflict(defs *planDefs) error {
	return &Error{Code: CodePlanVersionConflict, Op: "register plan",
		Message: fmt.Sprintf("plan %s version %s is already registered with other content; this plan's content hash is %s (publish it as a new planVersion)",
			defs.PlanID, defs.PlanVersion, defs.Hash)}
}

// claimPlan records (planId, planVersion) -> hash with an atomic Create, or
// checks the recorded hash.
func (r *Runs) claimPlan(ctx context.Context, pk string, defs *planDefs) error {
	rec := planRecord{TenantID: defs.TenantID, PlanID: defs.PlanID, PlanVersion: defs.PlanVersion, Hash: defs.Hash,
		WorkflowName: defs.Workflow.Name, WorkflowVersion: defs.Workflow.Version, RegisteredAt: time.Now().UTC()}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("adapter: encode plan record: %w", err)
	}
	for range 3 {
		_, err := r.kv.Create(ctx, pk, b)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return registryUnavailable("claim plan", err)
		}
		var stored planRecord
		_, err = r.getJSON(ctx, pk, &stored)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if stored.Hash != defs.Hash {
			return planConflict(defs)
		}
		return nil
	}
	return registryUnavailable("claim plan", errors.New("plan record kept vanishing"))
}

// registeredPlans lists the plan versions in the run index.
func (r *Runs) registeredPlans(ctx context.Context) ([]planRecord, error) {
	keys, err := r.listKeys(ctx, keyPlan+">")
	if err != nil {
		return nil, err
	}
	out := make([]planRecord, 0, len(keys))
	for _, k := range keys {
		var p planRecord
		if _, err := r.getJSON(ctx, k, &p); err != nil {
			if errors.Is(err, ErrNotFound) {
				continue
			}
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// PlanSteps returns the steps of a tenant's registered plan version, read
// back from its workflow definition in Conductor (plan.StepsOf): none for
// a workflow that is not a compiled plan (an adopted definition). A plan
// version the tenant has no definition of is read under the name plan
// versions had before plan ids were each tenant's (the runs started then
// run it); none gives an error matching ErrNotFound.
func (r *Runs) PlanSteps(ctx context.Context, tenantID, planID, planVersion string) ([]plan.Step, error) {
	def, err := r.conductor.WorkflowDef(ctx, plan.WorkflowName(tenantID, planID, planVersion), plan.WorkflowVersion)
	if errors.Is(err, ErrNotFound) && tenantID != "" {
		def, err = r.conductor.WorkflowDef(ctx, plan.WorkflowName("", planID, planVersion), plan.WorkflowVersion)
	}
	if err != nil {
		return nil, err
	}
	return plan.StepsOf(def), nil
}

// WorkflowSteps returns the steps of the plan version a run's workflow
// runs, read from the workflow definition of that name (plan.StepsOf):
// none for a workflow that is not a compiled plan.
func (r *Runs) WorkflowSteps(ctx context.Context, workflowName string) ([]plan.Step, error) {
	def, err := r.conductor.WorkflowDef(ctx, workflowName, plan.WorkflowVersion)
	if err != nil {
		return nil, err
	}
	return plan.StepsOf(def), nil
}
