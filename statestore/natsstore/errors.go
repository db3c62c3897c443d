package natsstore

import (
	"errors"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// CodeNotRemovable: retention asked to remove runs from an event stream
// that denies purge.
const CodeNotRemovable = "STORE_NOT_REMOVABLE"

// Errors of the package's buckets and data dir, matched with errors.Is.
var (
	// ErrKeyTooLong: a KV key longer than MaxKeyBytes. It is refused before
	// it reaches the server, which closes a connection whose control line
	// (a subject built from the key) exceeds its limit.
	ErrKeyTooLong = errors.New("natsstore: key too long")
	// ErrNotRemovable: the event stream denies purge (it was created
	// without Options.Removable), so no run can be removed from it.
	ErrNotRemovable = &statestore.Error{Code: CodeNotRemovable, Kind: errcode.Conflict,
		Message: "the event stream denies purge: it was created without retention, and JetStream cannot allow purge on an existing stream (docs/retention.md)"}
)

// MaxKeyBytes bounds a KV key of every bucket OpenBucket opens. The
// longest key the sidecar builds is a run token (at most 342 bytes) with a
// few short tokens; a NATS server's control line is 4 KiB by default, and
// the key appears in subjects beside the bucket's name and an inbox.
const MaxKeyBytes = 1024
