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

// IdempotencyKey derives the idempotencyKey for an event from its six
// participating fields. tenantId, projectId, environmentId and engineAttemptId
// do not participate. It does not check the fields; ValidateWrite does.
func IdempotencyKey(runID, stepID string, logicalAttemptID int64, eventType, planID, planVersion string) string {
	return KeyInput{runID, stepID, logicalAttemptID, eventType, planID, planVersion}.Key()
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
