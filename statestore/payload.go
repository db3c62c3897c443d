package statestore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Failure policies a StepFailed payload may name (onStepFailure): with
// "pause" the step is held after the failure and may be retried.
const (
	OnStepFailureFail  = "fail"
	OnStepFailurePause = "pause"
)

// The payload shapes of the known event types, as in contract/<Type>.schema.json.
// Fields not listed are allowed and kept; listed fields must have their type.
type (
	artifactsPayload struct {
		Artifacts []ArtifactRef `json:"artifacts"`
	}
	runStartedPayload struct {
		EngineRunRef string            `json:"engineRunRef"`
		EngineType   string            `json:"engineType"`
		StartedAt    string            `json:"startedAt"`
		Labels       map[string]string `json:"labels"`
	}
	runQueuedPayload struct {
		Labels map[string]string `json:"labels"`
	}
	stepFailedPayload struct {
		Error         *StepError    `json:"error"`
		Artifacts     []ArtifactRef `json:"artifacts"`
		OnStepFailure string        `json:"onStepFailure"`
	}
	stepRetryPayload struct {
		StepID               *string `json:"stepId"`
		StepLogicalAttemptID *int64  `json:"stepLogicalAttemptId"`
		Reason               string  `json:"reason"`
		RequestedBy          string  `json:"requestedBy"`
	}
	stepTryPayload struct {
		StepID               *string    `json:"stepId"`
		StepLogicalAttemptID *int64     `json:"stepLogicalAttemptId"`
		Reason               *string    `json:"reason"`
		Error                *StepError `json:"error"`
	}
	runFailedPayload struct {
		Error *StepError `json:"error"`
	}
	reasonPayload struct {
		Reason      string `json:"reason"`
		RequestedBy string `json:"requestedBy"`
	}
	runPausedPayload struct {
		Reason              string  `json:"reason"`
		RequestedBy         string  `json:"requestedBy"`
		StepID              string  `json:"stepId"`
		DrainTimeoutSeconds *int64  `json:"drainTimeoutSeconds"`
		ResumeAt            *string `json:"resumeAt"`
	}
	drainPayload struct {
		Code            *string  `json:"code"`
		InFlightStepIDs []string `json:"inFlightStepIds"`
		WaitedSeconds   *float64 `json:"waitedSeconds"`
	}
	stepSkippedPayload struct {
		Reason string `json:"reason"`
	}
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
		var p runQueuedPayload
		return decode(&p)
	case RunStarted:
		var p runStartedPayload
		if err := decode(&p); err != nil {
			return err
		}
		switch p.EngineType {
		case "", "conductor", "temporal", "mock":
		default:
			return schemaError("payload.engineType", "must be conductor, temporal or mock")
		}
		return validateOptionalTime("payload.startedAt", p.StartedAt)
	case StepCompleted, RunCompleted:
		var p artifactsPayload
		if err := decode(&p); err != nil {
			return err
		}
		return validateArtifacts(p.Artifacts)
	case StepFailed:
		var p stepFailedPayload
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
		var p stepRetryPayload
		if err := decode(&p); err != nil {
			return err
		}
		return validateStepRef(p.StepID, p.StepLogicalAttemptID, 2, " (a retry opens a later attempt)")
	case RunStepTryEnded, RunStepTryStarted:
		var p stepTryPayload
		if err := decode(&p); err != nil {
			return err
		}
		if err := validateStepRef(p.StepID, p.StepLogicalAttemptID, 1, ""); err != nil {
			return err
		}
		if eventType == RunStepTryEnded {
			if p.Reason == nil {
				return schemaError("payload.reason", "is required")
			}
			switch *p.Reason {
			case TryEndedEngineTryFailed, TryEndedHandedBack, TryEndedWorkerRestarted:
			default:
				return schemaError("payload.reason", "must be %s, %s or %s", TryEndedEngineTryFailed, TryEndedHandedBack, TryEndedWorkerRestarted)
			}
			if p.Error != nil {
				return validateStepError(p.Error)
			}
		}
		return nil
	case RunFailed:
		var p runFailedPayload
		if err := decode(&p); err != nil {
			return err
		}
		return validateStepError(p.Error)
	case StepSkipped:
		return decode(&stepSkippedPayload{})
	case RunResumed, RunCancelled, RunCancelRequested:
		return decode(&reasonPayload{})
	case RunPaused:
		var p runPausedPayload
		if err := decode(&p); err != nil {
			return err
		}
		if p.DrainTimeoutSeconds != nil && *p.DrainTimeoutSeconds < 0 {
			return schemaError("payload.drainTimeoutSeconds", "must be >= 0")
		}
		if p.ResumeAt != nil {
			if _, err := time.Parse(time.RFC3339Nano, *p.ResumeAt); err != nil {
				return schemaError("payload.resumeAt", "must be an RFC 3339 time")
			}
		}
	case RunDrainCompleted, RunDrainTimedOut:
		var p drainPayload
		if err := decode(&p); err != nil {
			return err
		}
		if p.WaitedSeconds != nil && *p.WaitedSeconds < 0 {
			return schemaError("payload.waitedSeconds", "must be >= 0")
		}
		if eventType == RunDrainTimedOut && (p.Code == nil || *p.Code != PauseDrainTimeoutCode) {
			return schemaError("payload.code", "must be %s", PauseDrainTimeoutCode)
		}
	}
	return nil
}

// validateStepRef checks the step a run-level event names in its payload:
// stepId present and a valid id, stepLogicalAttemptId present and at least
// min (why says why, for the message).
func validateStepRef(stepID *string, attempt *int64, min int64, why string) error {
	switch {
	case stepID == nil || *stepID == "":
		return schemaError("payload.stepId", "is required")
	case attempt == nil:
		return schemaError("payload.stepLogicalAttemptId", "is required")
	case *attempt < min:
		return schemaError("payload.stepLogicalAttemptId", "must be >= %d%s", min, why)
	}
	return validateID("payload.stepId", *stepID, true)
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
