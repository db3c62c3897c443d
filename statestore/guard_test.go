package statestore_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func TestCheckTransition_ProducerGuard(t *testing.T) {
	s, _ := reduce(t, newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").step(statestore.StepCompleted, "a").recs)
	err := statestore.CheckTransition(s, storetest.Event("r", statestore.StepFailed, "a"))
	var e *statestore.Error
	if !errors.As(err, &e) || e.Code != statestore.CodeInvalidTransition {
		t.Fatalf("got %v, want INVALID_TRANSITION", err)
	}
	// What a producer logs when it refuses (the contract's payload fields).
	want := map[string]string{"expectedState": "RUNNING", "actualState": "SUCCESS", "attemptedEventType": "StepFailed"}
	for k, v := range want {
		if got := fmt.Sprint(e.Meta[k]); got != v {
			t.Fatalf("%s = %q, want %q (meta %v)", k, got, v, e.Meta)
		}
	}
	if err := statestore.CheckTransition(nil, storetest.Event("r", statestore.RunStarted, "")); err != nil {
		t.Fatalf("RunStarted on a new run: %v", err)
	}
	if err := statestore.CheckTransition(nil, storetest.Event("r", statestore.RunResumed, "")); !errors.Is(err, statestore.ErrInvalidTransition) {
		t.Fatalf("RunResumed on a new run: %v", err)
	}
}

func TestValidatingStore_Append(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	s, err := statestore.NewValidatingStore(mem)
	if err != nil {
		t.Fatal(err)
	}
	started := storetest.Event("r", statestore.RunStarted, "")
	completed := storetest.Event("r", statestore.RunCompleted, "")
	appendAll(t, s, started, completed)

	t.Run("ErrInvalidTransition writes nothing, retries answer identically", func(t *testing.T) {
		paused := storetest.Event("r", statestore.RunPaused, "")
		_, err1 := s.Append(ctx, paused)
		retry := *paused
		retry.EventID = storetest.Event("r", statestore.RunPaused, "").EventID
		_, err2 := s.Append(ctx, &retry)
		if !errors.Is(err1, statestore.ErrInvalidTransition) || !reflect.DeepEqual(err1, err2) {
			t.Fatalf("got %v then %v, want the same INVALID_TRANSITION", err1, err2)
		}
		var e *statestore.Error
		errors.As(err1, &e)
		if e.Meta["actualState"] != "COMPLETED" || e.Meta["expectedState"] != "RUNNING" || e.Meta["attemptedEventType"] != "RunPaused" {
			t.Fatalf("meta %v", e.Meta)
		}
		if recs, _ := mem.Fetch(ctx, "r", 0, 0); len(recs) != 2 {
			t.Fatalf("%d records, want 2", len(recs))
		}
	})
	t.Run("duplicate of an accepted event is idempotent, not invalid", func(t *testing.T) {
		res, err := s.Append(ctx, started)
		if err != nil || !res.Idempotent || res.Persisted || res.RunSeq != 1 {
			t.Fatalf("got %+v, %v", res, err)
		}
	})
	t.Run("schema errors come first", func(t *testing.T) {
		bad := storetest.Event("r", statestore.RunPaused, "")
		bad.EngineAttemptID = 0
		if _, err := s.Append(ctx, bad); !errors.Is(err, statestore.ErrSchemaValidation) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("needs Lookup", func(t *testing.T) {
		if _, err := statestore.NewValidatingStore(struct{ statestore.Store }{mem}); err == nil {
			t.Fatal("accepted a store without Lookup")
		}
	})
}

// TestValidatingStore_AppendIf: a conditional append decided on a state
// the run has left is answered RUN_CHANGED, as by the backend, even when
// the event is no longer valid from the new state: the producer reads
// again and decides again (statestore.Fenced) instead of taking the
// refusal as final.
func TestValidatingStore_AppendIf(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	s, err := statestore.NewValidatingStore(mem)
	if err != nil {
		t.Fatal(err)
	}
	started := storetest.Event("r", statestore.RunStarted, "")
	appendAll(t, s, started)
	decidedOn, err := s.ProjectSnapshot(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	appendAll(t, s, storetest.Event("r", statestore.RunPaused, ""))

	t.Run("ErrRunChanged", func(t *testing.T) {
		completed := storetest.Event("r", statestore.RunCompleted, "")
		if _, err := s.AppendIf(ctx, completed, decidedOn.LastEventSeq); !errors.Is(err, statestore.ErrRunChanged) {
			t.Fatalf("got %v, want RUN_CHANGED", err)
		}
		if recs, _ := mem.Fetch(ctx, "r", 0, 0); len(recs) != 2 {
			t.Fatalf("%d records, want 2", len(recs))
		}
	})
	t.Run("ErrInvalidTransition", func(t *testing.T) {
		now, err := s.ProjectSnapshot(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		completed := storetest.Event("r", statestore.RunCompleted, "")
		if _, err := s.AppendIf(ctx, completed, now.LastEventSeq); !errors.Is(err, statestore.ErrInvalidTransition) {
			t.Fatalf("got %v, want INVALID_TRANSITION (decided on the run's current state)", err)
		}
	})
}
