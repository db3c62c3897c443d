package taskworkers_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// TestWorker_OutcomeRefusalOnTheLatestRead: a step's outcome that the
// run's state refuses is dropped (another writer recorded the attempt's
// outcome first), so the refusal is decided on a read that sees every
// append. On a read that lags the log (here one that does not show the
// step's own StepStarted) the outcome was dropped, the task handed back,
// and the step run again, while the run was paused.
func TestWorker_OutcomeRefusalOnTheLatestRead(t *testing.T) {
	e := newBenchEnv(t)
	ctx := context.Background()
	ran := filepath.Join(t.TempDir(), "ran")
	w := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, storetest.NewLaggingReads(e.store),
		e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
			WorkerID: "lagging-read-test", Concurrency: map[string]int{plan.TaskType(plan.ExecutorCommand): 2}, PollTimeout: 100 * time.Millisecond,
			HandBackAfter: time.Second, Logger: zaptest.NewLogger(t),
		})
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	wfID := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c", `echo x >> "$0"; sleep 2`, ran}}, plan.RetryPolicy{})[0]
	runID, _ := runningStep(t, e, wfID)
	// The run is paused while the step runs: its outcome's append
	// conditioned on its StepStarted is refused, and the outcome is
	// checked on a read of the run.
	snap, err := e.store.ProjectSnapshot(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	paused, err := statestore.NewEvent(snap.Ref(), statestore.RunPaused, "", 1, 1, statestore.RunPausedPayload{Reason: "maintenance"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.emit.Emit(ctx, paused); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs, _ := e.store.Fetch(ctx, runID, 0, 0)
		if countEvents(recs, statestore.StepCompleted) == 1 {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(ran)
			t.Fatalf("no StepCompleted 20 s after the 2 s step started (it ran %d times): %v", strings.Count(string(b), "x"), eventTypesOf(recs))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // a hand-back's callback (1 s) and a second run (2 s) would show
	if b, _ := os.ReadFile(ran); strings.Count(string(b), "x") != 1 {
		t.Fatalf("the step ran %d times, want once", strings.Count(string(b), "x"))
	}
}

func eventTypesOf(recs []statestore.RunEventRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.EventType
	}
	return out
}
