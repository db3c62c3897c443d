package statestore

import (
	"context"
	"errors"
)

// MaxFenceRetries bounds how often Fenced decides again after its
// conditional append found the run moved on (RUN_CHANGED). Each retry
// reads the run's new state, so a producer whose event the change made
// pointless (a pause, an end) stops at once.
const MaxFenceRetries = 64

// FenceReader reads the derived state a producer decides on: a Store's or
// a Projector's ProjectSnapshot.
type FenceReader interface {
	ProjectSnapshot(ctx context.Context, runID string) (*RunSnapshot, error)
}

// FenceAppender appends an event only if the run's last runSeq is still
// lastSeq, and otherwise fails with an error matching ErrRunChanged,
// writing nothing: registry.Emitter's EmitIf, the single write path.
type FenceAppender interface {
	EmitIf(ctx context.Context, w *RunEventWrite, lastSeq int64) (AppendResult, error)
}

// Fenced is the producers' fence (docs/events.md, "Fences"): it records
// the event a producer decides from the run's current state, and only if
// that state is still the run's when the event is appended.
//
//  1. read the run's derived state (runs.ProjectSnapshot),
//  2. decide(snap) returns the event to record, or nil to record nothing,
//  3. check the event against the state (CheckTransition, Layer 1),
//  4. append it with emit.EmitIf on snap.LastEventSeq,
//  5. on RUN_CHANGED go back to 1, at most MaxFenceRetries times.
//
// It returns the state of the last decision and the append's result (zero
// when nothing was appended). A read error, decide's error, an invalid
// transition (an *Error with code INVALID_TRANSITION; nothing written) and
// an append error are returned as they are; after MaxFenceRetries the
// last RUN_CHANGED is. decide is called once per read and may keep what it
// decided (a cycle, a verdict) in its closure for the caller.
//
// A producer that reads differently (a guard on a missing run) or appends
// differently (queued in an outbox when the store is slow) passes its own
// FenceReader or FenceAppender.
//
//	var cycle int64
//	snap, res, err := statestore.Fenced(ctx, store, emitter, runID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
//		if s.Status != statestore.RunStatusRunning {
//			return nil, nil // nothing to record
//		}
//		cycle = 1
//		if s.Pause != nil {
//			cycle = s.Pause.Cycle + 1
//		}
//		return statestore.NewEvent(s.Ref(), statestore.RunPaused, "", 1, cycle, statestore.RunPausedPayload{Reason: "maintenance"})
//	})
func Fenced(ctx context.Context, runs FenceReader, emit FenceAppender, runID string, decide func(*RunSnapshot) (*RunEventWrite, error)) (*RunSnapshot, AppendResult, error) {
	confirmed := false
	for try := 0; ; try++ {
		snap, err := runs.ProjectSnapshot(ctx, runID)
		if err != nil {
			return nil, AppendResult{}, err
		}
		w, err := decide(snap)
		if (err != nil || w == nil) && !confirmed {
			// Nothing to write (or refused): no append's condition checks
			// that decision, and the read may be behind the log (a
			// JetStream replica lagging its leader answers reads). Decide
			// again once on a read that sees every append before it.
			confirmed, ctx = true, WithLatest(ctx)
			continue
		}
		if err != nil || w == nil {
			return snap, AppendResult{}, err
		}
		if err := CheckTransition(snap, w); err != nil {
			return snap, AppendResult{}, err
		}
		res, err := emit.EmitIf(ctx, w, snap.LastEventSeq)
		if errors.Is(err, ErrRunChanged) && try < MaxFenceRetries {
			continue
		}
		return snap, res, err
	}
}

// ReadFirst returns a FenceReader that answers its first read with snap,
// the state a producer already read, and reads runs after that: a fenced
// append decided on a read the producer made costs no second read. It is
// for one Fenced call; snap must be of the run that call reads.
func ReadFirst(snap *RunSnapshot, runs FenceReader) FenceReader {
	return &readFirst{snap: snap, runs: runs}
}

type readFirst struct {
	snap *RunSnapshot
	runs FenceReader
}

func (r *readFirst) ProjectSnapshot(ctx context.Context, runID string) (*RunSnapshot, error) {
	if snap := r.snap; snap != nil {
		r.snap = nil
		return snap, nil
	}
	return r.runs.ProjectSnapshot(ctx, runID)
}

// NewTryEvent is p, a try event of one step (RunStepTryEnded or
// RunStepTryStarted, run-level), for snap's run, numbered after snap's last
// try event; append it with a TryAppender.
func NewTryEvent(snap *RunSnapshot, p Payload) (*RunEventWrite, error) {
	return NewEvent(snap.Ref(), p.EventType(), "", 1, snap.StepTryEvents+1, p)
}

// TryAppender appends a try event of step StepID through Emit, conditioned
// on the runSeq it was decided on. Try events are numbered per run, so a
// concurrent try event of another step may have taken the number, and
// this one was then answered as its duplicate: TryAppender reads the run
// again (Runs) and reports RUN_CHANGED unless the step is now as the event
// says, so that Fenced decides again.
type TryAppender struct {
	Emit   FenceAppender
	Runs   FenceReader
	StepID string
}

// EmitIf implements FenceAppender.
func (ta TryAppender) EmitIf(ctx context.Context, ev *RunEventWrite, lastSeq int64) (AppendResult, error) {
	res, err := ta.Emit.EmitIf(ctx, ev, lastSeq)
	if err != nil {
		return res, err
	}
	after, err := ta.Runs.ProjectSnapshot(ctx, ev.RunID)
	if err != nil {
		return res, err
	}
	if st := after.Step(ta.StepID); st == nil || st.Idle != (ev.EventType == RunStepTryEnded) {
		return res, RunChanged(ev.RunID, lastSeq, after.LastEventSeq)
	}
	return res, nil
}

// latestKey marks a context whose reads must see every append made before
// them (WithLatest).
type latestKey struct{}

// WithLatest returns ctx marked for reads that see every append persisted
// before they began, at some cost: a store whose reads may lag its writes
// (a JetStream stream's replicas answer direct gets) confirms with its
// leader. Fenced uses it for a decision that writes nothing.
func WithLatest(ctx context.Context) context.Context {
	return context.WithValue(ctx, latestKey{}, true)
}

// Latest reports whether ctx asks for reads that see every append
// before them (WithLatest).
func Latest(ctx context.Context) bool {
	v, _ := ctx.Value(latestKey{}).(bool)
	return v
}
