package statestore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
)

// Who requested a control event (payload requestedBy) when no operator
// did; an operator's requestedBy is the authenticated principal's name.
const (
	// RequestedByConductor: the action was taken in Conductor's UI or API,
	// and the sidecar recorded it.
	RequestedByConductor = "conductor"
	// RequestedBySidecar: the sidecar itself (e.g. it closed a pause that
	// the run's completion raced). RequestedByWorker names one worker.
	RequestedBySidecar = "sidecar"
	// RequestedBySchedule: a scheduled resume (RunPaused's resumeAt).
	RequestedBySchedule = "schedule"
	// RequestedByBulk: a step of a staggered bulk resume that named no
	// one (the API names the principal).
	RequestedByBulk = "bulk"
)

// RequestedByWorker is the requestedBy of an action a sidecar worker took
// on its own (a pause after a held step failure): "sidecar <workerId>".
func RequestedByWorker(workerID string) string { return RequestedBySidecar + " " + workerID }

// Payload is the typed payload of one known event type: EventType names
// the type it belongs to. Every known event type has one (PayloadFor);
// producers hand it to NewEvent, and readers get it from DecodePayload.
//
// The fields are the contract's (contract/<EventType>.schema.json) plus
// the sidecar's own extension fields, with the contract's JSON names.
// Optional fields are omitted when empty; an optional number whose zero
// is a value of its own (drainTimeoutSeconds, waitedSeconds) is a
// pointer. Fields are declared in the order of their JSON names, the
// order in which encoding/json writes a map's keys, so a typed payload
// encodes to the same bytes as the same fields in a map.
type Payload interface {
	EventType() string
}

// RunQueuedPayload is RunQueued's payload: admission control queued (or
// delayed) the run.
type RunQueuedPayload struct {
	// Labels are the run's labels, given at submission, so that a queued
	// run is selected by them.
	Labels map[string]string `json:"labels,omitempty"`
	// NotBefore is when a delayed run may start (RFC 3339); empty when
	// the run waits for room.
	NotBefore string `json:"notBefore,omitempty"`
	// Policy is the admission policy that held the run (queue, delay).
	Policy string `json:"policy"`
	// Reason says which limit held the run.
	Reason      string `json:"reason"`
	RequestedBy string `json:"requestedBy,omitempty"`
}

// RunApprovedPayload is RunApproved's payload (no fields).
type RunApprovedPayload struct{}

// RunStartedPayload is RunStarted's payload.
type RunStartedPayload struct {
	// EngineRunRef is conductor://<workflowName>/<workflowId>.
	EngineRunRef string `json:"engineRunRef,omitempty"`
	// EngineType is conductor, temporal or mock.
	EngineType string            `json:"engineType,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	// StartedAt is when the engine started the run (RFC 3339); the
	// record's persistedAt stands in when it is empty.
	StartedAt string `json:"startedAt,omitempty"`
}

// StepStartedPayload is StepStarted's payload: empty for a step the
// sidecar gated; for a task of an adopted workflow recorded from what
// Conductor reports, the Conductor task and when Conductor started it.
type StepStartedPayload struct {
	// EngineStartedAt is the Conductor task's startTime (RFC 3339), set
	// when the event was recorded from Conductor's report.
	EngineStartedAt string `json:"engineStartedAt,omitempty"`
	// EngineTaskID is the Conductor task's id.
	EngineTaskID string `json:"engineTaskId,omitempty"`
}

// StepCompletedPayload is StepCompleted's payload: the step's outputs, by
// reference.
type StepCompletedPayload struct {
	Artifacts []ArtifactRef `json:"artifacts,omitempty"`
	// EngineEndedAt is the Conductor task's endTime (RFC 3339), set when
	// the event was recorded from Conductor's report (an adopted
	// workflow's task).
	EngineEndedAt string `json:"engineEndedAt,omitempty"`
	EngineTaskID  string `json:"engineTaskId,omitempty"`
}

// StepFailedPayload is StepFailed's payload.
type StepFailedPayload struct {
	Artifacts []ArtifactRef `json:"artifacts,omitempty"`
	// EngineEndedAt and EngineTaskID: as StepCompletedPayload's.
	EngineEndedAt string     `json:"engineEndedAt,omitempty"`
	EngineTaskID  string     `json:"engineTaskId,omitempty"`
	Error         *StepError `json:"error,omitempty"`
	// OnStepFailure is OnStepFailurePause when the run is paused and the
	// step held for RETRY_STEP; empty (or fail) otherwise.
	OnStepFailure string `json:"onStepFailure,omitempty"`
}

// StepSkippedPayload is StepSkipped's payload.
type StepSkippedPayload struct {
	Reason string `json:"reason,omitempty"`
}

// RunPausedPayload is RunPaused's payload.
type RunPausedPayload struct {
	// DrainTimeoutSeconds is how long the drain waits for in-flight steps
	// (>= 0); nil for the sidecar's default.
	DrainTimeoutSeconds *int64 `json:"drainTimeoutSeconds,omitempty"`
	Reason              string `json:"reason,omitempty"`
	RequestedBy         string `json:"requestedBy,omitempty"`
	// ResumeAt is when the pause is resumed on its own (RFC 3339,
	// requestedBy RequestedBySchedule); empty for a pause that waits for
	// RESUME.
	ResumeAt string `json:"resumeAt,omitempty"`
	// StepID is the step whose failure paused the run (reason
	// stepFailed, onStepFailure: pause).
	StepID string `json:"stepId,omitempty"`
}

// RunResumedPayload is RunResumed's payload.
type RunResumedPayload struct {
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requestedBy,omitempty"`
}

