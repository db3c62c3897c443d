package taskworkers

import (
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
)

func TestGate(t *testing.T) {
	const wf = "wf-1"
	run := func(status string, steps ...statestore.StepSnapshot) *statestore.RunSnapshot {
		return &statestore.RunSnapshot{RunID: "r", Status: status, EngineRunRef: "conductor://plan/" + wf, Steps: steps}
	}
	step := func(status string, logical int64, held bool) statestore.StepSnapshot {
		return statestore.StepSnapshot{StepID: "s", Status: status, LogicalAttemptID: logical, Held: held}
	}
	tried := func(status string, logical, engine int64, idle bool) statestore.StepSnapshot {
		return statestore.StepSnapshot{StepID: "s", Status: status, LogicalAttemptID: logical, EngineAttemptID: engine, Idle: idle}
	}
	cancelled := run(statestore.RunStatusRunning)
	cancelled.CancelRequested = true
	for _, tt := range []struct {
		name     string
		snap     *statestore.RunSnapshot
		workflow string
		logical  int64
		want     verdict
		// wantLogical and wantOperator are checked for start only.
		wantLogical  int64
		wantOperator bool
	}{
		{"running, step unseen", run(statestore.RunStatusRunning), wf, 1, start, 1, false},
		{"running, step started before a crash", run(statestore.RunStatusRunning, step(statestore.StepStatusRunning, 1, false)), wf, 1, start, 1, false},
		{"next logical attempt", run(statestore.RunStatusRunning, step(statestore.StepStatusFailed, 1, false)), wf, 2, start, 2, false},
		{"operator retry raises the attempt", run(statestore.RunStatusRunning, step(statestore.StepStatusPending, 3, false)), wf, 1, start, 3, true},
		{"paused", run(statestore.RunStatusPaused), wf, 1, waitPaused, 0, false},
		// The try in flight polled again (its worker reported IN_PROGRESS
		// with a callback, and polls it back): it finishes in the drain.
		{"paused, its try in flight polled again", run(statestore.RunStatusPaused, tried(statestore.StepStatusRunning, 1, 1, false)), wf, 1, start, 1, false},
		{"paused, no try recorded", run(statestore.RunStatusPaused, tried(statestore.StepStatusRunning, 1, 0, false)), wf, 1, waitPaused, 0, false},
		{"paused, another try of it", run(statestore.RunStatusPaused, tried(statestore.StepStatusRunning, 1, 2, false)), wf, 1, waitPaused, 0, false},
		{"paused, its try ended (idle)", run(statestore.RunStatusPaused, tried(statestore.StepStatusRunning, 1, 1, true)), wf, 1, waitPaused, 0, false},
		{"paused, another logical attempt", run(statestore.RunStatusPaused, tried(statestore.StepStatusRunning, 2, 1, false)), wf, 1, waitPaused, 0, false},
		{"paused, not started", run(statestore.RunStatusPaused, tried(statestore.StepStatusPending, 1, 1, false)), wf, 1, waitPaused, 0, false},
		{"pending", run(statestore.RunStatusPending), wf, 1, waitNotRunning, 0, false},
		{"approved", run(statestore.RunStatusApproved), wf, 1, waitNotRunning, 0, false},
		{"cancel requested", cancelled, wf, 1, waitCancel, 0, false},
		{"completed", run(statestore.RunStatusCompleted), wf, 1, refuseEnded, 0, false},
		{"failed", run(statestore.RunStatusFailed), wf, 1, refuseEnded, 0, false},
		{"another workflow", run(statestore.RunStatusRunning), "wf-2", 1, refuseForeign, 0, false},
		{"completed before a crash", run(statestore.RunStatusRunning, step(statestore.StepStatusSuccess, 1, false)), wf, 1, reportCompleted, 0, false},
		{"failed for good before a crash", run(statestore.RunStatusRunning, step(statestore.StepStatusFailed, 1, false)), wf, 1, reportFailed, 0, false},
		{"held before the pause was recorded", run(statestore.RunStatusRunning, step(statestore.StepStatusFailed, 1, true)), wf, 1, holdFailed, 0, false},
	} {
		d := gate(tt.snap, tt.workflow, "s", 1, tt.logical)
		if d.verdict != tt.want {
			t.Errorf("%s: verdict %d, want %d", tt.name, d.verdict, tt.want)
			continue
		}
		if tt.want == start && (d.logical != tt.wantLogical || d.operatorAttempt != tt.wantOperator) {
			t.Errorf("%s: logical %d operator %v, want %d %v", tt.name, d.logical, d.operatorAttempt, tt.wantLogical, tt.wantOperator)
		}
	}
}
