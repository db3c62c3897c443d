package registry

import (
	"errors"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Sentinel errors, matched with errors.Is. Errors returned by the registry
// wrap one of them and, where there is one, the underlying jetstream error.
var (
	// ErrInvalidInput is returned when a runId, idempotencyKey, eventId or
	// key is malformed (empty, too long, not UTF-8, not 64 lowercase hex
	// digits, not a UUID v4). Nothing was sent to the server.
	ErrInvalidInput = errors.New("registry: invalid input")

	// ErrNotFound is returned by Lookup when no eventId is registered for
	// (runId, idempotencyKey). It replaces jetstream.ErrKeyNotFound.
	ErrNotFound = errors.New("registry: not found")

	// ErrConflict is returned when a compare-and-set write kept losing to
	// concurrent writers or deletions (jetstream.ErrKeyExists,
	// jetstream.ErrKeyRevisionMismatch) for a bounded number of attempts.
	// The call may be retried.
	ErrConflict = errors.New("registry: conflict")

	// ErrCorrupt is returned when the stored value of a key is not a
	// canonical UUID v4. EventID and Lookup never overwrite it (an operator
	// may delete the key); Adopt replaces it.
	ErrCorrupt = errors.New("registry: stored eventId is not a UUID v4")

	// ErrUnavailable wraps every other failure of the KV bucket (timeouts,
	// a closed connection, a missing bucket, a cancelled context). The
	// outcome of a write is then unknown; retrying the call is safe. Its
	// code is the log's STORE_UNAVAILABLE: the registry is part of the
	// log's write path.
	ErrUnavailable = errcode.New(errcode.Unavailable, statestore.CodeStoreUnavailable, "registry: unavailable")
)
