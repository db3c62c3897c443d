package taskworkers_test

import (
	"context"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// TestWorker_TaskOfACancellingRunIsHandedBack: a task polled while the
// log has its run's cancel requested and not ended is handed back
// unstarted, and the run is named to OnCancellingTask: failing the task
// with a terminal error would fail the workflow in Conductor, where the
// cancel's terminate is what must end it.
func TestWorker_TaskOfACancellingRunIsHandedBack(t *testing.T) {
	e := newBenchEnv(t)
	ctx := context.Background()
	ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorNoop}, plan.RetryPolicy{})
	runID := runIDOf(t, e, ids[0])
	snap, err := e.store.ProjectSnapshot(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.emit.Emit(ctx, runEventLike(t, e, snap, statestore.RunCancelRequested, 1)); err != nil {
		t.Fatal(err)
	}
	named := make(chan string, 16)
	w := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: "cancelling-test", Concurrency: map[string]int{plan.TaskType(plan.ExecutorNoop): 1},
		PollTimeout: 100 * time.Millisecond, HandBackAfter: time.Hour, Logger: zaptest.NewLogger(t),
		OnCancellingTask: func(runID string) {
			select {
			case named <- runID:
			default:
			}
		},
	})
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(ctx) })
	// The hook is called once the task was answered to Conductor; a
	// task failed instead fails the workflow, seen at once.
	deadline := time.Now().Add(2 * time.Minute)
	for called := false; !called; {
		select {
		case got := <-named:
			if got != runID {
				t.Fatalf("OnCancellingTask named run %s, want %s", got, runID)
			}
			called = true
		case <-time.After(50 * time.Millisecond):
		}
		wf, err := e.client.Workflow(ctx, ids[0], true)
		if err != nil {
			t.Fatal(err)
		}
		if wf.Status != model.RunningWorkflow {
			t.Fatalf("workflow of run %s, whose cancel is requested, is %s (%s): its task was not left for the cancel's terminate", runID, wf.Status, wf.ReasonForIncompletion)
		}
		if called && (len(wf.Tasks) != 1 || (wf.Tasks[0].Status != model.InProgressTask && wf.Tasks[0].Status != "SCHEDULED")) {
			t.Fatalf("the task of run %s after the hand-back: %+v, want one task IN_PROGRESS or SCHEDULED", runID, wf.Tasks)
		}
		if !called && time.Now().After(deadline) {
			t.Fatalf("OnCancellingTask was not called for run %s within 2 minutes (its task unanswered, or answered without naming the run)", runID)
		}
	}
	for _, r := range checkLog(t, e, runID) {
		if r.EventType == statestore.StepStarted {
			t.Fatalf("StepStarted (runSeq %d) of a run whose cancel is requested", r.RunSeq)
		}
	}
}
