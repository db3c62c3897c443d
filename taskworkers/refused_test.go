package taskworkers

import (
	"errors"
	"fmt"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// TestLogRefusedOutcome: an outcome the log already has for the attempt
// (a report repeated after its first was recorded) is logged as the
// repeat it is, not as an error; another outcome the run's state refuses
// (the run or the step ended otherwise: a cancel, an action in
// Conductor) is a warning, without a stack trace; one refused with no
// state read is an error.
func TestLogRefusedOutcome(t *testing.T) {
	snap := &statestore.RunSnapshot{Steps: []statestore.StepSnapshot{{StepID: "s1", Status: statestore.StepStatusSuccess, LogicalAttemptID: 1}}}
	refused := errors.New("INVALID_TRANSITION")
	for _, tc := range []struct {
		name      string
		eventType string
		logical   int64
		snap      *statestore.RunSnapshot
		want      zapcore.Level
	}{
		{"SameOutcome", statestore.StepCompleted, 1, snap, zapcore.InfoLevel},
		{"OtherOutcome", statestore.StepFailed, 1, snap, zapcore.WarnLevel},
		{"OtherAttempt", statestore.StepCompleted, 2, snap, zapcore.WarnLevel},
		{"NoState", statestore.StepCompleted, 1, nil, zapcore.ErrorLevel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.DebugLevel)
			logRefusedOutcome(zap.New(core), tc.snap, &statestore.RunEventWrite{EventType: tc.eventType, StepID: "s1", LogicalAttemptID: tc.logical}, refused)
			if all := logs.All(); len(all) != 1 || all[0].Level != tc.want {
				t.Fatalf("logged %v, want one line at %s", all, tc.want)
			}
		})
	}
}

// TestStoreTrouble: while the state store does not answer, every task's
// line is one warning a minute for all of them; another error is left to
// the caller to log.
func TestStoreTrouble(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	w := &Worker{log: log}
	down := &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "dial tcp: connection refused"}
	// A full disk: the embedded server refuses every write of the stream.
	full := fmt.Errorf("append: %w", &natsstore.WriteRefusedError{Stream: "SIDECAR_EVENTS", Cause: "insufficient resources", DataDir: "/data"})
	for i := range 50 {
		err := error(down)
		if i%2 == 1 {
			err = full
		}
		if !w.storeTrouble(log, err, "cannot read a run's state") {
			t.Fatalf("a store that does not answer or refuses writes was not taken as such: %v", err)
		}
	}
	if w.storeTrouble(log, errors.New("INVALID_TRANSITION"), "x") {
		t.Fatal("another error was taken for the store's")
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("50 tasks while the store was down: %d lines, want 1", n)
	}
}
