package vocab

import (
	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// CoreEvent is an event of the Core Events Specification v1.0 (its
// EventEnvelope).
type CoreEvent struct {
	EventID     string     `json:"eventId"`
	ExecutionID string     `json:"executionId"`
	Type        string     `json:"type"`
	OccurredAt  string     `json:"occurredAt"`
	Actor       *CoreActor `json:"actor"`
	// CausationID is the eventId of the sidecar's record the event was
	// derived from.
	CausationID   string         `json:"causationId"`
	SchemaVersion int            `json:"schemaVersion"`
	Payload       map[string]any `json:"payload"`
}

// CoreActor is who caused a Core event.
type CoreActor struct {
	Kind string `json:"kind"`
	ID   string `json:"id,omitempty"`
}

// derivedID is a stable UUID for the view's event typ derived from the
// record eventID: the same log gives the same view, with the same ids.
func derivedID(eventID, typ string) string {
	return uuid.NewSHA1(uuid.NameSpaceURL, []byte("sidecar:"+eventID+":"+typ)).String()
}

// coreEvents is CoreEvents with, for each event, the index of the record
// it comes from.
func coreEvents(recs []statestore.RunEventRecord) ([]CoreEvent, []int) {
	out := []CoreEvent{}
	var from []int
	created := false
	nodes := map[string]bool{}
	for i := range recs {
		r := &recs[i]
		p := decode(r)
		// emit appends an event of r: the one it maps to carries r's
		// eventId; one the view adds (a creation) a stable derived id.
		emit := func(typ string, pl map[string]any, added bool) {
			id := r.EventID
			if added {
				id = derivedID(r.EventID, typ)
			}
			out = append(out, CoreEvent{EventID: id, ExecutionID: r.RunID, Type: typ, OccurredAt: r.PersistedAt,
				Actor: actorOf(p.RequestedBy), CausationID: r.EventID, SchemaVersion: 1, Payload: pl})
			from = append(from, i)
		}
		if !created {
			created = true
			if r.EventType == statestore.RunQueued {
				emit("EXECUTION_CREATED", map[string]any{"graphId": r.PlanID + "@" + r.PlanVersion}, false)
				continue
			}
			emit("EXECUTION_CREATED", map[string]any{"graphId": r.PlanID + "@" + r.PlanVersion}, true)
		}
		node := func(stepID, typ string, extra map[string]any) {
			if !nodes[stepID] {
				emit("NODE_CREATED", map[string]any{"nodeId": stepID, "nodeType": "Task"}, true)
				nodes[stepID] = true
			}
			pl := map[string]any{"nodeId": stepID}
			for k, v := range extra {
				pl[k] = v
			}
			emit(typ, pl, false)
		}
		switch r.EventType {
		case statestore.RunStarted:
			emit("EXECUTION_STARTED", map[string]any{}, false)
		case statestore.RunCompleted:
			emit("EXECUTION_COMPLETED", map[string]any{}, false)
		case statestore.RunFailed:
			emit("EXECUTION_FAILED", withError(map[string]any{}, p.Error), false)
		case statestore.RunCancelRequested:
			emit("EXECUTION_CANCEL_REQUESTED", withReason(map[string]any{}, p.Reason), false)
		case statestore.RunCancelled:
			emit("EXECUTION_CANCELED", withReason(map[string]any{}, p.Reason), false)
		case statestore.StepStarted:
			node(r.StepID, "NODE_STARTED", map[string]any{"attempt": r.LogicalAttemptID})
		case statestore.StepCompleted:
			node(r.StepID, "NODE_SUCCEEDED", map[string]any{"output": map[string]any{"artifacts": p.Artifacts}})
		case statestore.StepFailed:
			node(r.StepID, "NODE_FAILED", withError(map[string]any{}, p.Error))
		case statestore.StepSkipped:
			node(r.StepID, "NODE_CANCELED", map[string]any{"reason": "skipped: " + p.Reason})
		case statestore.RunStepTryEnded:
			node(p.StepID, "NODE_WAITING", map[string]any{"waitKey": p.Reason})
		case statestore.RunStepTryStarted:
			node(p.StepID, "NODE_RESUMED", nil)
		case statestore.RunStepRetryRequested:
			node(p.StepID, "NODE_READY", nil)
		}
		// RunQueued (after the first record), RunApproved, RunPaused,
		// RunResumed, RunDrainCompleted, RunDrainTimedOut and unknown
		// types have no Core counterpart (docs/events.md says why).
	}
	return out, from
}

func withReason(m map[string]any, reason string) map[string]any {
	if reason != "" {
		m["reason"] = reason
	}
	return m
}

func withError(m map[string]any, e *statestore.StepError) map[string]any {
	if e != nil {
		m["error"] = map[string]any{"code": e.Code, "message": e.Message}
	}
	return m
}
