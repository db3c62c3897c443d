package statestore

import (
	"fmt"

	"github.com/conductor-sidecar/sidecar/errcode"
)

// PauseDrainTimeoutCode is the machine code of a drain timeout; the payload
// of RunDrainTimedOut carries it.
const PauseDrainTimeoutCode = "PAUSE_DRAIN_TIMEOUT"

// Machine-readable error codes. They are part of the contract: the HTTP API
// returns them verbatim and operators alert on them.
const (
	// CodeSchemaValidationFailed: the event does not satisfy the envelope
	// rules; nothing was written.
	CodeSchemaValidationFailed = "SCHEMA_VALIDATION_FAILED"
	// CodeInvalidTransition: the event is not allowed from the run's or step's
	// current derived state (Layer 2 rejection, or a projector alert).
	CodeInvalidTransition = "INVALID_TRANSITION"
	// CodeStoreUnavailable: the backend could not be reached; the append may
	// be retried with the same event.
	CodeStoreUnavailable = "STORE_UNAVAILABLE"
	// CodeStoreDamaged: the log is not whole or not the one the sidecar
	// wrote (records missing, rolled back, the stream deleted or replaced,
	// or configured so that records could be removed). Nothing is appended
	// until an operator repairs it (docs/operations.md, "Damaged data dir").
	CodeStoreDamaged = "STORE_DAMAGED"
	// CodeRunChanged: a conditional append (Store.AppendIf) found that the
	// run's log moved past the runSeq the producer decided on; nothing was
	// written. The producer reads the run's state again and decides again.
	CodeRunChanged = "RUN_CHANGED"
	// CodeRunNotFound: the log has no event of the run (ErrNotFound).
	CodeRunNotFound = "RUN_NOT_FOUND"
)

// kinds are the kinds of statestore's codes.
var kinds = map[string]errcode.Kind{
	CodeSchemaValidationFailed: errcode.Invalid,
	CodeInvalidTransition:      errcode.Conflict,
	CodeStoreUnavailable:       errcode.Unavailable,
	CodeStoreDamaged:           errcode.Unavailable,
	CodeRunChanged:             errcode.Conflict,
	CodeRunNotFound:            errcode.NotFound,
}

// Error is a contract error with a machine-readable Code. Field names the
// offending JSON field when there is one. Meta carries deterministic details
// (for INVALID_TRANSITION: runId, stepId, expectedState, actualState,
// attemptedEventType) so that a retry gets the identical answer.
//
// Other packages whose errors are about the log use Error with codes of
// their own (drain's RUN_NOT_FOUND, pgstore's STORE_ROLE_REFUSED) and give
// their kind in Kind; statestore's own codes have theirs whatever Kind
// says.
type Error struct {
	Code    string            `json:"code"`
	Field   string            `json:"field,omitempty"`
	Message string            `json:"message"`
	Meta    map[string]string `json:"meta,omitempty"`
	Kind    errcode.Kind      `json:"-"`
	Err     error             `json:"-"`
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s", e.Code, e.Field, e.Message)
	}
	return e.Code + ": " + e.Message
}

// Unwrap returns the underlying cause, if any.
func (e *Error) Unwrap() error { return e.Err }

// ErrorCode returns the machine code.
func (e *Error) ErrorCode() string { return e.Code }

// ErrorKind returns the kind of the code: statestore's own, else Kind.
func (e *Error) ErrorKind() errcode.Kind {
	if k, ok := kinds[e.Code]; ok {
		return k
	}
	return e.Kind
}

// Is matches any *Error with the same Code, so that
// errors.Is(err, statestore.ErrSchemaValidation) works on every instance,
// and the code's kind (errors.Is(err, errcode.Conflict)).
func (e *Error) Is(target error) bool { return errcode.Match(e, target) }

// Sentinel errors, matched with errors.Is.
var (
	// ErrSchemaValidation matches every SCHEMA_VALIDATION_FAILED error.
	ErrSchemaValidation = &Error{Code: CodeSchemaValidationFailed}
	// ErrInvalidTransition matches every INVALID_TRANSITION error.
	ErrInvalidTransition = &Error{Code: CodeInvalidTransition}
	// ErrUnavailable matches every STORE_UNAVAILABLE error.
	ErrUnavailable = &Error{Code: CodeStoreUnavailable}
	// ErrDamaged matches every STORE_DAMAGED error.
	ErrDamaged = &Error{Code: CodeStoreDamaged}
	// ErrRunChanged matches every RUN_CHANGED error.
	ErrRunChanged = &Error{Code: CodeRunChanged}
	// ErrNotFound is returned when a run has no events (RUN_NOT_FOUND,
	// matched by identity).
	ErrNotFound = errcode.New(errcode.NotFound, CodeRunNotFound, "statestore: run not found")
)

func schemaError(field, format string, args ...any) *Error {
	return &Error{Code: CodeSchemaValidationFailed, Field: field, Message: fmt.Sprintf(format, args...)}
}

// RunChanged is the RUN_CHANGED error of a conditional append of runID
// decided on runSeq want, when the run's last runSeq is have (-1: not
// known). Backends return it; nothing was written.
func RunChanged(runID string, want, have int64) error {
	msg := fmt.Sprintf("run %s changed: its last runSeq is %d, the event was decided on %d", runID, have, want)
	if have < 0 {
		msg = fmt.Sprintf("run %s changed after runSeq %d, which the event was decided on", runID, want)
	}
	return &Error{Code: CodeRunChanged, Message: msg, Meta: map[string]string{"runId": runID}}
}
