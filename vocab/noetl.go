package vocab

import (
	"strings"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// NoETLEvent is an event of the NoETL Runtime Event Model (canonical v10).
type NoETLEvent struct {
	EventID     string `json:"event_id"`
	EventType   string `json:"event_type"`
	EventAlias  string `json:"event_alias"`
	Timestamp   string `json:"timestamp"`
	ExecutionID string `json:"execution_id"`
	Source      string `json:"source"`
	EntityType  string `json:"entity_type"`
	EntityID    string `json:"entity_id"`
	ParentID    string `json:"parent_id,omitempty"`
	// Seq is the event's place in the view (1, 2, ...): monotonic per
	// execution, as the model asks; payload.meta.runSeq is the log's.
	Seq     int            `json:"seq"`
	Attempt int64          `json:"attempt,omitempty"`
	Status  string         `json:"status,omitempty"`
	Payload map[string]any `json:"payload"`
}

// alias is the PascalCase display alias of a dot name.
func alias(dot string) string {
	var b strings.Builder
	for _, part := range strings.Split(dot, ".") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

// noetlEvents is NoETLEvents with, for each event, the index of the
// record it comes from.
func noetlEvents(recs []statestore.RunEventRecord) ([]NoETLEvent, []int) {
	out := []NoETLEvent{}
	var from []int
	cancelRequested := false
	for i := range recs {
		r := &recs[i]
		p := decode(r)
		emit := func(dot, source, entity, entityID, status string, first bool) {
			id := r.EventID
			if !first {
				id = derivedID(r.EventID, dot)
			}
			meta := map[string]any{"runSeq": r.RunSeq, "sidecarEventType": r.EventType}
			pl := map[string]any{"meta": meta}
			if p.Error != nil {
				pl["error"] = map[string]any{"code": p.Error.Code, "message": p.Error.Message}
			}
			if len(p.Artifacts) > 0 {
				pl["result_ref"] = p.Artifacts
			}
			if p.Reason != "" {
				meta["reason"] = p.Reason
			}
			e := NoETLEvent{EventID: id, EventType: dot, EventAlias: alias(dot), Timestamp: r.PersistedAt, ExecutionID: r.RunID,
				Source: source, EntityType: entity, EntityID: entityID, Seq: len(out) + 1, Status: status, Payload: pl}
			if entity == "step" {
				e.ParentID, e.Attempt = r.RunID, r.LogicalAttemptID
			}
			out = append(out, e)
			from = append(from, i)
		}
		playbook := r.PlanID + "@" + r.PlanVersion
		switch r.EventType {
		case statestore.RunQueued:
			emit("playbook.execution.requested", "server", "playbook", playbook, "", true)
		case statestore.RunApproved:
			emit("playbook.request.evaluated", "server", "playbook", playbook, "", true)
		case statestore.RunStarted:
			emit("playbook.started", "server", "playbook", playbook, "in_progress", true)
			emit("workflow.started", "server", "workflow", r.RunID, "in_progress", false)
		case statestore.RunPaused:
			emit("playbook.paused", "server", "playbook", playbook, "paused", true)
		case statestore.StepStarted:
			emit("step.started", "worker", "step", r.StepID, "in_progress", true)
		case statestore.StepCompleted:
			emit("step.done", "worker", "step", r.StepID, "success", true)
		case statestore.StepFailed:
			emit("step.failed", "worker", "step", r.StepID, "error", true)
		case statestore.StepSkipped:
			emit("step.done", "server", "step", r.StepID, "skipped", true)
		case statestore.RunCancelRequested:
			cancelRequested = true
		case statestore.RunCompleted, statestore.RunFailed, statestore.RunCancelled:
			if cancelRequested && r.EventType != statestore.RunCancelled {
				continue // Cancel wins: kept in the log for audit, not a finish
			}
			status := "success"
			if r.EventType != statestore.RunCompleted {
				status = "error" // v10 has no cancelled status: meta.sidecarEventType says which
			}
			emit("workflow.finished", "server", "workflow", r.RunID, status, true)
			emit("playbook.finished", "server", "playbook", playbook, status, false)
		}
		// RunResumed, RunCancelRequested (it only decides how the run
		// finishes), RunDrainCompleted,
		// RunDrainTimedOut, RunStepRetryRequested, RunStepTryEnded,
		// RunStepTryStarted and unknown types have no v10 counterpart
		// (docs/events.md says why).
	}
	return out, from
}
