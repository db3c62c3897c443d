package admission

import (
	"time"

	"github.com/conductor-sidecar/sidecar/errcode"
)

// Machine codes of the package's errors (the API's "code").
const (
	// CodeRejected: a limit on active runs is reached and the policy is
	// reject; nothing was started or recorded. Retry after RetryAfter.
	CodeRejected = "ADMISSION_REJECTED"
	// CodeUnavailable: the admission queue (its KV bucket) did not answer.
	CodeUnavailable = "ADMISSION_UNAVAILABLE"
	// CodeInvalid: admission options that cannot work.
	CodeInvalid = "ADMISSION_INVALID"
)

// kinds are the kinds of the package's codes.
var kinds = map[string]errcode.Kind{
	CodeRejected:    errcode.Rejected,
	CodeUnavailable: errcode.Unavailable,
	CodeInvalid:     errcode.Invalid,
}

// Error is an error of the package with a machine code. Errors with the
// same code match with errors.Is.
type Error struct {
	Code    string
	Message string
	Err     error
	// RetryAfter, for ADMISSION_REJECTED, is when a retry may succeed.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	s := "admission: " + e.Code
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is matches errors of the same code, and the code's kind.
func (e *Error) Is(target error) bool { return errcode.Match(e, target) }

// ErrorCode returns the machine code.
func (e *Error) ErrorCode() string { return e.Code }

// ErrorKind returns the code's kind.
func (e *Error) ErrorKind() errcode.Kind { return kinds[e.Code] }

// Errors of the package, matched with errors.Is.
var (
	// ErrRejected: see CodeRejected.
	ErrRejected = &Error{Code: CodeRejected}
	// ErrUnavailable: see CodeUnavailable.
	ErrUnavailable = &Error{Code: CodeUnavailable}
	// ErrInvalid: see CodeInvalid.
	ErrInvalid = &Error{Code: CodeInvalid}
)

func unavailable(msg string, err error) error {
	return &Error{Code: CodeUnavailable, Message: msg, Err: err}
}
