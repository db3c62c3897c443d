package statestore

import (
	"fmt"
	"time"
)

// RunRef is what every event of a run carries besides its own fields: the
// run and the plan version it runs, and where it belongs.
type RunRef struct {
	RunID, TenantID, ProjectID, EnvironmentID, PlanID, PlanVersion string
}

// Ref returns the run's RunRef.
func (s *RunSnapshot) Ref() RunRef {
	return RunRef{s.RunID, s.TenantID, s.ProjectID, s.EnvironmentID, s.PlanID, s.PlanVersion}
}

// NewEvent is the one constructor of the events producers append: eventType
// of run, emitted now (UTC), for stepID (step events only), at the given
// attempts, with payload (nil, eventType's Payload, or a value that
// encodes to a JSON object; an empty one is left out) and its
// idempotencyKey derived (§3.1). The eventId is left to the
// EventIdRegistry (registry.Emitter). It does not validate; the append does.
func NewEvent(run RunRef, eventType, stepID string, engineAttemptID, logicalAttemptID int64, payload any) (*RunEventWrite, error) {
	w := &RunEventWrite{
		EventType: eventType, EmittedAt: time.Now().UTC().Format(time.RFC3339Nano),
		RunID: run.RunID, TenantID: run.TenantID, ProjectID: run.ProjectID, EnvironmentID: run.EnvironmentID,
		PlanID: run.PlanID, PlanVersion: run.PlanVersion,
		EngineAttemptID: engineAttemptID, LogicalAttemptID: logicalAttemptID,
	}
	if IsStepEvent(eventType) {
		w.StepID = stepID
	}
	if payload != nil {
		b, err := encodePayload(eventType, payload)
		if err != nil {
			return nil, fmt.Errorf("statestore: encode %s payload: %w", eventType, err)
		}
		if len(b) > 0 && string(b) != "null" && string(b) != "{}" {
			w.Payload = b
		}
	}
	w.IdempotencyKey = w.KeyInput().Key()
	return w, nil
}
