package httpapi

import (
	"errors"
	"testing"

	"github.com/conductor-sidecar/sidecar/drain"
)

// TestPauseOutcome: a run the log showed paused already when its pause was
// decided (the selection read a run list behind the log, or a concurrent
// request paused it first) answers already_paused, not paused: only the
// request that recorded a run's pause claims it.
func TestPauseOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		st   *drain.State
		err  error
		want string
	}{
		{"Recorded", &drain.State{Status: "PAUSED"}, nil, OutcomePaused},
		{"AlreadyPaused", &drain.State{Status: "PAUSED", AlreadyPaused: true}, nil, OutcomeAlreadyPaused},
		{"Failed", nil, errors.New("store down"), OutcomeFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pauseOutcome(tc.st, tc.err); got.Outcome != tc.want {
				t.Fatalf("pauseOutcome(%+v, %v) = %q, want %q", tc.st, tc.err, got.Outcome, tc.want)
			}
		})
	}
}
