package runlist

import (
	"errors"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Machine codes of the package's errors (the API's "code").
const (
	// CodeSelectorInvalid: a label selector that does not parse
	// (Kubernetes' syntax: "team=data,tier!=gold", "tier in (gold,silver)").
	CodeSelectorInvalid = "LABEL_SELECTOR_INVALID"
	// CodeContinueInvalid: a continue token this list did not hand out.
	CodeContinueInvalid = "CONTINUE_TOKEN_INVALID"
	// CodeSyncing: the replica has not yet read the list from NATS (just
	// started, or its watch is being renewed); try again in a second.
	CodeSyncing = "RUN_LIST_SYNCING"
)

// kinds are the kinds of the package's codes.
var kinds = map[string]errcode.Kind{
	CodeSelectorInvalid: errcode.Invalid,
	CodeContinueInvalid: errcode.Invalid,
	CodeSyncing:         errcode.Unavailable,
}

// Error is an error of the list with a machine code. Errors with the same
// code match with errors.Is.
type Error struct {
	Code    string
	Message string
	// Err is the cause (the selector parser's error), if any; Message
	// already says it.
	Err error
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "runlist: " + e.Code
	}
	return "runlist: " + e.Code + ": " + e.Message
}

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error { return e.Err }

// Is matches errors of the same code, and the code's kind.
func (e *Error) Is(target error) bool { return errcode.Match(e, target) }

// ErrorCode returns the machine code (the API's "code").
func (e *Error) ErrorCode() string { return e.Code }

// ErrorKind returns the code's kind.
func (e *Error) ErrorKind() errcode.Kind { return kinds[e.Code] }

// Errors of the package, matched with errors.Is.
var (
	// ErrSelectorInvalid: see CodeSelectorInvalid.
	ErrSelectorInvalid = &Error{Code: CodeSelectorInvalid}
	// ErrContinueInvalid: see CodeContinueInvalid.
	ErrContinueInvalid = &Error{Code: CodeContinueInvalid}
	// ErrSyncing: see CodeSyncing.
	ErrSyncing = &Error{Code: CodeSyncing, Message: "the run list is being read from NATS; try again in a second"}
	// ErrUnavailable wraps a failure of the list's KV bucket or of the
	// log (a timeout, a closed connection). Its code is the log's
	// STORE_UNAVAILABLE: the list is a view of the log.
	ErrUnavailable = errcode.New(errcode.Unavailable, statestore.CodeStoreUnavailable, "runlist: unavailable")
	// ErrInvalidOptions: Open was given options that cannot work.
	ErrInvalidOptions = errors.New("runlist: invalid options")
)
