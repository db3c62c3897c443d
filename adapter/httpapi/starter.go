package httpapi

import (
	"context"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
)

// RunStarter is the Starter of a sidecar: it compiles the plan and starts
// the run through the adapter (idempotent, RunStarted appended).
type RunStarter struct {
	Runs *adapter.Runs
}

// Start implements Starter.
func (s *RunStarter) Start(ctx context.Context, req StartRequest) (*Started, error) {
	compiled, err := plan.Compile(req.Plan)
	if err != nil {
		return nil, err
	}
	res, err := s.Runs.StartRun(ctx, adapter.StartRequest{
		TenantID: req.TenantID, ProjectID: req.ProjectID, EnvironmentID: req.EnvironmentID,
		RunRequestID: req.RunRequestID, Plan: compiled, Labels: req.Labels,
	})
	if err != nil {
		return nil, err
	}
	return &Started{RunID: res.Run.RunID, WorkflowID: res.Run.WorkflowID, EngineRunRef: res.Run.EngineRunRef(), Created: res.Created}, nil
}
