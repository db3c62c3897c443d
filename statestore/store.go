package statestore

import "context"

// Store is the append authority of IRunStateStore v2.0.0. Implementations
// must be safe for concurrent use and pass the conformance suite in package
// storetest.
type Store interface {
	// Append validates w (ValidateWrite) and persists it with a runSeq
	// greater than every earlier runSeq of the run and a persistedAt from the
	// store's own clock. If (runId, idempotencyKey) already exists it writes
	// nothing and returns the existing eventId, runSeq and persistedAt with
	// Idempotent true and Persisted false; this holds under concurrent racing
	// appends of the same key. A rejected event returns an *Error
	// (SCHEMA_VALIDATION_FAILED, or INVALID_TRANSITION when transition
	// validation is on) and writes nothing. Backend failures return an error
	// matching ErrUnavailable; the same event may then be appended again.
	Append(ctx context.Context, w *RunEventWrite) (AppendResult, error)

	// AppendIf is Append conditioned on the run's log: w is persisted only
	// if the run's last runSeq is lastSeq (0: the run has no events yet),
	// atomically with the write. A duplicate (runId, idempotencyKey) is
	// answered exactly as by Append, whatever lastSeq is, so a retry of a
	// conditional append that persisted succeeds. Otherwise, if the run has
	// another last runSeq, nothing is written and the error matches
	// ErrRunChanged. It is the producers' fence (docs/events.md, "Fences"):
	// an event decided on a snapshot is persisted only if nothing reached
	// the run since, e.g. no StepStarted after a RunPaused.
	AppendIf(ctx context.Context, w *RunEventWrite, lastSeq int64) (AppendResult, error)

	// Fetch returns the records of runID with runSeq > afterSeq in increasing
	// runSeq order, at most limit of them (limit <= 0: no limit). A run
	// without events gives an empty slice and no error.
	Fetch(ctx context.Context, runID string, afterSeq int64, limit int) ([]RunEventRecord, error)

	// GetSnapshot returns the latest snapshot the store has for runID,
	// projecting it once if it has none yet. It returns ErrNotFound when the
	// run has no events. The returned snapshot must not be modified.
	GetSnapshot(ctx context.Context, runID string) (*RunSnapshot, error)

	// ProjectSnapshot brings the run's snapshot up to date with the log and
	// returns it. It returns ErrNotFound when the run has no events.
	ProjectSnapshot(ctx context.Context, runID string) (*RunSnapshot, error)
}

// Fetcher is the read side of a Store that the Projector needs.
type Fetcher interface {
	Fetch(ctx context.Context, runID string, afterSeq int64, limit int) ([]RunEventRecord, error)
}

// KeyLookup is an optional Store capability: the record with the given
// (runId, idempotencyKey), or ErrNotFound.
type KeyLookup interface {
	Lookup(ctx context.Context, runID, idempotencyKey string) (*RunEventRecord, error)
}

// Follower is an optional Store capability: reading the events of every
// run in the order the store persisted them, for consumers that follow the
// whole log (the run list).
type Follower interface {
	// Follow starts reading after the store's sequence afterSeq (0: from
	// the start). Records carry their runSeq; the store's sequence orders
	// them across runs.
	Follow(ctx context.Context, afterSeq uint64) (LogTail, error)
	// LastSeq is the sequence of the last event persisted: a LogTail that
	// has reached it has read every event persisted before the call.
	LastSeq(ctx context.Context) (uint64, error)
}

// LogTail reads a log in order; see Follower.
type LogTail interface {
	// Next returns the records available now, at most limit, and the
	// sequence read through (records or not); nothing new: none and the
	// same sequence.
	Next(ctx context.Context, limit int) ([]RunEventRecord, uint64, error)
	// Close releases the reader.
	Close()
}

// BatchAppender is an optional Store capability: conditional appends to
// many runs in one call, for bulk control (docs/operations.md, "Bulk
// pause, resume and cancel").
type BatchAppender interface {
	// AppendBatch appends each RunBatch's events to its run, in order, on
	// the condition AppendIf puts on one event: the run's last runSeq is
	// the batch's LastSeq, and each later event of the run follows the one
	// before it. The answer has one BatchResult per RunBatch, in order.
	//
	// A run whose events are all valid and whose condition holds gets one
	// AppendResult per event; an event the run already holds is answered
	// as Append answers a duplicate and writes nothing. A run that moved
	// on gets an error matching ErrRunChanged, an invalid event its
	// *Error, a backend failure an error matching ErrUnavailable. A store
	// whose AtomicRuns is true then writes nothing of that run, and a
	// crash during the call leaves each run with all of its events or none;
	// one whose AtomicRuns is false may have written the run's first
	// events, and Results holds those (the rest were not written). Other
	// runs are not affected by one run's refusal. Safe for concurrent use.
	AppendBatch(ctx context.Context, runs []RunBatch) []BatchResult
	// AtomicRuns reports whether AppendBatch writes each run's events all
	// or none.
	AtomicRuns() bool
}

// RunBatch is one run's part of an AppendBatch: its events (at least one,
// all of one run) and the runSeq they were decided on.
type RunBatch struct {
	LastSeq int64
	Events  []*RunEventWrite
}

// BatchResult is one run's answer to an AppendBatch: one AppendResult per
// event written or found, and the error that stopped the run, if any.
type BatchResult struct {
	Results []AppendResult
	Err     error
}

// CheckBatch checks the shape of an AppendBatch's run: at least one event,
// every event of one run, each valid (ValidateWrite). A run that fails it
// is answered with the returned error and nothing of it is written.
func CheckBatch(b RunBatch) error {
	if len(b.Events) == 0 {
		return &Error{Code: CodeSchemaValidationFailed, Field: "events", Message: "a run's batch needs at least one event"}
	}
	for _, w := range b.Events {
		if w == nil {
			return &Error{Code: CodeSchemaValidationFailed, Field: "events", Message: "event is nil"}
		}
		if w.RunID != b.Events[0].RunID {
			return &Error{Code: CodeSchemaValidationFailed, Field: "runId", Message: "a run's batch holds events of runs " + b.Events[0].RunID + " and " + w.RunID}
		}
		if err := ValidateWrite(w); err != nil {
			return err
		}
	}
	return nil
}

// Removal is one finished run leaving the log (retention, once its archive
// was read back and checked): its records with runSeq up to LastRunSeq, of
// which there are Records (the count its archive holds). Records the run
// got after LastRunSeq stay.
type Removal struct {
	RunID      string
	LastRunSeq uint64
	Records    uint64
}
