package statestore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// DecodeWrite is the contract tests' strict decoder of a producer's
// JSON event: the sidecar builds its writes in Go and decodes none.

// DecodeWrite decodes one JSON RunEventWrite strictly (unknown fields,
// trailing data, non-integer attempts and oversized input are refused) and
// validates it. Every failure is an *Error with code SCHEMA_VALIDATION_FAILED.
func DecodeWrite(data []byte) (*RunEventWrite, error) {
	if len(data) > MaxEventBytes {
		return nil, schemaError("", "event is %d bytes; the limit is %d", len(data), MaxEventBytes)
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, schemaError("", "event must be a JSON object")
	}
	if err := checkTopLevelKeys(data); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var w RunEventWrite
	if err := dec.Decode(&w); err != nil {
		return nil, decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, schemaError("", "unexpected data after the event object")
	}
	if bytes.Equal(bytes.TrimSpace(w.Payload), []byte("null")) {
		w.Payload = nil
	}
	if err := ValidateWrite(&w); err != nil {
		return nil, err
	}
	return &w, nil
}

var writeFields = map[string]bool{
	"eventId": true, "eventType": true, "emittedAt": true, "runId": true, "tenantId": true,
	"projectId": true, "environmentId": true, "planId": true, "planVersion": true,
	"engineAttemptId": true, "logicalAttemptId": true, "idempotencyKey": true, "stepId": true, "payload": true,
}

// checkTopLevelKeys refuses keys that are not RunEventWrite fields spelled
// exactly (encoding/json matches names case-insensitively) and duplicate keys
// (whose meaning JSON leaves open).
func checkTopLevelKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // the opening brace
		return decodeError(err)
	}
	seen := make(map[string]bool, len(writeFields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return decodeError(err)
		}
		key, _ := tok.(string)
		if !writeFields[key] {
			return &Error{Code: CodeSchemaValidationFailed, Field: key, Message: "is not a field of RunEventWrite (names are case-sensitive)"}
		}
		if seen[key] {
			return &Error{Code: CodeSchemaValidationFailed, Field: key, Message: "appears more than once"}
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return decodeError(err)
		}
	}
	return nil
}

func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return &Error{Code: CodeSchemaValidationFailed, Field: typeErr.Field,
			Message: fmt.Sprintf("must be %s, got JSON %s", goTypeName(typeErr.Type.Kind().String()), typeErr.Value), Err: err}
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return &Error{Code: CodeSchemaValidationFailed, Field: strings.Trim(f, `"`), Message: "is not a field of RunEventWrite", Err: err}
	}
	return &Error{Code: CodeSchemaValidationFailed, Message: "malformed JSON: " + strings.TrimPrefix(msg, "json: "), Err: err}
}

func goTypeName(kind string) string {
	switch kind {
	case "int64":
		return "an integer"
	case "string":
		return "a string"
	case "slice":
		return "a JSON object"
	}
	return kind
}
