package adapter

import (
	"fmt"
	"time"

	"github.com/conductor-sidecar/sidecar/errcode"
)

// Error codes of the RunFailed events the watcher appends (payload.error.code).
const (
	// CodeWorkflowFailed: the workflow FAILED; the message is Conductor's
	// reasonForIncompletion.
	CodeWorkflowFailed = "WORKFLOW_FAILED"
	// CodeWorkflowTimedOut: the workflow TIMED_OUT.
	CodeWorkflowTimedOut = "WORKFLOW_TIMED_OUT"
	// CodeWorkflowTerminated: the workflow was TERMINATED without a cancel
	// request of the sidecar (by hand, or by a failure workflow).
	CodeWorkflowTerminated = "WORKFLOW_TERMINATED"
	// CodeWorkflowNotFound: Conductor no longer knows the run's workflow
	// (for instance its memory store was restarted).
	CodeWorkflowNotFound = "WORKFLOW_NOT_FOUND"
)

// Machine-readable error codes. They are part of the contract: the control
// API returns them verbatim, and callers branch on them with errors.Is on the
// sentinels below.
const (
	// CodeEngineUnavailable: Conductor could not be reached (connection
	// refused, DNS, timeout) or answered 5xx. The call may be retried.
	CodeEngineUnavailable = "ENGINE_UNAVAILABLE"
	// CodeNotFound: Conductor does not know the workflow, task or
	// definition (404, or the 204 that GET /tasks/{id} answers for an
	// unknown id), or the sidecar has no run with that runId.
	CodeNotFound = "NOT_FOUND"
	// CodeConflict: the call does not fit the current state of the
	// workflow (409; resume of a workflow that is not PAUSED; retry of a
	// workflow that is still running).
	CodeConflict = "CONFLICT"
	// CodeEngineRejected: Conductor refused the request as invalid (400 and
	// other 4xx with validation errors). Retrying the same call will not
	// help.
	CodeEngineRejected = "ENGINE_REJECTED"
	// CodePlanVersionConflict: a plan with the same (planId, planVersion)
	// but a different content hash is already registered.
	CodePlanVersionConflict = "PLAN_VERSION_CONFLICT"
	// CodeInvalidInput: the sidecar refused the arguments before sending
	// anything (an empty id, a '|' in an idempotency field, ...).
	CodeInvalidInput = "INVALID_INPUT"
	// CodeRunStartInProgress: another request (possibly on another replica)
	// holds the start lease of the same run request, and it did not finish
	// before the caller's context ended. Retry later.
	CodeRunStartInProgress = "RUN_START_IN_PROGRESS"
	// CodeRunRegistryUnavailable: the run index (the JetStream KV bucket)
	// could not be read or written. The call may be retried.
	CodeRunRegistryUnavailable = "RUN_REGISTRY_UNAVAILABLE"
	// CodeConductorURLInvalid: the server at the Conductor URL answers
	// its health check but 404 to Conductor's API under it: the URL is
	// not the API's base (usually the server's root without /api).
	CodeConductorURLInvalid = "CONDUCTOR_URL_INVALID"
)

// kinds are the kinds of the adapter's codes: Conductor's 404 is NotFound,
// its 409 Conflict, its other 4xx Upstream, no answer (or 5xx) Unavailable.
var kinds = map[string]errcode.Kind{
	CodeEngineUnavailable:      errcode.Unavailable,
	CodeNotFound:               errcode.NotFound,
	CodeConflict:               errcode.Conflict,
	CodeEngineRejected:         errcode.Upstream,
	CodePlanVersionConflict:    errcode.Conflict,
	CodeInvalidInput:           errcode.Invalid,
	CodeRunStartInProgress:     errcode.Conflict,
	CodeRunRegistryUnavailable: errcode.Unavailable,
	CodeConductorURLInvalid:    errcode.Upstream,
}

