package statestore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"
)

// Failure policies a StepFailed payload may name (onStepFailure): with
// "pause" the step is held after the failure and may be retried.
const (
	OnStepFailureFail  = "fail"
	OnStepFailurePause = "pause"
)

// absent marks, before decoding, a field whose absence the contract tells
// apart from its zero value: a field still holding it after decoding was
// absent (or null).
const (
	absentInt    int64 = math.MinInt64
	absentString       = "\x00absent"
)

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// validateKnownPayload checks the payload fields that the event type's schema
// types. It is called with a payload that is already a JSON object.
func validateKnownPayload(eventType string, raw json.RawMessage) error {
	if len(raw) == 0 && eventType != RunDrainTimedOut && eventType != RunStepRetryRequested &&
		eventType != RunStepTryEnded && eventType != RunStepTryStarted {
		return nil
	}
	decode := func(v any) error {
		if len(raw) == 0 {
			return nil
		}
		if err := json.NewDecoder(bytes.NewReader(raw)).Decode(v); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				return &Error{Code: CodeSchemaValidationFailed, Field: "payload." + te.Field,
					Message: fmt.Sprintf("has the wrong type (JSON %s)", te.Value), Err: err}
			}
			return schemaError("payload", "malformed: %v", err)
		}
		return nil
	}
	switch eventType {
	case RunQueued:
		// policy, reason, notBefore and requestedBy are the sidecar's own
		// fields, which the contract leaves untyped.
		var p struct {
			RunQueuedPayload
			NotBefore   json.RawMessage `json:"notBefore"`
			Policy      json.RawMessage `json:"policy"`
			Reason      json.RawMessage `json:"reason"`
			RequestedBy json.RawMessage `json:"requestedBy"`
		}
		return decode(&p)
	case RunStarted:
		var p RunStartedPayload
		if err := decode(&p); err != nil {
			return err
		}
		switch p.EngineType {
		case "", "conductor", "temporal", "mock":
		default:
			return schemaError("payload.engineType", "must be conductor, temporal or mock")
		}
		return validateOptionalTime("payload.startedAt", p.StartedAt)
	case StepCompleted:
		var p StepCompletedPayload
		if err := decode(&p); err != nil {
			return err
		}
		return validateArtifacts(p.Artifacts)
	case RunCompleted:
		var p struct {
			RunCompletedPayload
			EngineStatus json.RawMessage `json:"engineStatus"` // the sidecar's own, untyped by the contract
		}
		if err := decode(&p); err != nil {
			return err
		}
		return validateArtifacts(p.Artifacts)
	case StepFailed:
		var p StepFailedPayload
		if err := decode(&p); err != nil {
			return err
		}
		if err := validateStepError(p.Error); err != nil {
			return err
		}
		switch p.OnStepFailure {
		case "", OnStepFailureFail, OnStepFailurePause:
		default:
			return schemaError("payload.onStepFailure", "must be %s or %s", OnStepFailureFail, OnStepFailurePause)
		}
		return validateArtifacts(p.Artifacts)
	case RunStepRetryRequested:
		p := RunStepRetryRequestedPayload{StepLogicalAttemptID: absentInt}
		if err := decode(&p); err != nil {
			return err
		}
		return validateStepRef(p.StepID, p.StepLogicalAttemptID, 2, " (a retry opens a later attempt)")
	case RunStepTryStarted:
		// reason and error, if given, are typed as RunStepTryEnded's.
		p := struct {
			RunStepTryStartedPayload
			Reason *string    `json:"reason"`
			Error  *StepError `json:"error"`
		}{RunStepTryStartedPayload: RunStepTryStartedPayload{StepLogicalAttemptID: absentInt}}
		if err := decode(&p); err != nil {
			return err
		}
		if p.EngineAttemptID < 0 {
			return schemaError("payload.engineAttemptId", "must be at least 1 when given")
		}
		return validateStepRef(p.StepID, p.StepLogicalAttemptID, 1, "")
	case RunStepTryEnded:
		p := RunStepTryEndedPayload{StepLogicalAttemptID: absentInt, Reason: absentString}
		if err := decode(&p); err != nil {
			return err
		}
		if err := validateStepRef(p.StepID, p.StepLogicalAttemptID, 1, ""); err != nil {
			return err
		}
		if p.EngineAttemptID < 0 {
			return schemaError("payload.engineAttemptId", "must be at least 1 when given")
		}
		switch p.Reason {
		case TryEndedEngineTryFailed, TryEndedHandedBack, TryEndedWorkerRestarted, TryEndedTaskTimedOut, TryEndedSubWorkflowPaused:
		case absentString:
			return schemaError("payload.reason", "is required")
		default:
			return schemaError("payload.reason", "must be %s, %s, %s, %s or %s", TryEndedEngineTryFailed, TryEndedHandedBack,
				TryEndedWorkerRestarted, TryEndedTaskTimedOut, TryEndedSubWorkflowPaused)
		}
		return validateStepError(p.Error)
	case RunFailed:
		var p struct {
			RunFailedPayload
			EngineStatus json.RawMessage `json:"engineStatus"` // the sidecar's own, untyped by the contract
		}
		if err := decode(&p); err != nil {
			return err
		}
		return validateStepError(p.Error)
	case StepSkipped:
		return decode(&StepSkippedPayload{})
	case RunResumed:
		return decode(&RunResumedPayload{})
	case RunCancelRequested:
		return decode(&RunCancelRequestedPayload{})
	case RunCancelled:
		return decode(&struct {
			RunCancelledPayload
			EngineStatus json.RawMessage `json:"engineStatus"` // the sidecar's own, untyped by the contract
		}{})
	case RunPaused:
		p := RunPausedPayload{ResumeAt: absentString}
		if err := decode(&p); err != nil {
			return err
		}
		if p.DrainTimeoutSeconds != nil && *p.DrainTimeoutSeconds < 0 {
			return schemaError("payload.drainTimeoutSeconds", "must be >= 0")
		}
		if p.ResumeAt != absentString {
			if _, err := time.Parse(time.RFC3339Nano, p.ResumeAt); err != nil {
				return schemaError("payload.resumeAt", "must be an RFC 3339 time")
			}
		}
	case RunDrainCompleted:
		// code and inFlightStepIds, if given, are typed as RunDrainTimedOut's.
		var p struct {
			RunDrainCompletedPayload
			Code            *string  `json:"code"`
			InFlightStepIDs []string `json:"inFlightStepIds"`
		}
		if err := decode(&p); err != nil {
			return err
		}
		return validateWaited(p.WaitedSeconds)
	case RunDrainTimedOut:
		var p RunDrainTimedOutPayload
		if err := decode(&p); err != nil {
			return err
		}
		if err := validateWaited(p.WaitedSeconds); err != nil {
			return err
		}
		if p.Code != PauseDrainTimeoutCode {
			return schemaError("payload.code", "must be %s", PauseDrainTimeoutCode)
		}
	}
	return nil
}

