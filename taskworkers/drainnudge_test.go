package taskworkers_test

import (
	"context"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestWorker_OnTaskDoneMayEndDrain checks the nudge that serve turns into
// a drain monitor check (a read of the run): a step whose outcome landed
// on the run as its own StepStarted left it cannot end a drain (a pause
// recorded after it sees it ended), so the monitor is not asked to read
// the run; a step of a run paused while it ran may end the drain, and the
// monitor is asked.
func TestWorker_OnTaskDoneMayEndDrain(t *testing.T) {
	e := newBenchEnv(t)
	d := e.taskDones()
	t.Run("RunningRun", func(t *testing.T) {
		ids := e.startRuns(t, 1, 3)
		runID := e.runOf(t, ids[0])
		d.open(t, "drain-nudge-test")
		e.waitCompleted(t, ids)
		for i, c := range d.take(t, 3, 2*time.Minute) {
			if c.runID != runID || c.mayEndDrain {
				t.Fatalf("nudge %d: %v of run %s, want mayEndDrain false: the run was running from each step's start to its outcome", i, c, runID)
			}
		}
	})
	// running starts a run of one 2 s step and returns it once the step
	// is in flight.
	running := func(t *testing.T) (runID string, snap *statestore.RunSnapshot) {
		ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sleep", "2"}}, plan.RetryPolicy{})
		runID = e.runOf(t, ids[0])
		d.open(t, "drain-nudge-test")
		deadline := time.Now().Add(2 * time.Minute)
		for snap == nil || len(snap.InFlight()) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the step did not start within 2 min")
			}
			time.Sleep(20 * time.Millisecond)
			var err error
			if snap, err = e.store.ProjectSnapshot(context.Background(), runID); err != nil {
				t.Fatal(err)
			}
		}
		return runID, snap
	}
	emit := func(t *testing.T, w *statestore.RunEventWrite) {
		if _, err := e.emit.Emit(context.Background(), w); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("PausedWhileRunning", func(t *testing.T) {
		runID, snap := running(t)
		emit(t, runEventLike(t, e, snap, statestore.RunPaused, 1)) // the drain controller's, while the step runs
		if got := d.take(t, 1, 2*time.Minute); got[0].runID != runID || !got[0].mayEndDrain {
			t.Fatalf("nudge %v of run %s, want mayEndDrain: the step ended while its run was draining", got[0], runID)
		}
		emit(t, runEventLike(t, e, snap, statestore.RunResumed, 1))
	})
	t.Run("OutcomeRecordedByAnotherWriter", func(t *testing.T) {
		// Another writer records the step's outcome after a pause (a
		// second worker Conductor handed the task to): this worker's
		// outcome is its duplicate, which says nothing of the state it
		// landed on.
		runID, snap := running(t)
		emit(t, runEventLike(t, e, snap, statestore.RunPaused, 1))
		other := runEventLike(t, e, snap, statestore.StepCompleted, 1)
		other.StepID = snap.InFlight()[0]
		other.IdempotencyKey = other.KeyInput().Key()
		emit(t, other)
		if got := d.take(t, 1, 2*time.Minute); got[0].runID != runID || !got[0].mayEndDrain {
			t.Fatalf("nudge %v of run %s, want mayEndDrain: the outcome was a duplicate of one recorded while the run was draining", got[0], runID)
		}
		emit(t, runEventLike(t, e, snap, statestore.RunResumed, 1))
	})
}
