package statestore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits on identifiers and payloads. Identifiers end up in NATS subjects
// and KV keys, whose control line is 4 KiB; a clear limit refuses over-long
// ids before they can close a connection.
const (
	// MaxIDBytes bounds runId, stepId, planId, planVersion, eventType,
	// tenantId, projectId and environmentId (UTF-8 bytes).
	MaxIDBytes = 256
	// MaxPayloadBytes bounds the JSON payload. Outputs go by reference.
	MaxPayloadBytes = 64 << 10
	// MaxEventBytes bounds a whole encoded RunEventWrite accepted by DecodeWrite.
	MaxEventBytes = MaxPayloadBytes + 8<<10
)

// ValidateWrite checks w against the envelope rules of the Run Events
// Contract v2.0.1 before it is appended. It returns an *Error with code
// SCHEMA_VALIDATION_FAILED naming the first offending field, or nil.
//
// Checked: every required field present; eventId a canonical UUID v4;
// emittedAt RFC 3339 with a zero UTC offset; attempts >= 1; stepId present
// for Step* events and absent otherwise; no '|' in runId, eventType, planId,
// planVersion or stepId; identifiers valid UTF-8 and at most MaxIDBytes;
// payload a JSON object of at most MaxPayloadBytes; idempotencyKey equal to
// the derivation.
func ValidateWrite(w *RunEventWrite) error {
	if w == nil {
		return schemaError("", "event is missing")
	}
	if err := validateUUIDv4(w.EventID); err != nil {
		return err
	}
	ids := [...]struct {
		field, value string
		noPipe       bool
	}{
		{"eventType", w.EventType, true},
		{"runId", w.RunID, true},
		{"tenantId", w.TenantID, false},
		{"projectId", w.ProjectID, false},
		{"environmentId", w.EnvironmentID, false},
		{"planId", w.PlanID, true},
		{"planVersion", w.PlanVersion, true},
	}
	for _, id := range ids {
		if err := validateID(id.field, id.value, id.noPipe); err != nil {
			return err
		}
	}
	if err := validateUTC("emittedAt", w.EmittedAt); err != nil {
		return err
	}
	if w.EngineAttemptID < 1 {
		return schemaError("engineAttemptId", "must be an integer >= 1, got %d", w.EngineAttemptID)
	}
	if w.LogicalAttemptID < 1 {
		return schemaError("logicalAttemptId", "must be an integer >= 1, got %d", w.LogicalAttemptID)
	}
	if IsStepEvent(w.EventType) {
		if w.StepID == "" {
			return schemaError("stepId", "is required for %s", w.EventType)
		}
		if err := validateID("stepId", w.StepID, true); err != nil {
			return err
		}
	} else if w.StepID != "" {
		return schemaError("stepId", "must be absent for run-level event %s", w.EventType)
	}
	if err := validatePayload(w.Payload); err != nil {
		return err
	}
	if err := validateKnownPayload(w.EventType, w.Payload); err != nil {
		return err
	}
	if w.IdempotencyKey == "" {
		return schemaError("idempotencyKey", "is required")
	}
	if want := w.KeyInput().Key(); w.IdempotencyKey != want {
		return schemaError("idempotencyKey", "does not match the derivation SHA256(%q): want %s", w.KeyInput().Preimage(), want)
	}
	return nil
}

func validateID(field, v string, noPipe bool) error {
	if err := CheckID(v, noPipe); err != nil {
		return schemaError(field, "%s", err)
	}
	return nil
}

// CheckID is the one rule for the contract's identifiers (runId, tenantId,
// projectId, environmentId, planId, planVersion, stepId, eventType): present,
// at most MaxIDBytes, valid UTF-8, no NUL, and, with noPipe, no '|' (the
// idempotencyKey's separator). The error says what is wrong, without the
// field's name: callers name it.
func CheckID(v string, noPipe bool) error {
	switch {
	case v == "":
		return errors.New("is required")
	case len(v) > MaxIDBytes:
		return fmt.Errorf("is %d bytes; the limit is %d", len(v), MaxIDBytes)
	case !utf8.ValidString(v):
		return errors.New("is not valid UTF-8")
	case noPipe && strings.IndexByte(v, '|') >= 0:
		return errors.New("must not contain '|'")
	case strings.IndexByte(v, 0) >= 0:
		return errors.New("must not contain NUL")
	}
	return nil
}

// validateUUIDv4 accepts the canonical 8-4-4-4-12 hex form (either case)
// with version nibble 4 and the RFC 4122 variant.
func validateUUIDv4(v string) error {
	if v == "" {
		return schemaError("eventId", "is required")
	}
	if len(v) != 36 {
		return schemaError("eventId", "must be a UUID v4 in 8-4-4-4-12 form")
	}
	for i := 0; i < 36; i++ {
		c := v[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return schemaError("eventId", "must be a UUID v4 in 8-4-4-4-12 form")
			}
			continue
		}
		if !isHex(c) {
			return schemaError("eventId", "must be a UUID v4 in 8-4-4-4-12 form")
		}
	}
	if v[14] != '4' {
		return schemaError("eventId", "must be a UUID v4; version nibble is %q", v[14])
	}
	switch v[19] {
	case '8', '9', 'a', 'b', 'A', 'B':
	default:
		return schemaError("eventId", "must be a UUID v4 with the RFC 4122 variant")
	}
	return nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func validateUTC(field, v string) error {
	if v == "" {
		return schemaError(field, "is required")
	}
	if !rfc3339Shape(v) {
		return schemaError(field, "must be an RFC 3339 timestamp like 2026-02-11T10:30:00.000Z")
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return schemaError(field, "must be an RFC 3339 timestamp: %v", err)
	}
	if _, off := t.Zone(); off != 0 {
		return schemaError(field, "must be in UTC (Z or +00:00)")
	}
	return nil
}

// rfc3339Shape checks the exact RFC 3339 date-time layout
// YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM), which time.Parse checks only
// loosely (it accepts a one-digit hour).
func rfc3339Shape(v string) bool {
	const head = "dddd-dd-ddTdd:dd:dd"
	if len(v) < len(head)+1 {
		return false
	}
	for i := 0; i < len(head); i++ {
		if head[i] == 'd' {
			if v[i] < '0' || v[i] > '9' {
				return false
			}
		} else if v[i] != head[i] {
			return false
		}
	}
	rest := v[len(head):]
	if rest[0] == '.' {
		n := 1
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n == 1 {
			return false
		}
		rest = rest[n:]
	}
	if rest == "Z" {
		return true
	}
	return len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && isDigit(rest[1]) && isDigit(rest[2]) &&
		rest[3] == ':' && isDigit(rest[4]) && isDigit(rest[5])
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func validatePayload(p json.RawMessage) error {
	if len(p) == 0 {
		return nil
	}
	if len(p) > MaxPayloadBytes {
		return schemaError("payload", "is %d bytes; the limit is %d", len(p), MaxPayloadBytes)
	}
	trimmed := bytes.TrimLeft(p, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(p) {
		return schemaError("payload", "must be a JSON object")
	}
	return nil
}