// RunCompletedPayload is RunCompleted's payload.
type RunCompletedPayload struct {
	Artifacts []ArtifactRef `json:"artifacts,omitempty"`
	// EngineStatus is the engine's final status of the workflow.
	EngineStatus string `json:"engineStatus,omitempty"`
}

// RunFailedPayload is RunFailed's payload.
type RunFailedPayload struct {
	EngineStatus string     `json:"engineStatus,omitempty"`
	Error        *StepError `json:"error,omitempty"`
}

// RunCancelledPayload is RunCancelled's payload.
type RunCancelledPayload struct {
	EngineStatus string `json:"engineStatus,omitempty"`
	Reason       string `json:"reason,omitempty"`
	RequestedBy  string `json:"requestedBy,omitempty"`
}

// RunCancelRequestedPayload is RunCancelRequested's payload.
type RunCancelRequestedPayload struct {
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requestedBy,omitempty"`
}

// RunDrainCompletedPayload is RunDrainCompleted's payload.
type RunDrainCompletedPayload struct {
	// WaitedSeconds is how long the drain took (>= 0).
	WaitedSeconds *float64 `json:"waitedSeconds,omitempty"`
}

// RunDrainTimedOutPayload is RunDrainTimedOut's payload.
type RunDrainTimedOutPayload struct {
	// Code is always PauseDrainTimeoutCode (required).
	Code string `json:"code"`
	// InFlightStepIDs are the steps still running at the deadline.
	InFlightStepIDs []string `json:"inFlightStepIds,omitempty"`
	// WaitedSeconds is how long the drain waited (>= 0).
	WaitedSeconds *float64 `json:"waitedSeconds,omitempty"`
}

// RunStepRetryRequestedPayload is RunStepRetryRequested's payload (required).
type RunStepRetryRequestedPayload struct {
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requestedBy,omitempty"`
	// StepID is the held step to run again (required).
	StepID string `json:"stepId"`
	// StepLogicalAttemptID is the logical attempt the retry opens (>= 2,
	// required).
	StepLogicalAttemptID int64 `json:"stepLogicalAttemptId"`
}

// RunStepTryEndedPayload is RunStepTryEnded's payload (required).
type RunStepTryEndedPayload struct {
	// Error is the failed try's error (reason TryEndedEngineTryFailed).
	Error *StepError `json:"error,omitempty"`
	// Reason is TryEndedEngineTryFailed, TryEndedHandedBack,
	// TryEndedWorkerRestarted or TryEndedTaskTimedOut (required).
	Reason string `json:"reason"`
	// StepID and StepLogicalAttemptID name the step's RUNNING attempt
	// (required).
	StepID               string `json:"stepId"`
	StepLogicalAttemptID int64  `json:"stepLogicalAttemptId"`
	// EngineAttemptID is the engine attempt of the try that ended (0:
	// not said, in records written before it was): an end of a try
	// earlier than the step's current one changes no step.
	EngineAttemptID int64 `json:"engineAttemptId,omitempty"`
}

