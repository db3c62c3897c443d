package statestore

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// KeyInput is the exact field set of the idempotencyKey derivation
// (Run Events Contract §3.1). StepID is empty for run-level events.
type KeyInput struct {
	RunID            string
	StepID           string
	LogicalAttemptID int64
	EventType        string
	PlanID           string
	PlanVersion      string
}

// Preimage returns the UTF-8 preimage
// runId|stepIdNormalized|logicalAttemptId|eventType|planId|planVersion,
// with stepIdNormalized = "RUN" when StepID is empty. Strings are used
// verbatim: no trimming, no case or Unicode normalization.
func (k KeyInput) Preimage() string {
	step := k.StepID
	if step == "" {
		step = RunLevelStepID
	}
	b := make([]byte, 0, len(k.RunID)+len(step)+len(k.EventType)+len(k.PlanID)+len(k.PlanVersion)+25)
	b = append(b, k.RunID...)
	b = append(b, '|')
	b = append(b, step...)
	b = append(b, '|')
	b = strconv.AppendInt(b, k.LogicalAttemptID, 10)
	b = append(b, '|')
	b = append(b, k.EventType...)
	b = append(b, '|')
	b = append(b, k.PlanID...)
	b = append(b, '|')
	b = append(b, k.PlanVersion...)
	return string(b)
}

// Key returns the lowercase hex SHA-256 of the preimage.
func (k KeyInput) Key() string {
	sum := sha256.Sum256([]byte(k.Preimage()))
	return hex.EncodeToString(sum[:])
}

// KeyInput returns the derivation input of w. For run-level events any stepId
// is ignored, as the derivation normalizes it to "RUN".
func (w *RunEventWrite) KeyInput() KeyInput {
	step := ""
	if IsStepEvent(w.EventType) {
		step = w.StepID
	}
	return KeyInput{w.RunID, step, w.LogicalAttemptID, w.EventType, w.PlanID, w.PlanVersion}
}

// Validate checks the key fields with the envelope's rules: runId,
// eventType, planId and planVersion present, valid UTF-8, at most
// MaxIDBytes and without '|'; logicalAttemptId >= 1; stepId present for
// step-level events, absent for run-level ones. It returns an *Error with
// code SCHEMA_VALIDATION_FAILED naming the field.
func (k KeyInput) Validate() error {
	for _, f := range [...]struct{ field, value string }{
		{"runId", k.RunID}, {"eventType", k.EventType}, {"planId", k.PlanID}, {"planVersion", k.PlanVersion},
	} {
		if err := validateID(f.field, f.value, true); err != nil {
			return err
		}
	}
	if k.LogicalAttemptID < 1 {
		return schemaError("logicalAttemptId", "must be an integer >= 1, got %d", k.LogicalAttemptID)
	}
	if IsStepEvent(k.EventType) {
		if k.StepID == "" {
			return schemaError("stepId", "is required for %s", k.EventType)
		}
		return validateID("stepId", k.StepID, true)
	}
	if k.StepID != "" {
		return schemaError("stepId", "must be absent for run-level event %s", k.EventType)
	}
	return nil
}
