package retention

import "errors"

// Errors of the package, matched with errors.Is.
var (
	// ErrInvalidOptions: New was given options that cannot work (no
	// retention period, a negative one, a missing component).
	ErrInvalidOptions = errors.New("retention: invalid options")
)
