// Package storetest holds the conformance suite that every statestore
// backend must pass, and helpers to build valid events in tests.
package storetest

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Event returns a valid RunEventWrite of eventType for runID; stepID is used
// for step events only. Attempts are 1; the idempotencyKey is derived.
func Event(runID, eventType, stepID string) *statestore.RunEventWrite {
	return EventAt(runID, eventType, stepID, 1)
}

// EventAt is Event with a logicalAttemptId.
func EventAt(runID, eventType, stepID string, logicalAttempt int64) *statestore.RunEventWrite {
	w := &statestore.RunEventWrite{
		EventID:          uuid.NewString(),
		EventType:        eventType,
		EmittedAt:        time.Now().UTC().Format(time.RFC3339Nano),
		RunID:            runID,
		TenantID:         "tenant_acme",
		ProjectID:        "proj_data",
		EnvironmentID:    "prod",
		PlanID:           "plan_abc",
		PlanVersion:      "2",
		EngineAttemptID:  1,
		LogicalAttemptID: logicalAttempt,
	}
	if statestore.IsStepEvent(eventType) {
		w.StepID = stepID
	}
	Rekey(w)
	return w
}

// Rekey recomputes w.IdempotencyKey after a test changed a key field.
func Rekey(w *statestore.RunEventWrite) {
	w.IdempotencyKey = w.KeyInput().Key()
}

// WithPayload sets w.Payload to the JSON encoding of v and returns w.
func WithPayload(w *statestore.RunEventWrite, v any) *statestore.RunEventWrite {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	w.Payload = b
	return w
}

// RequestedBy returns the types of recs' events whose payload names who
// as requestedBy (statestore.RequestedByConductor: what the log put down
// to an action taken in Conductor), in log order.
func RequestedBy(recs []statestore.RunEventRecord, who string) []string {
	var out []string
	for _, r := range recs {
		var p struct {
			RequestedBy string `json:"requestedBy"`
		}
		if json.Unmarshal(r.Payload, &p) == nil && p.RequestedBy == who {
			out = append(out, r.EventType)
		}
	}
	return out
}
