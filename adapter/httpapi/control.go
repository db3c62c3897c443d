package httpapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/drain"
)

// Control carries out the control actions on a run.
type Control interface {
	Pause(ctx context.Context, runID string, req drain.PauseRequest) (*drain.State, error)
	Resume(ctx context.Context, runID string) (*drain.State, error)
	Cancel(ctx context.Context, runID, reason, requestedBy string) (*drain.State, error)
	RetryStep(ctx context.Context, runID, stepID string, req drain.RetryRequest) (*drain.State, error)
}

// RunControl is the Control of a sidecar: it finds the run's workflow in
// the adapter's run registry and acts through the drain controller.
type RunControl struct {
	Runs  *adapter.Runs
	Drain *drain.Controller
}

func (c *RunControl) workflow(ctx context.Context, runID string) (string, error) {
	run, err := c.Runs.Run(ctx, runID)
	if errors.Is(err, adapter.ErrNotFound) {
		return "", drain.ErrRunNotFound
	}
	if err != nil {
		return "", err
	}
	return run.WorkflowID, nil
}

// Pause implements Control.
func (c *RunControl) Pause(ctx context.Context, runID string, req drain.PauseRequest) (*drain.State, error) {
	wf, err := c.workflow(ctx, runID)
	if err != nil {
		return nil, err
	}
	return c.Drain.Pause(ctx, runID, wf, req)
}

// Resume implements Control.
func (c *RunControl) Resume(ctx context.Context, runID string) (*drain.State, error) {
	wf, err := c.workflow(ctx, runID)
	if err != nil {
		return nil, err
	}
	return c.Drain.Resume(ctx, runID, wf)
}

// Cancel implements Control.
func (c *RunControl) Cancel(ctx context.Context, runID, reason, requestedBy string) (*drain.State, error) {
	wf, err := c.workflow(ctx, runID)
	if err != nil {
		return nil, err
	}
	return c.Drain.Cancel(ctx, runID, wf, reason, requestedBy)
}

// RetryStep implements Control.
func (c *RunControl) RetryStep(ctx context.Context, runID, stepID string, req drain.RetryRequest) (*drain.State, error) {
	if _, err := c.workflow(ctx, runID); err != nil {
		return nil, err
	}
	return c.Drain.RetryStep(ctx, runID, stepID, req)
}

// controlBody is the optional body of resume and cancel.
type controlBody struct {
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requestedBy,omitempty"`
}

func (s *Server) control(action string) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.opts.Control == nil {
			return &apiError{status: http.StatusServiceUnavailable, Code: CodeNotReady, Message: "this sidecar does not control runs"}
		}
		runID := r.PathValue("runId")
		var err error
		switch action {
		case "pause":
			var req drain.PauseRequest
			if err := decodeOptionalBody(r, &req); err != nil {
				return err
			}
			_, err = s.opts.Control.Pause(r.Context(), runID, req)
		case "resume":
			var body controlBody
			if err := decodeOptionalBody(r, &body); err != nil {
				return err
			}
			_, err = s.opts.Control.Resume(r.Context(), runID)
		case "cancel":
			var body controlBody
			if err := decodeOptionalBody(r, &body); err != nil {
				return err
			}
			_, err = s.opts.Control.Cancel(r.Context(), runID, body.Reason, body.RequestedBy)
		case "retry":
			var req drain.RetryRequest
			if err := decodeOptionalBody(r, &req); err != nil {
				return err
			}
			_, err = s.opts.Control.RetryStep(r.Context(), runID, r.PathValue("stepId"), req)
		}
		var ee *drain.EngineError
		if errors.As(err, &ee) {
			return &apiError{status: http.StatusServiceUnavailable, Code: CodeUnavailable,
				Message: "the " + action + " is recorded but Conductor did not answer; retry the request: " + ee.Err.Error()}
		}
		if err != nil {
			return err
		}
		return s.writeRun(w, r, runID)
	}
}

func decodeOptionalBody(r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return decodeBody(r, v)
}
