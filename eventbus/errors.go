package eventbus

import "github.com/conductor-sidecar/sidecar/errcode"

// Machine codes of the package's errors (the API's "code").
const (
	// CodeSinkInvalid: a sink definition that cannot work (--bus-sink).
	CodeSinkInvalid = "BUS_SINK_INVALID"
	// CodeSinkUnknown: no sink of that name is configured.
	CodeSinkUnknown = "BUS_SINK_UNKNOWN"
	// CodeDeliveryFailed: a sink did not take an event (a timeout, a
	// refused connection, an HTTP status other than 2xx, no JetStream
	// acknowledgement). Retried with backoff, then dead-lettered.
	CodeDeliveryFailed = "EVENT_BUS_DELIVERY_FAILED"
	// CodeRejected: the consumer refused the event for good (HTTP 400,
	// 410, 413, 415 or 422): dead-lettered without further retries.
	CodeRejected = "BUS_EVENT_REJECTED"
	// CodeUnavailable: the bus's own NATS state (cursors, dead letters)
	// could not be read or written.
	CodeUnavailable = "BUS_UNAVAILABLE"
)

// kinds are the kinds of the package's codes.
var kinds = map[string]errcode.Kind{
	CodeSinkInvalid:    errcode.Invalid,
	CodeSinkUnknown:    errcode.NotFound,
	CodeDeliveryFailed: errcode.Unavailable,
	CodeRejected:       errcode.Upstream,
	CodeUnavailable:    errcode.Unavailable,
}

// Error is an error of the bus with a machine code. Errors with the same
// code match with errors.Is.
type Error struct {
	Code    string
	Message string
	Err     error
}

func (e *Error) Error() string {
	s := "eventbus: " + e.Code
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

// ErrorCode returns the machine code (the API's "code").
func (e *Error) ErrorCode() string { return e.Code }

// ErrorKind returns the code's kind.
func (e *Error) ErrorKind() errcode.Kind { return kinds[e.Code] }

// Errors of the package, matched with errors.Is.
var (
	// ErrSinkInvalid: see CodeSinkInvalid.
	ErrSinkInvalid = &Error{Code: CodeSinkInvalid}
	// ErrSinkUnknown: see CodeSinkUnknown.
	ErrSinkUnknown = &Error{Code: CodeSinkUnknown}
	// ErrDeliveryFailed: see CodeDeliveryFailed.
	ErrDeliveryFailed = &Error{Code: CodeDeliveryFailed}
	// ErrRejected: see CodeRejected.
	ErrRejected = &Error{Code: CodeRejected}
	// ErrUnavailable: see CodeUnavailable.
	ErrUnavailable = &Error{Code: CodeUnavailable}
)

func failed(msg string, err error) error {
	return &Error{Code: CodeDeliveryFailed, Message: msg, Err: err}
}

func unavailable(msg string, err error) error {
	return &Error{Code: CodeUnavailable, Message: msg, Err: err}
}
