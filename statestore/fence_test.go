package statestore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// storeEmitter appends straight to a Store: the append authority without
// the EventIdRegistry, which the fence does not involve.
type storeEmitter struct{ statestore.Store }

func (s storeEmitter) EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	return s.AppendIf(ctx, w, lastSeq)
}

func TestFenced(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*memstore.Store, string) {
		s := memstore.New(statestore.ProjectorOptions{})
		runID := "run-fence-" + t.Name()
		if _, err := s.Append(ctx, storetest.Event(runID, statestore.RunStarted, "")); err != nil {
			t.Fatal(err)
		}
		return s, runID
	}
	pause := func(snap *statestore.RunSnapshot, cycle int64) (*statestore.RunEventWrite, error) {
		w, err := statestore.NewEvent(snap.Ref(), statestore.RunPaused, "", 1, cycle, statestore.RunPausedPayload{Reason: "fence"})
		if err == nil {
			w.EventID = storetest.Event(snap.RunID, statestore.RunPaused, "").EventID
		}
		return w, err
	}
	t.Run("DecidesAgainWhenTheRunMovedOn", func(t *testing.T) {
		s, runID := setup(t)
		decisions := 0
		snap, res, err := statestore.Fenced(ctx, s, storeEmitter{s}, runID, func(snap *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
			decisions++
			if decisions == 1 {
				// Another producer appends between this read and the append.
				if _, err := s.Append(ctx, storetest.Event(runID, statestore.StepStarted, "a")); err != nil {
					t.Fatal(err)
				}
			}
			return pause(snap, 1)
		})
		if err != nil || !res.Persisted || decisions != 2 || len(snap.Steps) != 1 {
			t.Fatalf("got persisted=%v decisions=%d steps=%d err=%v, want persisted after 2 decisions on the moved-on run", res.Persisted, decisions, len(snap.Steps), err)
		}
	})
	t.Run("NothingToRecord", func(t *testing.T) {
		s, runID := setup(t)
		snap, res, err := statestore.Fenced(ctx, s, storeEmitter{s}, runID, func(*statestore.RunSnapshot) (*statestore.RunEventWrite, error) { return nil, nil })
		if err != nil || res.Persisted || snap == nil || snap.Status != statestore.RunStatusRunning {
			t.Fatalf("got %+v %+v %v", snap, res, err)
		}
	})
	t.Run("ErrInvalidTransition", func(t *testing.T) {
		s, runID := setup(t)
		_, _, err := statestore.Fenced(ctx, s, storeEmitter{s}, runID, func(snap *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
			return statestore.NewEvent(snap.Ref(), statestore.RunResumed, "", 1, 1, nil) // not paused
		})
		if !errors.Is(err, statestore.ErrInvalidTransition) {
			t.Fatalf("got %v, want INVALID_TRANSITION", err)
		}
		if recs, _ := s.Fetch(ctx, runID, 0, 10); len(recs) != 1 {
			t.Fatalf("%d records, want 1: nothing written", len(recs))
		}
	})
	t.Run("GivesUpAfterMaxFenceRetries", func(t *testing.T) {
		s, runID := setup(t)
		decisions := 0
		_, _, err := statestore.Fenced(ctx, s, storeEmitter{s}, runID, func(snap *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
			decisions++
			w := storetest.Event(runID, statestore.StepStarted, "a")
			w.LogicalAttemptID = int64(decisions)
			storetest.Rekey(w)
			if _, err := s.Append(ctx, w); err != nil {
				t.Fatal(err)
			}
			return pause(snap, 1)
		})
		if !errors.Is(err, statestore.ErrRunChanged) || decisions != statestore.MaxFenceRetries+1 {
			t.Fatalf("got %v after %d decisions, want RUN_CHANGED after %d", err, decisions, statestore.MaxFenceRetries+1)
		}
	})
}

// TestReadFirst: Fenced on a state the producer read before decides on it
// without reading again, and when the run moved on since that read, the
// conditional append is refused and the next decision is on the run's
// state as the store has it; a decision to write nothing is made again on
// a read that sees every append (WithLatest: no append's condition checks
// it).
func TestReadFirst(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	if _, err := mem.Append(ctx, storetest.Event("r", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	read, err := mem.ProjectSnapshot(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Append(ctx, storetest.Event("r", statestore.RunPaused, "")); err != nil {
		t.Fatal(err)
	}
	var decided []string
	_, _, err = statestore.Fenced(ctx, statestore.ReadFirst(read, mem), storeEmitter{mem}, "r", func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
		decided = append(decided, s.Status)
		if s.Status != statestore.RunStatusRunning {
			return nil, nil
		}
		return storetest.Event("r", statestore.RunCompleted, ""), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(decided); got != "[RUNNING PAUSED PAUSED]" {
		t.Fatalf("decided on %s, want [RUNNING PAUSED PAUSED] (the read handed in, the store's, its latest)", got)
	}
	if recs, _ := mem.Fetch(ctx, "r", 0, 0); len(recs) != 2 {
		t.Fatalf("%d records, want 2 (RunCompleted refused)", len(recs))
	}
}
