// Package errcode is the one shape of the sidecar's coded errors: a machine
// code ("RUN_NOT_FOUND", part of the contract, answered verbatim by the API)
// and its kind (NotFound), which says what the caller can do about it.
//
// Each package keeps its own codes, sentinels and error type in its
// errors.go; every such type implements Coded and matches with Match, so
// errors.Is(err, pkg.ErrSomething) matches every error with that code and
// errors.Is(err, errcode.NotFound) matches every error of that kind, from
// any package. Code that handles errors of many packages (the HTTP API
// maps a kind to a status in one table) asks for the kind; no one compares
// code strings. A package's plain sentinels (errors.New) are for its own
// callers; a sentinel another package must classify gets a code and a kind
// with New.
//
// It is a package of its own because every layer needs it: statestore, at
// the bottom, is the event contract, and a code with a kind is not an
// event; membership does not import statestore at all. errcode imports
// nothing of the sidecar's, so any package may import it without an arrow
// running back up.
package errcode

import (
	"errors"
	"strconv"
)

// Kind is what kind of failure a coded error is. A Kind is also an error
// value, only as the target of errors.Is: errors.Is(err, errcode.Conflict)
// reports whether a coded error in err's tree is a Conflict.
type Kind uint8

// The kinds. The zero Kind is Internal.
const (
	// Internal: a fault the caller cannot fix: a bug of the sidecar, or a
	// state an operator must repair. Also the kind of an error that has
	// no code.
	Internal Kind = iota
	// Invalid: the input is malformed or cannot work; nothing was done.
	// Sending the same input again gets the same answer.
	Invalid
	// NotFound: what the call names does not exist (a run, a step, a
	// sink, a Conductor workflow or task).
	NotFound
	// Conflict: the call does not fit the current state (a transition the
	// run does not allow, a Conductor workflow in another status, a start
	// or plan version already taken).
	Conflict
	// Forbidden: the call is well-formed but reaches where it may not (a
	// secret outside the allowed roots).
	Forbidden
	// Rejected: a limit refused the call and nothing was done; the same
	// call may succeed later (admission's limit on active runs).
	Rejected
	// Upstream: a dependency answered and refused what the sidecar sent it
	// (Conductor's 4xx other than 404/409, a webhook's 4xx); repeating the
	// same call will not help.
	Upstream
	// Unavailable: a dependency (Conductor, NATS, PostgreSQL, a KV bucket)
	// did not answer or is not ready; retrying may succeed.
	Unavailable
)

var kindNames = [...]string{
	Internal:    "Internal",
	Invalid:     "Invalid",
	NotFound:    "NotFound",
	Conflict:    "Conflict",
	Forbidden:   "Forbidden",
	Rejected:    "Rejected",
	Upstream:    "Upstream",
	Unavailable: "Unavailable",
}

// String returns the kind's name ("NotFound").
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// MarshalText encodes the kind as its name, so that a kind kept in a
// store reads the same whatever the order of the constants.
func (k Kind) MarshalText() ([]byte, error) {
	if int(k) >= len(kindNames) {
		return nil, errors.New("errcode: " + k.String() + " has no name")
	}
	return []byte(kindNames[k]), nil
}

// UnmarshalText decodes a kind's name.
func (k *Kind) UnmarshalText(b []byte) error {
	for i, name := range kindNames {
		if name == string(b) {
			*k = Kind(i)
			return nil
		}
	}
	return errors.New("errcode: unknown kind " + strconv.Quote(string(b)))
}

// Error returns "errcode: <kind>"; a Kind is an error only so that it can
// be the target of errors.Is.
func (k Kind) Error() string { return "errcode: " + k.String() }

// Coded is the shape of every coded error of the sidecar.
type Coded interface {
	error
	// ErrorCode returns the machine code, e.g. "RUN_NOT_FOUND".
	ErrorCode() string
	// ErrorKind returns the code's kind; one code has one kind.
	ErrorKind() Kind
}

// Match is the Is method of a coded error type T: e matches a target of
// the same type with the same code (the package's sentinel for the code),
// and a Kind equal to its own.
//
//	func (e *Error) Is(target error) bool { return errcode.Match(e, target) }
func Match[T Coded](e T, target error) bool {
	if k, ok := target.(Kind); ok {
		return e.ErrorKind() == k
	}
	t, ok := target.(T)
	return ok && t.ErrorCode() == e.ErrorCode()
}

// Of returns the first coded error in err's tree (err itself, then what it
// wraps, depth first), or false when there is none.
func Of(err error) (Coded, bool) {
	var c Coded
	if errors.As(err, &c) {
		return c, true
	}
	return nil, false
}

// CodeOf returns the machine code of the first coded error in err's tree,
// or "" when err carries none.
func CodeOf(err error) string {
	if c, ok := Of(err); ok {
		return c.ErrorCode()
	}
	return ""
}

// Error is a coded sentinel for a package whose errors are sentinels
// wrapped with context (fmt.Errorf("%w: ...", ErrUnavailable, cause))
// rather than values of a type of its own. errors.Is matches it by
// identity, and its kind.
type Error struct {
	code string
	kind Kind
	msg  string
}

// New returns a coded sentinel whose Error is msg.
func New(kind Kind, code, msg string) *Error {
	return &Error{code: code, kind: kind, msg: msg}
}

// Error returns the message New was given.
func (e *Error) Error() string { return e.msg }

// ErrorCode returns the machine code.
func (e *Error) ErrorCode() string { return e.code }

// ErrorKind returns the kind.
func (e *Error) ErrorKind() Kind { return e.kind }

// Is matches e's kind (errors.Is matches e itself by identity).
func (e *Error) Is(target error) bool {
	k, ok := target.(Kind)
	return ok && k == e.kind
}
