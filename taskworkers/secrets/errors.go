package secrets

import (
	"fmt"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Machine codes of resolution errors. They are part of the contract: the
// worker records them in StepFailed and operators alert on them.
const (
	// CodeNotFound: the environment variable is unset, or the file does
	// not exist.
	CodeNotFound = "SECRET_NOT_FOUND"
	// CodeUnreadable: the file exists but cannot be read (permission, a
	// directory or other non-regular file, an I/O error).
	CodeUnreadable = "SECRET_UNREADABLE"
	// CodeTooLarge: the file is larger than Resolver.MaxFileBytes.
	CodeTooLarge = "SECRET_TOO_LARGE"
	// CodeInvalidRef: the reference is malformed (unknown provider, empty
	// or duplicate name, ...).
	CodeInvalidRef = "SECRET_REF_INVALID"
	// CodeForbidden: the reference points where plans may not read: a
	// file: path outside every Resolver.FileRoots (after resolving
	// symlinks and ".."), or any file: reference when no root is
	// configured; an env: variable no Resolver.EnvAllow entry matches, or
	// any env: reference when the list is empty. Not retryable.
	CodeForbidden = "SECRET_REF_FORBIDDEN"
)

// kinds are the kinds of the package's codes.
var kinds = map[string]errcode.Kind{
	CodeNotFound:   errcode.NotFound,
	CodeUnreadable: errcode.Unavailable,
	CodeTooLarge:   errcode.Invalid,
	CodeInvalidRef: errcode.Invalid,
	CodeForbidden:  errcode.Forbidden,
}

// Error is a secret resolution error. It never contains the secret's
// value.
type Error struct {
	// Code is one of the Code* constants.
	Code string
	// Name is the SecretRef.Name, Ref its locator.
	Name, Ref string
	// Reason is a short human explanation.
	Reason string
	// Retryable says whether resolving again may succeed (a transient I/O
	// error); missing, malformed, forbidden and oversized secrets are not.
	Retryable bool
	// Err is the cause (an *fs.PathError and the like), if any.
	Err error
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s: secret %q (%s): %s", e.Code, e.Name, e.Ref, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// ErrorCode returns the machine code.
func (e *Error) ErrorCode() string { return e.Code }

// ErrorKind returns the code's kind.
func (e *Error) ErrorKind() errcode.Kind { return kinds[e.Code] }

// Is matches any *Error with the same Code, so errors.Is(err, ErrNotFound)
// works on every instance, and the code's kind.
func (e *Error) Is(target error) bool { return errcode.Match(e, target) }

// StepError returns the error as a step's recorded error.
func (e *Error) StepError() *statestore.StepError {
	return &statestore.StepError{Code: e.Code, Message: e.Error(), Retryable: e.Retryable}
}

// Sentinel errors, matched with errors.Is.
var (
	// ErrNotFound matches every SECRET_NOT_FOUND error.
	ErrNotFound = &Error{Code: CodeNotFound}
	// ErrUnreadable matches every SECRET_UNREADABLE error.
	ErrUnreadable = &Error{Code: CodeUnreadable}
	// ErrTooLarge matches every SECRET_TOO_LARGE error.
	ErrTooLarge = &Error{Code: CodeTooLarge}
	// ErrInvalidRef matches every SECRET_REF_INVALID error.
	ErrInvalidRef = &Error{Code: CodeInvalidRef}
	// ErrForbidden matches every SECRET_REF_FORBIDDEN error.
	ErrForbidden = &Error{Code: CodeForbidden}
)
