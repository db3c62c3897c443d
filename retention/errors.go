package retention

import "errors"

// Errors of the package, matched with errors.Is.
var (
	// ErrInvalidOptions: New was given options that cannot work (no
	// retention period, a negative one, a missing component).
	ErrInvalidOptions = errors.New("retention: invalid options")
	// ErrRunsKept: a pass removed what it could, but some runs could not
	// be removed (one of their per-run keys could not be forgotten); they
	// stay whole in the log and are tried again after KeptRetry. The other
	// runs are not held up, and the loop does not back off for it.
	ErrRunsKept = errors.New("retention: some runs could not be removed")
)
