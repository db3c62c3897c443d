package httpapi

import (
	"context"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
)

// RunStarts starts runs on Conductor, idempotently, RunStarted appended;
// *adapter.Runs satisfies it.
type RunStarts interface {
	StartRun(ctx context.Context, req adapter.StartRequest) (adapter.StartResult, error)
}

// RunStarter is the Starter of a sidecar: it compiles the plan and starts
// the run through the adapter (idempotent, RunStarted appended).
type RunStarter struct {
	Runs RunStarts
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

// QueuePositions gives a queued run's place; *admission.Controller
// satisfies it.
type QueuePositions interface {
	Position(runID string) int
}

// AdmittedStarter is the Starter of a sidecar with admission control: a
// start goes through the admission decider, and is answered started (200
// or 201), QUEUED (202), or ADMISSION_REJECTED (429).
type AdmittedStarter struct {
	Admission *admission.Controller
}

// Start implements Starter.
func (s *AdmittedStarter) Start(ctx context.Context, req StartRequest) (*Started, error) {
	compiled, err := plan.Compile(req.Plan)
	if err != nil {
		return nil, err
	}
	d, err := s.Admission.Submit(ctx, adapter.StartRequest{
		TenantID: req.TenantID, ProjectID: req.ProjectID, EnvironmentID: req.EnvironmentID,
		RunRequestID: req.RunRequestID, Plan: compiled, Labels: req.Labels,
	}, req.Plan, req.RequestedBy)
	if err != nil {
		return nil, err
	}
	if res := d.Started; res != nil {
		return &Started{RunID: res.Run.RunID, WorkflowID: res.Run.WorkflowID, EngineRunRef: res.Run.EngineRunRef(), Created: res.Created}, nil
	}
	out := &Started{RunID: d.RunID, Status: d.State, Position: d.Position}
	if !d.NotBefore.IsZero() {
		out.NotBefore = d.NotBefore.UTC().Format(time.RFC3339Nano)
	}
	return out, nil
}
