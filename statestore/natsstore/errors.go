package natsstore

import (
	"errors"
	"fmt"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// CodeNotRemovable: retention asked to remove runs from an event stream
// that denies purge.
const CodeNotRemovable = "STORE_NOT_REMOVABLE"

// CodeWriteRefused: a stream of the embedded server holds a write error
// (its file store failed a write: a full disk, a file size limit) and
// refuses every write until the server restarts. The write was not made.
const CodeWriteRefused = "STORE_WRITE_REFUSED"

// Errors of the package's buckets and data dir, matched with errors.Is.
var (
	// ErrKeyTooLong: a KV key longer than MaxKeyBytes. It is refused before
	// it reaches the server, which closes a connection whose control line
	// (a subject built from the key) exceeds its limit.
	ErrKeyTooLong = errors.New("natsstore: key too long")
	// ErrNotRemovable: the event stream denies purge (it was created
	// without Options.Removable), so no run can be removed from it.
	ErrNotRemovable = &statestore.Error{Code: CodeNotRemovable, Kind: errcode.Conflict,
		Message: "the event stream denies purge: it was created without retention, and JetStream cannot allow purge on an existing stream: start serve with --retain-finished on a new data dir (or a new stream on the cluster), or without --retain-finished on this one (docs/retention.md)"}
	// ErrNotReady: a stream or bucket that was just created (by this
	// process or another), or was reported existing, is not served by its
	// replicas yet; on a cluster a lookup an instant after the create may
	// answer "not found". The same open succeeds a moment later
	// (NotReady reports true).
	ErrNotReady = errors.New("natsstore: the stream's replicas do not serve it yet")
	// ErrWriteRefused matches every STORE_WRITE_REFUSED error (a
	// *WriteRefusedError).
	ErrWriteRefused = &WriteRefusedError{}
)

// WriteRefusedError is a STORE_WRITE_REFUSED error: Stream refuses every
// write because its file store failed one (Cause, the server's words),
// and the embedded server keeps that error until it restarts. Its kind is
// Unavailable (the API answers 503). Err, when set, is the failure of the
// write that found it (a timeout: the server does not answer a write its
// store failed).
type WriteRefusedError struct {
	Stream  string
	Cause   string
	DataDir string
	Err     error
}

// Message is the one-line explanation with the fix: free space, then
// restart.
func (e *WriteRefusedError) Message() string {
	return fmt.Sprintf("stream %s refuses every write: %s; free space on %s (or raise the file size limit), then restart serve: the embedded server keeps a stream's write error until it restarts",
		e.Stream, e.Cause, e.DataDir)
}

// Error returns "STORE_WRITE_REFUSED: <Message>".
func (e *WriteRefusedError) Error() string { return CodeWriteRefused + ": " + e.Message() }

// Unwrap returns Err.
func (e *WriteRefusedError) Unwrap() error { return e.Err }

// ErrorCode returns CodeWriteRefused.
func (e *WriteRefusedError) ErrorCode() string { return CodeWriteRefused }

// ErrorKind returns errcode.Unavailable.
func (e *WriteRefusedError) ErrorKind() errcode.Kind { return errcode.Unavailable }

// Is matches ErrWriteRefused (every *WriteRefusedError) and the kind
// Unavailable.
func (e *WriteRefusedError) Is(target error) bool { return errcode.Match(e, target) }

// MaxKeyBytes bounds a KV key of every bucket OpenBucket opens. The
// longest key the sidecar builds is a run token (at most 342 bytes) with a
// few short tokens; a NATS server's control line is 4 KiB by default, and
// the key appears in subjects beside the bucket's name and an inbox.
const MaxKeyBytes = 1024
