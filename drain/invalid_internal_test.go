package drain

import (
	"context"
	"errors"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestController_InvalidSaysWhatTheRunIs: an action the controller refuses
// on a state the transition table would allow is worded as the table's
// refusals are ("X is not allowed: the run is S"), so that every
// INVALID_TRANSITION reads the same to the user.
func TestController_InvalidSaysWhatTheRunIs(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	mem.Append(ctx, storetest.Event("r", statestore.RunStarted, ""))
	snap, err := mem.ProjectSnapshot(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	c := New(mem, memEmitter{mem}, nil, Options{})
	err = c.invalid(snap, statestore.RunCancelRequested) // allowed from RUNNING by the table
	var e *statestore.Error
	if !errors.As(err, &e) || !errors.Is(err, statestore.ErrInvalidTransition) {
		t.Fatalf("got %v, want INVALID_TRANSITION", err)
	}
	if want := "RunCancelRequested is not allowed: the run is RUNNING"; e.Message != want {
		t.Fatalf("got %q, want %q", e.Message, want)
	}
}
