package drain

import (
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Machine codes of the controller's own errors; the others are the event
// log's (statestore: INVALID_TRANSITION, SCHEMA_VALIDATION_FAILED,
// STORE_UNAVAILABLE, RUN_CHANGED) and the timeout's (statestore.PauseDrainTimeoutCode).
const (
	// CodeRunNotFound: no run with that id.
	CodeRunNotFound = statestore.CodeRunNotFound
	// CodeStepNotFound: the run has no step with that id (none of its
	// events names it).
	CodeStepNotFound = "STEP_NOT_FOUND"
)

// Errors of the controller, matched with errors.Is; both are
// errcode.NotFound.
var (
	// ErrRunNotFound matches every RUN_NOT_FOUND error of the controller.
	ErrRunNotFound = &statestore.Error{Code: CodeRunNotFound, Kind: errcode.NotFound, Message: "no such run"}
	// ErrStepNotFound matches every STEP_NOT_FOUND error.
	ErrStepNotFound = &statestore.Error{Code: CodeStepNotFound, Kind: errcode.NotFound, Message: "no such step in this run"}
)

// keysUnavailable is the error of a Keys operation the bucket did not
// answer: STORE_UNAVAILABLE, like the event log's (the same NATS, and safe
// to retry), the code the API documents for a bulk action (a staggered
// resume's schedule is written here); not the run index's
// RUN_REGISTRY_UNAVAILABLE, which is Conductor's side.
func keysUnavailable(op string, err error) error {
	return &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "pause keys: " + op + ": " + err.Error(), Err: err}
}
