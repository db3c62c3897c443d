package taskworkers_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// TestWorker_OnTaskDoneMayEndDrain checks the nudge that serve turns into
// a drain monitor check (a read of the run): a step whose outcome landed
// on the run as its own StepStarted left it cannot end a drain (a pause
// recorded after it sees it ended), so the monitor is not asked to read
// the run; a step of a run paused while it ran may end the drain, and the
// monitor is asked.
func TestWorker_OnTaskDoneMayEndDrain(t *testing.T) {
	e := newBenchEnv(t)
	type done struct {
		runID       string
		mayEndDrain bool
	}
	calls := make(chan done, 16)
	open := func(t *testing.T) {
		w := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
			WorkerID: "drain-nudge-test", Concurrency: map[string]int{plan.TaskType(plan.ExecutorNoop): 1, plan.TaskType(plan.ExecutorCommand): 1},
			Logger: zaptest.NewLogger(t), OnTaskDone: func(runID string, _, mayEndDrain bool) { calls <- done{runID, mayEndDrain} },
		})
		if err := w.Open(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close(context.Background()) })
	}
	runOf := func(t *testing.T, workflowID string) string {
		wf, err := e.client.Workflow(context.Background(), workflowID, false)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := wf.Input["runId"].(string)
		return id
	}
	take := func(t *testing.T, n int) []done {
		var got []done
		for len(got) < n {
			select {
			case d := <-calls:
				got = append(got, d)
			case <-time.After(2 * time.Minute):
				t.Fatalf("%d nudges after 2 min, want %d: %v", len(got), n, got)
			}
		}
		return got
	}
	t.Run("RunningRun", func(t *testing.T) {
		ids := e.startRuns(t, 1, 3)
		runID := runOf(t, ids[0])
		open(t)
		e.waitCompleted(t, ids)
		for i, d := range take(t, 3) {
			if d != (done{runID, false}) {
				t.Fatalf("nudge %d: %v, want %v: the run was running from each step's start to its outcome", i, d, done{runID, false})
			}
		}
	})
	// running starts a run of one 2 s step and returns it once the step
	// is in flight.
	running := func(t *testing.T) (runID string, snap *statestore.RunSnapshot) {
		ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sleep", "2"}}, plan.RetryPolicy{})
		runID = runOf(t, ids[0])
		open(t)
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
		if got := take(t, 1); got[0] != (done{runID, true}) {
			t.Fatalf("nudge %v, want %v: the step ended while its run was draining", got[0], done{runID, true})
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
		if got := take(t, 1); got[0] != (done{runID, true}) {
			t.Fatalf("nudge %v, want %v: the outcome was a duplicate of one recorded while the run was draining", got[0], done{runID, true})
		}
		emit(t, runEventLike(t, e, snap, statestore.RunResumed, 1))
	})
}