// Error is an adapter error with a machine-readable Code. Op names the
// operation ("start workflow", "resume"), Status is Conductor's HTTP status
// when there was an answer, Message is Conductor's own message (or ours),
// and EngineStatus is the workflow status the adapter observed when it
// explains the error (for a CONFLICT on resume: "RUNNING").
type Error struct {
	Code         string
	Op           string
	Status       int
	Message      string
	EngineStatus string
	// RetryAt, when set, is when repeating the call may succeed (the
	// start lease of a RUN_START_IN_PROGRESS expires).
	RetryAt time.Time
	Err     error
}

// Error returns "adapter: <op>: <CODE> (HTTP <status>): <message>".
func (e *Error) Error() string {
	s := "adapter: " + e.Code
	if e.Op != "" {
		s = "adapter: " + e.Op + ": " + e.Code
	}
	if e.Status != 0 {
		s += fmt.Sprintf(" (HTTP %d)", e.Status)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Err != nil && e.Message == "" {
		s += ": " + e.Err.Error()
	}
	return s
}

// ErrorCode returns the machine code.
func (e *Error) ErrorCode() string { return e.Code }

// ErrorKind returns the code's kind: callers that must not import the
// adapter ask errors.Is(err, errcode.NotFound) of a Conductor call.
func (e *Error) ErrorKind() errcode.Kind { return kinds[e.Code] }

// Unwrap returns the underlying cause (a transport error, a JetStream
// error, context.DeadlineExceeded), if any.
func (e *Error) Unwrap() error { return e.Err }

// Is matches an *Error with the same Code, so that
// errors.Is(err, adapter.ErrEngineUnavailable) works on every instance,
// and the code's kind (errors.Is(err, errcode.Conflict)).
func (e *Error) Is(target error) bool { return errcode.Match(e, target) }

// Sentinel errors, matched with errors.Is. Every error the adapter returns
// for a Conductor call or a run-registry operation is an *Error matching one
// of them, except that a call whose context was cancelled by the caller
// returns an error matching context.Canceled (and none of these), so callers
// can stay quiet on shutdown.
var (
	// ErrEngineUnavailable matches every ENGINE_UNAVAILABLE error:
	// connection refused, timeouts (including the caller's deadline, which
	// errors.Is(err, context.DeadlineExceeded) also reports), 5xx answers
	// and 2xx answers that cannot be decoded.
	ErrEngineUnavailable = &Error{Code: CodeEngineUnavailable}
	// ErrNotFound matches every NOT_FOUND error.
	ErrNotFound = &Error{Code: CodeNotFound}
	// ErrConductorURLInvalid matches every CONDUCTOR_URL_INVALID error.
	ErrConductorURLInvalid = &Error{Code: CodeConductorURLInvalid}
	// ErrConflict matches every CONFLICT error.
	ErrConflict = &Error{Code: CodeConflict}
	// ErrEngineRejected matches every ENGINE_REJECTED error.
	ErrEngineRejected = &Error{Code: CodeEngineRejected}
	// ErrPlanConflict matches every PLAN_VERSION_CONFLICT error. Nothing
	// was registered.
	ErrPlanConflict = &Error{Code: CodePlanVersionConflict}
	// ErrInvalidInput matches every INVALID_INPUT error. Nothing was sent.
	ErrInvalidInput = &Error{Code: CodeInvalidInput}
	// ErrRunStartInProgress matches every RUN_START_IN_PROGRESS error.
	ErrRunStartInProgress = &Error{Code: CodeRunStartInProgress}
	// ErrRunRegistryUnavailable matches every RUN_REGISTRY_UNAVAILABLE
	// error.
	ErrRunRegistryUnavailable = &Error{Code: CodeRunRegistryUnavailable}
)

func invalidInput(op, format string, args ...any) *Error {
	return &Error{Code: CodeInvalidInput, Op: op, Message: fmt.Sprintf(format, args...)}
}

func registryUnavailable(op string, err error) *Error {
	return &Error{Code: CodeRunRegistryUnavailable, Op: op, Err: err}
}
