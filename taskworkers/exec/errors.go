package exec

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/conductor-sidecar/sidecar/taskworkers"
)

// Machine codes of step errors. They are part of the contract: they go to
// StepFailed events and Conductor's reasonForIncompletion.
const (
	// CodeSpecInvalid: the executor spec is malformed or does not match
	// the executor. Not retryable.
	CodeSpecInvalid = "EXECUTOR_SPEC_INVALID"
	// CodeUnknownExecutor: no executor for Spec.Type. Not retryable.
	CodeUnknownExecutor = taskworkers.CodeUnknownExecutor
	// CodeInternal: the executor panicked (a bug). Not retryable.
	CodeInternal = "EXECUTOR_INTERNAL_ERROR"
	// CodeStepTimeout: the step's deadline passed (ctx deadline exceeded).
	// Retryable.
	CodeStepTimeout = "STEP_TIMEOUT"
	// CodeStepInterrupted: the step was cancelled (run cancelled, worker
	// shutdown). Not retryable: the canceller decides what comes next.
	CodeStepInterrupted = "STEP_INTERRUPTED"
	// CodeCommandFailed: the command exited non-zero or was killed by a
	// signal it was not sent by the executor. Retryable (the step's retry
	// policy bounds it); the exit code is in Output.
	CodeCommandFailed = "COMMAND_FAILED"
	// CodeCommandStartFailed: the command could not be started. Not
	// retryable when the cause is permanent (not found, permission, bad
	// working directory, not executable); retryable for resource
	// exhaustion (EAGAIN, ENOMEM, EMFILE, ...).
	CodeCommandStartFailed = "COMMAND_START_FAILED"
	// CodeHTTPRequestFailed: no HTTP response (connection refused, TLS,
	// reset, the default request timeout). Retryable.
	CodeHTTPRequestFailed = "HTTP_REQUEST_FAILED"
	// CodeHTTPDestinationForbidden: the request (or a redirect) would
	// connect to an address the executor may not reach: loopback,
	// link-local, private, unspecified, multicast or reserved without an
	// Options.HTTPAllow entry, or an Options.HTTPDeny address (the
	// sidecar's own API, Conductor) whatever the allow list says. Not
	// retryable.
	CodeHTTPDestinationForbidden = "HTTP_DESTINATION_FORBIDDEN"
	// CodeHTTPStatusPrefix prefixes the code of a non-2xx response:
	// HTTP_STATUS_503. Retryable when the status is in the spec's
	// RetryableStatus (default 408, 429, 500, 502, 503, 504).
	CodeHTTPStatusPrefix = "HTTP_STATUS_"
)

// Errors of Registry.Open, which ends the commands a dead process left
// running (Options.CommandDir).
var (
	// ErrCommandDirUnusable: the command records' directory cannot be
	// created, read, locked or written.
	ErrCommandDirUnusable = errors.New("command records directory is not usable")
	// ErrCommandDirLocked: another process keeps its command records in
	// the same directory.
	ErrCommandDirLocked = errors.New("command records directory is locked by another process")
	// ErrLeftoverCommand: a process group recorded by a dead process still
	// runs after SIGKILL; starting would run its step's next try beside it.
	ErrLeftoverCommand = errors.New("a command of a previous process still runs")
)

// ErrDestinationForbidden matches every *DestinationError: errors.Is(err,
// ErrDestinationForbidden) tells a refused destination from a network
// failure.
var ErrDestinationForbidden = errors.New("http destination forbidden")

// DestinationError is the http executor's refusal to connect to an
// address. The step fails with HTTP_DESTINATION_FORBIDDEN, not retryable.
type DestinationError struct {
	// Host is the host the request named (a name or an IP literal).
	Host string
	// Addr is the address that would have been dialled.
	Addr netip.AddrPort
	// Reason says why: the address's class ("loopback", "private", ...)
	// or that it is always denied.
	Reason string
	// Always is true for an Options.HTTPDeny address, which HTTPAllow
	// cannot allow.
	Always bool
}

func (e *DestinationError) Error() string {
	if e.Always {
		return fmt.Sprintf("destination %s (%s) is forbidden: %s; it is never allowed", e.Host, e.Addr, e.Reason)
	}
	return fmt.Sprintf("destination %s (%s) is forbidden: %s address (allow it with --http-allow)", e.Host, e.Addr, e.Reason)
}

// Is matches ErrDestinationForbidden.
func (e *DestinationError) Is(target error) bool { return target == ErrDestinationForbidden }