func validateWaited(s *float64) error {
	if s != nil && *s < 0 {
		return schemaError("payload.waitedSeconds", "must be >= 0")
	}
	return nil
}

// validateStepRef checks the step a run-level event names in its payload:
// stepId present and a valid id, stepLogicalAttemptId present (not
// absentInt) and at least min (why says why, for the message).
func validateStepRef(stepID string, attempt int64, min int64, why string) error {
	switch {
	case stepID == "":
		return schemaError("payload.stepId", "is required")
	case attempt == absentInt:
		return schemaError("payload.stepLogicalAttemptId", "is required")
	case attempt < min:
		return schemaError("payload.stepLogicalAttemptId", "must be >= %d%s", min, why)
	}
	return validateID("payload.stepId", stepID, true)
}

func validateArtifacts(refs []ArtifactRef) error {
	for i, a := range refs {
		field := fmt.Sprintf("payload.artifacts[%d]", i)
		switch {
		case a.URI == "":
			return schemaError(field+".uri", "is required")
		case a.Kind == "":
			return schemaError(field+".kind", "is required")
		case a.SHA256 != "" && !sha256Hex.MatchString(a.SHA256):
			return schemaError(field+".sha256", "must be 64 lowercase hex digits")
		case a.SizeBytes < 0:
			return schemaError(field+".sizeBytes", "must be >= 0")
		}
		if err := validateOptionalTime(field+".expiresAt", a.ExpiresAt); err != nil {
			return err
		}
	}
	return nil
}

func validateStepError(e *StepError) error {
	if e == nil {
		return nil
	}
	if e.Code == "" {
		return schemaError("payload.error.code", "is required")
	}
	if e.Message == "" {
		return schemaError("payload.error.message", "is required")
	}
	return nil
}

func validateOptionalTime(field, v string) error {
	if v == "" {
		return nil
	}
	if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
		return schemaError(field, "must be an RFC 3339 timestamp")
	}
	return nil
}
