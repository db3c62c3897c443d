// Package vocab presents a run's event log in two other vocabularies: the
// events of the Core Events Specification v1.0 (EXECUTION_* / NODE_*, an
// envelope with executionId, occurredAt and actor) and the taxonomy of the
// NoETL Runtime Event Model v10 (dot names such as step.started, an envelope
// with execution_id and timestamp). They are views: computed from the log
// when asked, never stored, and the log stays the one record. docs/events.md,
// "Other vocabularies", has the mapping and says, for every event without a
// counterpart, why.
package vocab

import (
	"fmt"
	"strings"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Vocabularies.
const (
	Core  = "core"
	NoETL = "noetl"
)

// ErrUnknown: not a vocabulary of the package.
var ErrUnknown = fmt.Errorf("vocab: unknown vocabulary (want %s, %s or %s)", Sidecar, Core, NoETL)

// Sidecar is the log's own vocabulary: the records as persisted.
const Sidecar = "sidecar"

// Translate returns the events of a run's records (in runSeq order) in
// vocabulary v. One record may give none, one or two events.
func Translate(v string, recs []statestore.RunEventRecord) ([]any, error) {
	views, err := Views(v, recs)
	if err != nil {
		return nil, err
	}
	out := make([]any, len(views))
	for i, e := range views {
		out[i] = e.Event
	}
	return out, nil
}

// View is one event of a vocabulary with what a consumer keys and routes
// it by.
type View struct {
	// Event is a CoreEvent, a NoETLEvent or, in the Sidecar vocabulary,
	// the record itself.
	Event any
	// ID is the event's id (its dedup key); Type its type in the
	// vocabulary.
	ID, Type string
	// Record is the index in recs of the record the event comes from.
	Record int
}

// Views is Translate with each event's id, type and record. The views
// are folds over the run's records, so the views of a prefix of a run's
// records are a prefix of the views of all of them: a consumer that has
// the views of the first n records needs only the ones after.
func Views(v string, recs []statestore.RunEventRecord) ([]View, error) {
	switch v {
	case Sidecar:
		out := make([]View, len(recs))
		for i := range recs {
			out[i] = View{Event: recs[i], ID: recs[i].EventID, Type: recs[i].EventType, Record: i}
		}
		return out, nil
	case Core:
		evs, from := coreEvents(recs)
		out := make([]View, len(evs))
		for i, e := range evs {
			out[i] = View{Event: e, ID: e.EventID, Type: e.Type, Record: from[i]}
		}
		return out, nil
	case NoETL:
		evs, from := noetlEvents(recs)
		out := make([]View, len(evs))
		for i, e := range evs {
			out[i] = View{Event: e, ID: e.EventID, Type: e.EventType, Record: from[i]}
		}
		return out, nil
	}
	return nil, ErrUnknown
}

// payload is the fields of an event's typed payload the views carry
// over; a type without one of them leaves it empty.
type payload struct {
	Reason      string
	RequestedBy string
	Error       *statestore.StepError
	Artifacts   []statestore.ArtifactRef
	StepID      string
}

func decode(r *statestore.RunEventRecord) payload {
	tp, _ := statestore.DecodePayload(r.EventType, r.Payload)
	switch p := tp.(type) {
	case *statestore.RunQueuedPayload:
		return payload{Reason: p.Reason, RequestedBy: p.RequestedBy}
	case *statestore.StepCompletedPayload:
		return payload{Artifacts: p.Artifacts}
	case *statestore.StepFailedPayload:
		return payload{Error: p.Error, Artifacts: p.Artifacts}
	case *statestore.StepSkippedPayload:
		return payload{Reason: p.Reason}
	case *statestore.RunPausedPayload:
		return payload{Reason: p.Reason, RequestedBy: p.RequestedBy, StepID: p.StepID}
	case *statestore.RunResumedPayload:
		return payload{Reason: p.Reason, RequestedBy: p.RequestedBy}
	case *statestore.RunCompletedPayload:
		return payload{Artifacts: p.Artifacts}
	case *statestore.RunFailedPayload:
		return payload{Error: p.Error}
	case *statestore.RunCancelledPayload:
		return payload{Reason: p.Reason, RequestedBy: p.RequestedBy}
	case *statestore.RunCancelRequestedPayload:
		return payload{Reason: p.Reason, RequestedBy: p.RequestedBy}
	case *statestore.RunStepRetryRequestedPayload:
		return payload{Reason: p.Reason, RequestedBy: p.RequestedBy, StepID: p.StepID}
	case *statestore.RunStepTryEndedPayload:
		return payload{Reason: p.Reason, Error: p.Error, StepID: p.StepID}
	case *statestore.RunStepTryStartedPayload:
		return payload{StepID: p.StepID}
	}
	return payload{}
}

// actorOf is who caused an event, as the Core Events' actor: the
// sidecar's own requesters are "system", "schedule" is the scheduler,
// "conductor" an action taken in Conductor (external), anyone else a user.
func actorOf(requestedBy string) *CoreActor {
	switch {
	case requestedBy == "":
		return &CoreActor{Kind: "system"}
	case requestedBy == statestore.RequestedBySchedule:
		return &CoreActor{Kind: "scheduler", ID: requestedBy}
	case requestedBy == statestore.RequestedByConductor:
		return &CoreActor{Kind: "external", ID: requestedBy}
	case strings.HasPrefix(requestedBy, statestore.RequestedBySidecar):
		return &CoreActor{Kind: "system", ID: requestedBy}
	}
	return &CoreActor{Kind: "user", ID: requestedBy}
}
