package statestore

import (
	"context"
	"errors"
	"strconv"
	"sync"
)

// CheckTransition is the producer guard (Layer 1, Run Events Contract
// §5.3): it checks that w is a valid next transition from the derived state
// s (nil for a run without events) before a producer emits it. It returns
// nil when the event applies, or is audit-only or of an unknown type, and an
// *Error with code INVALID_TRANSITION otherwise. The error's Meta carries
// expectedState, actualState and attemptedEventType (the contract's
// invalid-transition fields, which a producer logs when it refuses), plus
// runId and stepId.
func CheckTransition(s *RunSnapshot, w *RunEventWrite) error {
	d := Decide(s, w.EventType, w.StepID, w.LogicalAttemptID)
	if d.Outcome != Invalid {
		return nil
	}
	meta := map[string]string{
		"runId":              w.RunID,
		"entity":             d.Entity,
		"expectedState":      d.ExpectedState,
		"actualState":        d.PriorState,
		"attemptedState":     d.AttemptedState,
		"attemptedEventType": w.EventType,
		"logicalAttemptId":   strconv.FormatInt(w.LogicalAttemptID, 10),
	}
	if w.StepID != "" {
		meta["stepId"] = w.StepID
	}
	return &Error{Code: CodeInvalidTransition, Message: d.Reason, Meta: meta}
}

// ValidatingStore adds the optional append-time transition validation of
// Layer 2 to a Store whose backend also implements KeyLookup. An event
// whose (runId, idempotencyKey) exists is answered as a duplicate, exactly
// as by the backend; otherwise an event that is not a valid transition from
// the run's projected state is rejected with INVALID_TRANSITION and nothing
// is written. A retry of the same rejected event, against the same state,
// gets the identical error.
//
// Validation and append are serialized per run within this process. Across
// processes two appends may still race past validation; the projector
// (Layer 3) remains the enforcement that the contract requires.
type ValidatingStore struct {
	Store
	lookup KeyLookup

	mu    sync.Mutex
	locks map[string]*runLock
}

type runLock struct {
	mu   sync.Mutex
	refs int
}

// NewValidatingStore wraps s. It fails if s does not implement KeyLookup.
func NewValidatingStore(s Store) (*ValidatingStore, error) {
	kl, ok := s.(KeyLookup)
	if !ok {
		return nil, errors.New("statestore: transition validation needs a backend with Lookup")
	}
	return &ValidatingStore{Store: s, lookup: kl, locks: make(map[string]*runLock)}, nil
}

// Append validates the transition, then appends through the wrapped Store.
func (v *ValidatingStore) Append(ctx context.Context, w *RunEventWrite) (AppendResult, error) {
	return v.append(ctx, w, -1)
}

// AppendIf validates the transition, then appends conditionally through
// the wrapped Store. An event that is not valid from the run's state is
// answered RUN_CHANGED, not INVALID_TRANSITION, when the run's last runSeq
// is not lastSeq: it was decided on a state the run has left.
func (v *ValidatingStore) AppendIf(ctx context.Context, w *RunEventWrite, lastSeq int64) (AppendResult, error) {
	return v.append(ctx, w, max(lastSeq, 0))
}

func (v *ValidatingStore) append(ctx context.Context, w *RunEventWrite, lastSeq int64) (AppendResult, error) {
	if err := ValidateWrite(w); err != nil {
		return AppendResult{}, err
	}
	unlock := v.lock(w.RunID)
	defer unlock()
	rec, err := v.lookup.Lookup(ctx, w.RunID, w.IdempotencyKey)
	switch {
	case err == nil:
		return AppendResult{EventID: rec.EventID, RunSeq: rec.RunSeq, PersistedAt: rec.PersistedAt, Idempotent: true}, nil
	case !errors.Is(err, ErrNotFound):
		return AppendResult{}, err
	}
	snap, err := v.Store.ProjectSnapshot(ctx, w.RunID)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return AppendResult{}, err
	}
	if err := CheckTransition(snap, w); err != nil {
		if have := lastEventSeq(snap); lastSeq >= 0 && have != lastSeq {
			// Decided on a state the run has left: the producer decides
			// again on the new one (Fenced), as on the backend's answer.
			return AppendResult{}, RunChanged(w.RunID, lastSeq, have)
		}
		return AppendResult{}, err
	}
	if lastSeq >= 0 {
		return v.Store.AppendIf(ctx, w, lastSeq)
	}
	return v.Store.Append(ctx, w)
}

// lastEventSeq is snap's last runSeq, 0 for a run without events.
func lastEventSeq(snap *RunSnapshot) int64 {
	if snap == nil {
		return 0
	}
	return snap.LastEventSeq
}

func (v *ValidatingStore) lock(runID string) func() {
	v.mu.Lock()
	l := v.locks[runID]
	if l == nil {
		l = &runLock{}
		v.locks[runID] = l
	}
	l.refs++
	v.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		v.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(v.locks, runID)
		}
		v.mu.Unlock()
	}
}
