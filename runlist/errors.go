package runlist

import "errors"

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

// Error is an error of the list with a machine code. Errors with the same
// code match with errors.Is.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "runlist: " + e.Code
	}
	return "runlist: " + e.Code + ": " + e.Message
}

// Is matches errors of the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Errors of the package, matched with errors.Is.
var (
	// ErrSelectorInvalid: see CodeSelectorInvalid.
	ErrSelectorInvalid = &Error{Code: CodeSelectorInvalid}
	// ErrContinueInvalid: see CodeContinueInvalid.
	ErrContinueInvalid = &Error{Code: CodeContinueInvalid}
	// ErrSyncing: see CodeSyncing.
	ErrSyncing = &Error{Code: CodeSyncing}
	// ErrUnavailable wraps a failure of the list's KV bucket or of the
	// log (a timeout, a closed connection).
	ErrUnavailable = errors.New("runlist: unavailable")
	// ErrInvalidOptions: Open was given options that cannot work.
	ErrInvalidOptions = errors.New("runlist: invalid options")
)
