package membership

import "errors"

// Errors of the package, matched with errors.Is.
var (
	// ErrInvalidOptions: Open was given options that cannot work.
	ErrInvalidOptions = errors.New("membership: invalid options")
	// ErrUnavailable wraps a failure of the members' KV bucket (a
	// timeout, a closed connection, a missing bucket).
	ErrUnavailable = errors.New("membership: unavailable")
)