// RunStepTryStartedPayload is RunStepTryStarted's payload (required).
type RunStepTryStartedPayload struct {
	// StepID and StepLogicalAttemptID name the step's RUNNING attempt
	// that runs again (required): an idle one, or one whose current try
	// the engine replaced with a later one.
	StepID               string `json:"stepId"`
	StepLogicalAttemptID int64  `json:"stepLogicalAttemptId"`
	// EngineAttemptID is the engine attempt of the try that started (0:
	// not said, in records written before it was).
	EngineAttemptID int64 `json:"engineAttemptId,omitempty"`
}

func (RunQueuedPayload) EventType() string             { return RunQueued }
func (RunApprovedPayload) EventType() string           { return RunApproved }
func (RunStartedPayload) EventType() string            { return RunStarted }
func (StepStartedPayload) EventType() string           { return StepStarted }
func (StepCompletedPayload) EventType() string         { return StepCompleted }
func (StepFailedPayload) EventType() string            { return StepFailed }
func (StepSkippedPayload) EventType() string           { return StepSkipped }
func (RunPausedPayload) EventType() string             { return RunPaused }
func (RunResumedPayload) EventType() string            { return RunResumed }
func (RunCompletedPayload) EventType() string          { return RunCompleted }
func (RunFailedPayload) EventType() string             { return RunFailed }
func (RunCancelledPayload) EventType() string          { return RunCancelled }
func (RunCancelRequestedPayload) EventType() string    { return RunCancelRequested }
func (RunDrainCompletedPayload) EventType() string     { return RunDrainCompleted }
func (RunDrainTimedOutPayload) EventType() string      { return RunDrainTimedOut }
func (RunStepRetryRequestedPayload) EventType() string { return RunStepRetryRequested }
func (RunStepTryEndedPayload) EventType() string       { return RunStepTryEnded }
func (RunStepTryStartedPayload) EventType() string     { return RunStepTryStarted }

// PayloadFor returns a new zero payload of eventType, as a pointer (for
// decoding), and false for a type the contract does not know. It is the
// one map from event type to payload type.
func PayloadFor(eventType string) (Payload, bool) {
	var p Payload
	switch eventType {
	case RunQueued:
		p = new(RunQueuedPayload)
	case RunApproved:
		p = new(RunApprovedPayload)
	case RunStarted:
		p = new(RunStartedPayload)
	case StepStarted:
		p = new(StepStartedPayload)
	case StepCompleted:
		p = new(StepCompletedPayload)
	case StepFailed:
		p = new(StepFailedPayload)
	case StepSkipped:
		p = new(StepSkippedPayload)
	case RunPaused:
		p = new(RunPausedPayload)
	case RunResumed:
		p = new(RunResumedPayload)
	case RunCompleted:
		p = new(RunCompletedPayload)
	case RunFailed:
		p = new(RunFailedPayload)
	case RunCancelled:
		p = new(RunCancelledPayload)
	case RunCancelRequested:
		p = new(RunCancelRequestedPayload)
	case RunDrainCompleted:
		p = new(RunDrainCompletedPayload)
	case RunDrainTimedOut:
		p = new(RunDrainTimedOutPayload)
	case RunStepRetryRequested:
		p = new(RunStepRetryRequestedPayload)
	case RunStepTryEnded:
		p = new(RunStepTryEndedPayload)
	case RunStepTryStarted:
		p = new(RunStepTryStartedPayload)
	default:
		return nil, false
	}
	return p, true
}

// DecodePayload decodes a record's payload as its event type's Payload (a
// pointer, e.g. *RunPausedPayload). Readers of the log use it: a payload
// that does not fit the shape contributes the fields that do (the
// envelope was validated at append time), and an empty payload decodes to
// the zero payload. ok is false for an event type the contract does not
// know.
func DecodePayload(eventType string, raw json.RawMessage) (p Payload, ok bool) {
	p, ok = PayloadFor(eventType)
	if ok {
		decodeLenient(raw, p)
	}
	return p, ok
}

// decodeLenient decodes raw into v, keeping what fits: encoding/json
// skips a field of the wrong type and goes on with the others.
func decodeLenient(raw json.RawMessage, v any) {
	if len(raw) == 0 || bytes.Equal(raw, []byte("{}")) {
		return
	}
	_ = json.Unmarshal(raw, v)
}

// encodePayload is how NewEvent encodes a producer's payload: a typed
// Payload must be eventType's.
func encodePayload(eventType string, payload any) ([]byte, error) {
	if v := reflect.ValueOf(payload); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, nil
	}
	if p, ok := payload.(Payload); ok && p.EventType() != eventType {
		return nil, fmt.Errorf("it is a %s payload", p.EventType())
	}
	return json.Marshal(payload)
}
