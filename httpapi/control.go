package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
)

// Control carries out the control actions on a run; *drain.Controller
// satisfies it. The State each action returns is the run's state after it
// (State.Snapshot, when set, is what the answer shows).
type Control interface {
	Pause(ctx context.Context, runID string, req drain.PauseRequest) (*drain.State, error)
	Resume(ctx context.Context, runID string, req drain.ResumeRequest) (*drain.State, error)
	Cancel(ctx context.Context, runID, reason, requestedBy string) (*drain.State, error)
	RetryStep(ctx context.Context, runID, stepID string, req drain.RetryRequest) (*drain.State, error)
	// ResumeLater schedules the resume of a paused run (a staggered bulk
	// resume): drain.Controller.ResumeLater.
	ResumeLater(ctx context.Context, runID string, at time.Time, req drain.ResumeRequest) (*drain.State, error)
}

// controlBody is the optional body of resume, cancel and retry.
type controlBody struct {
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requestedBy,omitempty"`
}

// pauseBody is the optional body of pause. timeoutSeconds is 1 s .. 7 d
// (absent or 0: the default drain timeout). resumeAt (RFC 3339, in the
// future) or resumeAfterSeconds (1 s .. MaxScheduledResume) schedules the
// pause's resume; at most one of them.
type pauseBody struct {
	TimeoutSeconds     int64  `json:"timeoutSeconds,omitempty"`
	Reason             string `json:"reason,omitempty"`
	RequestedBy        string `json:"requestedBy,omitempty"`
	ResumeAt           string `json:"resumeAt,omitempty"`
	ResumeAfterSeconds int64  `json:"resumeAfterSeconds,omitempty"`
}

// MaxScheduledResume bounds how far ahead a pause's resume may be
// scheduled (a year).
const MaxScheduledResume = 366 * 24 * time.Hour

// resumeTime checks a pause body's schedule and returns when to resume
// (zero: not scheduled).
func (b *pauseBody) resumeTime(now time.Time) (time.Time, error) {
	switch {
	case b.ResumeAt != "" && b.ResumeAfterSeconds != 0:
		return time.Time{}, badRequest("resumeAt", "give resumeAt or resumeAfterSeconds, not both")
	case b.ResumeAfterSeconds != 0:
		if b.ResumeAfterSeconds < 1 || b.ResumeAfterSeconds > int64(MaxScheduledResume/time.Second) {
			return time.Time{}, badRequest("resumeAfterSeconds", fmt.Sprintf("resumeAfterSeconds must be 1..%d (a year)", int64(MaxScheduledResume/time.Second)))
		}
		return now.Add(time.Duration(b.ResumeAfterSeconds) * time.Second), nil
	case b.ResumeAt != "":
		at, err := time.Parse(time.RFC3339Nano, b.ResumeAt)
		if err != nil {
			return time.Time{}, badRequest("resumeAt", "resumeAt must be an RFC 3339 time, e.g. 2026-11-23T06:00:00Z")
		}
		if !at.After(now) || at.Sub(now) > MaxScheduledResume {
			return time.Time{}, badRequest("resumeAt", fmt.Sprintf("resumeAt must be in the future and at most a year ahead (now is %s)", now.UTC().Format(time.RFC3339)))
		}
		return at, nil
	}
	return time.Time{}, nil
}

func (s *Server) control(action string) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.opts.Control == nil {
			return &apiError{status: http.StatusServiceUnavailable, Code: CodeNotReady, Message: "this sidecar does not control runs"}
		}
		runID := r.PathValue("runId")
		var body controlBody
		var pause pauseBody
		var resumeAt time.Time
		if action == "pause" {
			if err := decodeOptionalBody(r, pauseSchema, &pause); err != nil {
				return err
			}
			if t := pause.TimeoutSeconds; t != 0 && (t < 1 || t > int64(MaxPauseTimeout/time.Second)) {
				return badRequest("timeoutSeconds", fmt.Sprintf("timeoutSeconds must be 1..%d (7 days), or left out for the default", int64(MaxPauseTimeout/time.Second)))
			}
			var err error
			if resumeAt, err = pause.resumeTime(time.Now()); err != nil {
				return err
			}
			body = controlBody{Reason: pause.Reason, RequestedBy: pause.RequestedBy}
		} else if err := decodeOptionalBody(r, reasonSchema, &body); err != nil {
			return err
		}
		if err := checkReason(body.Reason); err != nil {
			return err
		}
		by, err := requestedBy(r.Context(), body.RequestedBy)
		if err != nil {
			return err
		}
		var st *drain.State
		switch action {
		case "pause":
			st, err = s.opts.Control.Pause(r.Context(), runID, drain.PauseRequest{TimeoutSeconds: pause.TimeoutSeconds, Reason: body.Reason, RequestedBy: by, ResumeAt: resumeAt})
		case "resume":
			st, err = s.opts.Control.Resume(r.Context(), runID, drain.ResumeRequest{Reason: body.Reason, RequestedBy: by})
		case "cancel":
			st, err = s.opts.Control.Cancel(r.Context(), runID, body.Reason, by)
		case "retry":
			st, err = s.opts.Control.RetryStep(r.Context(), runID, r.PathValue("stepId"), drain.RetryRequest{Reason: body.Reason, RequestedBy: by})
		}
		var ee *drain.EngineError
		var ae *adapter.Error
		switch {
		case errors.As(err, &ee) && errors.Is(ee.Err, adapter.ErrConflict) && errors.As(ee.Err, &ae):
			// Conductor answered, and refused: the workflow is not in the
			// state the call needs (a concurrent call, or an action taken
			// in Conductor itself). Not a reason to retry.
			return &apiError{status: http.StatusConflict, Code: CodeEngineConflict,
				Message: fmt.Sprintf("the log has the %s (recorded now or by an earlier request) but Conductor refused it: workflow %s: %s", action, ae.EngineStatus, ae.Message)}
		case errors.As(err, &ee) && errors.Is(ee.Err, adapter.ErrNotFound):
			// Conductor answered 404: the workflow was removed, or lost
			// with a memory store's restart. The watcher ends the run
			// (WORKFLOW_NOT_FOUND) once a few reads confirm it.
			return &apiError{status: http.StatusConflict, Code: CodeEngineConflict,
				Message: fmt.Sprintf("the log has the %s (recorded now or by an earlier request) but Conductor no longer has the run's workflow (removed, or lost in a restart of its store), and the run ends once a few reads confirm it (CANCELLED if a cancel is recorded, otherwise FAILED with WORKFLOW_NOT_FOUND): %s", action, ee.Err)}
		case errors.As(err, &ee):
			return &apiError{status: http.StatusServiceUnavailable, Code: CodeUnavailable,
				Message: "the log has the " + action + " (recorded now or by an earlier request) but Conductor did not answer; retry the request: " + ee.Err.Error()}
		}
		if err != nil {
			return s.archivedConflict(r.Context(), runID, err)
		}
		return s.writeControlled(w, r, runID, st)
	}
}

func decodeOptionalBody(r *http.Request, sch plan.Schema, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return decodeBody(r, sch, v)
}
