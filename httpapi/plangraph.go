package httpapi

import (
	"context"
	"net/http"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// PlanReader reads a plan version's steps; *adapter.Runs satisfies it.
type PlanReader interface {
	// PlanSteps reads a tenant's registered plan version.
	PlanSteps(ctx context.Context, tenantID, planID, planVersion string) ([]plan.Step, error)
	// WorkflowSteps reads the plan version a run's workflow runs, by its
	// workflow name.
	WorkflowSteps(ctx context.Context, workflowName string) ([]plan.Step, error)
}

// PlanGraph is GET /v1/runs/{runId}/plan: the step graph of the run's
// plan version. It names each step's executor type and dependencies, not
// the executor's settings (argv, URL, headers), which a viewer need not see.
type PlanGraph struct {
	PlanID      string      `json:"planId"`
	PlanVersion string      `json:"planVersion"`
	Steps       []GraphStep `json:"steps"`
}

// GraphStep is one step of a PlanGraph.
type GraphStep struct {
	StepID          string   `json:"stepId"`
	Executor        string   `json:"executor"`
	DependsOn       []string `json:"dependsOn"`
	Join            string   `json:"join,omitempty"`
	TimeoutSeconds  int64    `json:"timeoutSeconds,omitempty"`
	EngineTries     int      `json:"engineTries"`
	LogicalAttempts int      `json:"logicalAttempts"`
}

// planGraph serves GET /v1/runs/{runId}/plan.
func (s *Server) planGraph(w http.ResponseWriter, r *http.Request) error {
	snap, _, err := s.runSnapshot(r.Context(), r.PathValue("runId")) // a run that left hot state: from the archive
	if err != nil {
		return err
	}
	// The definition the run's workflow runs (a run started before plan
	// ids were each tenant's runs the shared one); a run not started yet
	// has none, and its tenant's plan version is read, as for an adopted
	// run (its planId is its definition's name).
	var steps []plan.Step
	if name := statestore.ConductorWorkflowName(snap.EngineRunRef); name != "" && name != snap.PlanID {
		steps, err = s.opts.Plans.WorkflowSteps(r.Context(), name)
	} else {
		steps, err = s.opts.Plans.PlanSteps(r.Context(), snap.TenantID, snap.PlanID, snap.PlanVersion)
	}
	if err != nil {
		return err
	}
	g := PlanGraph{PlanID: snap.PlanID, PlanVersion: snap.PlanVersion, Steps: make([]GraphStep, len(steps))}
	for i, st := range steps {
		deps := st.DependsOn
		if deps == nil {
			deps = []string{}
		}
		g.Steps[i] = GraphStep{StepID: st.StepID, Executor: st.Executor.Type, DependsOn: deps, Join: st.Join,
			TimeoutSeconds: st.TimeoutSeconds, EngineTries: st.Retries.EngineTries, LogicalAttempts: st.Retries.LogicalAttempts}
	}
	return writeJSON(w, http.StatusOK, g)
}
