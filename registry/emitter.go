package registry

import (
	"context"
	"fmt"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Appender is the append authority as the Emitter uses it; every
// statestore.Store satisfies it.
type Appender interface {
	// Append persists w, or for a duplicate (runId, idempotencyKey) writes
	// nothing and returns the existing record's eventId, runSeq and
	// persistedAt, which may carry a different eventId than w (Run Events
	// Contract §3.2). It must be safe for concurrent use if the Emitter is
	// used concurrently. An error means the outcome is unknown or nothing
	// was written; the same event may be appended again.
	Append(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error)
	// AppendIf is Append only if the run's last runSeq is lastSeq; a run
	// that moved on gets statestore.ErrRunChanged and nothing is written.
	AppendIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error)
}

var _ Appender = statestore.Store(nil)

// placeholderEventID stands in for the eventId while Emit validates an event
// before registering it.
const placeholderEventID = "00000000-0000-4000-8000-000000000000"

// Emitter carries out the producer side of §2.5 and §2.5.1 for one append
// authority: register the eventId, append, adopt the authority's eventId.
// It is safe for concurrent use when its Appender is.
type Emitter struct {
	reg *Registry
	app Appender
}

// NewEmitter returns an Emitter that keeps eventIds in reg and appends to app.
func NewEmitter(reg *Registry, app Appender) *Emitter {
	return &Emitter{reg: reg, app: app}
}

// Emit appends w with a registry-stable eventId and returns the append
// authority's result, which the caller must accept as authoritative.
//
// Emit first validates w with statestore.ValidateWrite (ignoring the eventId
// it is about to set); an invalid event is returned as that *statestore.Error
// and touches neither the registry nor the authority. It then sets w.EventID
// from Registry.EventID (overwriting any value the caller set), appends, and
// if the authority returns a different eventId, sets w.EventID to it and
// calls Registry.Adopt. Calling Emit again for the same logical event (same
// runId and idempotencyKey), from any producer, sends the same eventId.
//
// A registry error means nothing was appended. An Append error is returned
// wrapped (errors.Is/As still see the store's error) and leaves the
// registered eventId for the retry. If Adopt fails after a successful
// append, Emit returns the valid result together with the error: the event
// is persisted, and a retry of Emit is a duplicate append that adopts again.
func (e *Emitter) Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	return e.emit(ctx, w, -1)
}

// EmitIf is Emit with a conditional append (statestore.Store.AppendIf): w
// is persisted only if the run's last runSeq is still lastSeq, the one its
// producer decided on. A run that moved on gets an error matching
// statestore.ErrRunChanged; the registered eventId stays for the next try.
func (e *Emitter) EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	return e.emit(ctx, w, max(lastSeq, 0))
}

func (e *Emitter) emit(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	if w == nil {
		return statestore.AppendResult{}, fmt.Errorf("registry: emit: %w: event is nil", ErrInvalidInput)
	}
	probe := *w
	probe.EventID = placeholderEventID
	if err := statestore.ValidateWrite(&probe); err != nil {
		return statestore.AppendResult{}, fmt.Errorf("registry: emit: %w", err)
	}
	eventID, _, err := e.reg.EventID(ctx, w.RunID, w.IdempotencyKey)
	if err != nil {
		return statestore.AppendResult{}, fmt.Errorf("registry: emit: %w", err)
	}
	w.EventID = eventID
	var res statestore.AppendResult
	if lastSeq >= 0 {
		res, err = e.app.AppendIf(ctx, w, lastSeq)
	} else {
		res, err = e.app.Append(ctx, w)
	}
	if err != nil {
		return statestore.AppendResult{}, fmt.Errorf("registry: emit: append: %w", err)
	}
	if res.EventID == eventID {
		return res, nil
	}
	w.EventID = res.EventID
	if err := e.reg.Adopt(ctx, w.RunID, w.IdempotencyKey, res.EventID); err != nil {
		return res, fmt.Errorf("registry: emit: appended with eventId %s, adopt failed: %w", res.EventID, err)
	}
	return res, nil
}
