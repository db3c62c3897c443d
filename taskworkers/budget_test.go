package taskworkers_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
	"go.uber.org/zap/zaptest"
)

// failingSink passes events to the real registry emitter, except that it
// refuses events of type failType while fail is set: a store outage for one
// kind of write, which the real store cannot be made to show.
type failingSink struct {
	emit     *registry.Emitter
	failType string
	fail     atomic.Bool
	refused  atomic.Int32
}

func (f *failingSink) Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	if f.fail.Load() && w.EventType == f.failType {
		f.refused.Add(1)
		return statestore.AppendResult{}, &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "injected outage"}
	}
	return f.emit.Emit(ctx, w)
}

func (f *failingSink) EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	if f.fail.Load() && w.EventType == f.failType {
		f.refused.Add(1)
		return statestore.AppendResult{}, &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "injected outage"}
	}
	return f.emit.EmitIf(ctx, w, lastSeq)
}

func startWorker(t *testing.T, e *benchEnv, sink taskworkers.Emitter) *taskworkers.Worker {
	t.Helper()
	w := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, e.store, sink, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: "budget-test", Concurrency: map[string]int{plan.TaskType(plan.ExecutorNoop): 2, plan.TaskType(plan.ExecutorSleep): 2, plan.TaskType(plan.ExecutorCommand): 2}, PollTimeout: 100 * time.Millisecond,
		WriteBudget: 300 * time.Millisecond, Logger: zaptest.NewLogger(t),
	})
	if err := w.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	return w
}

func TestWorker_StepCompletedNeverFailsOpen(t *testing.T) {
	e := newBenchEnv(t)
	sink := &failingSink{emit: e.emit, failType: statestore.StepCompleted}
	sink.fail.Store(true)
	ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorNoop}, plan.RetryPolicy{EngineTries: 3})
	startWorker(t, e, sink)
	// Wait for the first refusal, then let the store recover.
	deadline := time.Now().Add(30 * time.Second)
	for sink.refused.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("StepCompleted was never attempted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// While StepCompleted is refused the task is not COMPLETED in
	// Conductor (nor FAILED: that would spend one of Conductor's retries).
	for range 3 {
		time.Sleep(300 * time.Millisecond)
		wf, err := e.client.Workflow(context.Background(), ids[0], true)
		if err != nil {
			t.Fatal(err)
		}
		if st := wf.Tasks[0].Status; st == "COMPLETED" || st == "FAILED" || len(wf.Tasks) != 1 {
			t.Fatalf("during the outage: task %s (%d tasks), want it handed back", st, len(wf.Tasks))
		}
	}
	sink.fail.Store(false)
	wf := e.waitCompleted(t, ids)[0]
	if len(wf.Tasks) != 1 {
		t.Fatalf("%d tasks, want 1: the outage must not spend an engine retry", len(wf.Tasks))
	}
	runID, _ := wf.Input["runId"].(string)
	recs, _ := e.store.Fetch(context.Background(), runID, 0, 0)
	var got []string
	for _, r := range recs {
		got = append(got, r.EventType)
	}
	if strings.Join(got, " ") != "RunStarted StepStarted StepCompleted" {
		t.Fatalf("log %v", got)
	}
	if recs[2].EngineAttemptID != 1 {
		t.Fatalf("StepCompleted at engine attempt %d, want 1", recs[2].EngineAttemptID)
	}
}

// TestWorker_AStoreOutageAtTheOutcomeDoesNotFailTheStep: a step whose
// StepCompleted cannot be recorded within the write budget is neither
// reported COMPLETED (never fail open) nor FAILED: its task is handed back,
// and when Conductor offers it again the outcome the worker kept is
// recorded and reported, without running the step again. Finding of
// TestE2E_Chaos: a NATS node killed in an R3 cluster stalled appends for
// the leader election, and steps without engine retries failed their runs.
func TestWorker_AStoreOutageAtTheOutcomeDoesNotFailTheStep(t *testing.T) {
	e := newBenchEnv(t)
	sink := &failingSink{emit: e.emit, failType: statestore.StepCompleted}
	sink.fail.Store(true)
	ran := filepath.Join(t.TempDir(), "ran")
	ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c", `echo x >> "$RAN"`}, Env: map[string]string{"RAN": ran}}, plan.RetryPolicy{})
	startWorker(t, e, sink)
	deadline := time.Now().Add(30 * time.Second)
	for sink.refused.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("StepCompleted was never attempted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the worker's report, whatever it is
	wf, err := e.client.Workflow(context.Background(), ids[0], true)
	if err != nil {
		t.Fatal(err)
	}
	if task := wf.Tasks[0]; wf.Status != "RUNNING" || (task.Status != "IN_PROGRESS" && task.Status != "SCHEDULED") {
		t.Fatalf("during the outage: workflow %s, task %s %q; want RUNNING, and the task handed back (SCHEDULED again)", wf.Status, task.Status, task.ReasonForIncompletion)
	}
	sink.fail.Store(false)
	wf = e.waitCompleted(t, ids)[0]
	if len(wf.Tasks) != 1 || wf.Tasks[0].Status != "COMPLETED" {
		t.Fatalf("tasks %+v, want the one task COMPLETED", wf.Tasks)
	}
	runID, _ := wf.Input["runId"].(string)
	recs, _ := e.store.Fetch(context.Background(), runID, 0, 0)
	var got []string
	for _, r := range recs {
		got = append(got, r.EventType)
	}
	if strings.Join(got, " ") != "RunStarted StepStarted StepCompleted" || recs[2].EngineAttemptID != 1 {
		t.Fatalf("log %v, want RunStarted StepStarted StepCompleted at engine attempt 1", got)
	}
	out, err := os.ReadFile(ran)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(out), "x"); n != 1 {
		t.Fatalf("the step ran %d times, want once: its outcome was kept", n)
	}
}

// TestWorker_AStoreOutageAtAFailureKeepsItToo: the same for StepFailed: a
// step that failed for good while the store refused StepFailed is
// recorded failed once the store answers, after running once.
func TestWorker_AStoreOutageAtAFailureKeepsItToo(t *testing.T) {
	e := newBenchEnv(t)
	sink := &failingSink{emit: e.emit, failType: statestore.StepFailed}
	sink.fail.Store(true)
	ran := filepath.Join(t.TempDir(), "ran")
	ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c", `echo x >> "$RAN"; exit 3`}, Env: map[string]string{"RAN": ran}}, plan.RetryPolicy{})
	startWorker(t, e, sink)
	deadline := time.Now().Add(30 * time.Second)
	for sink.refused.Load() < 2 { // refused, handed back, offered again, refused again
		if time.Now().After(deadline) {
			t.Fatal("StepFailed was not attempted twice")
		}
		time.Sleep(20 * time.Millisecond)
	}
	sink.fail.Store(false)
	e.waitEnded(t, ids)
	wf, err := e.client.Workflow(context.Background(), ids[0], true)
	if err != nil {
		t.Fatal(err)
	}
	if wf.Status != "FAILED" || len(wf.Tasks) != 1 {
		t.Fatalf("workflow %s with %d tasks, want FAILED with the one task", wf.Status, len(wf.Tasks))
	}
	runID, _ := wf.Input["runId"].(string)
	recs, _ := e.store.Fetch(context.Background(), runID, 0, 0)
	if n := len(recs); n < 3 || recs[2].EventType != statestore.StepFailed {
		t.Fatalf("log of %d records, want RunStarted StepStarted StepFailed", n)
	}
	out, _ := os.ReadFile(ran)
	if n := strings.Count(string(out), "x"); n != 1 {
		t.Fatalf("the step ran %d times, want once", n)
	}
}

func TestWorker_StepStartedFailsOpenToOutbox(t *testing.T) {
	e := newBenchEnv(t)
	sink := &failingSink{emit: e.emit, failType: statestore.StepStarted}
	sink.fail.Store(true)
	ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 1.5}, plan.RetryPolicy{})
	startWorker(t, e, sink)
	deadline := time.Now().Add(30 * time.Second)
	for sink.refused.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("StepStarted was never attempted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The step runs although its StepStarted is queued in the outbox; the
	// store comes back while it runs, and StepCompleted flushes the outbox
	// first.
	sink.fail.Store(false)
	wf := e.waitCompleted(t, ids)[0]
	if wf.Tasks[0].Status != "COMPLETED" {
		t.Fatalf("task %s, want COMPLETED at the first try", wf.Tasks[0].Status)
	}
	runID, _ := wf.Input["runId"].(string)
	snap, err := e.store.ProjectSnapshot(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := e.store.Fetch(context.Background(), runID, 0, 0)
	if len(recs) != 3 || recs[1].EventType != statestore.StepStarted || recs[2].EventType != statestore.StepCompleted || snap.Inconsistent {
		t.Fatalf("log must keep StepStarted before StepCompleted: %d records, inconsistent=%v", len(recs), snap.Inconsistent)
	}
}

func TestWorker_PauseGateHandsTasksBack(t *testing.T) {
	e := newBenchEnv(t)
	ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorNoop}, plan.RetryPolicy{})
	wf, err := e.client.Workflow(context.Background(), ids[0], false)
	if err != nil {
		t.Fatal(err)
	}
	runID, _ := wf.Input["runId"].(string)
	snap, err := e.store.ProjectSnapshot(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	// Pause the run in the log (the drain controller's RunPaused), before
	// any worker polls.
	paused := runEventLike(t, e, snap, statestore.RunPaused, 1)
	if _, err := e.emit.Emit(context.Background(), paused); err != nil {
		t.Fatal(err)
	}
	w := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: "gate-test", Concurrency: map[string]int{plan.TaskType(plan.ExecutorNoop): 1}, PollTimeout: 100 * time.Millisecond,
		HandBackAfter: time.Second, Logger: zaptest.NewLogger(t),
	})
	if err := w.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	time.Sleep(3 * time.Second) // several polls and hand-backs
	recs, _ := e.store.Fetch(context.Background(), runID, 0, 0)
	for _, r := range recs {
		if r.EventType == statestore.StepStarted {
			t.Fatal("a step started while the run was PAUSED")
		}
	}
	wf, _ = e.client.Workflow(context.Background(), ids[0], true)
	if len(wf.Tasks) != 1 || wf.Tasks[0].Status == "COMPLETED" || wf.Tasks[0].PollCount < 2 {
		t.Fatalf("the task must have been polled and handed back, not run: %d tasks, status %s, polls %d",
			len(wf.Tasks), wf.Tasks[0].Status, wf.Tasks[0].PollCount)
	}
	resumed := runEventLike(t, e, snap, statestore.RunResumed, 1)
	if _, err := e.emit.Emit(context.Background(), resumed); err != nil {
		t.Fatal(err)
	}
	e.waitCompleted(t, ids)
}

// runEventLike builds a run-level event for the run of snap.
func runEventLike(t *testing.T, e *benchEnv, snap *statestore.RunSnapshot, eventType string, cycle int64) *statestore.RunEventWrite {
	t.Helper()
	w := &statestore.RunEventWrite{EventType: eventType, EmittedAt: time.Now().UTC().Format(time.RFC3339Nano), RunID: snap.RunID,
		TenantID: snap.TenantID, ProjectID: snap.ProjectID, EnvironmentID: snap.EnvironmentID, PlanID: snap.PlanID, PlanVersion: snap.PlanVersion,
		EngineAttemptID: 1, LogicalAttemptID: cycle}
	w.IdempotencyKey = w.KeyInput().Key()
	return w
}

// TestWorker_OnTaskDoneMayEndRun checks the nudge that serve turns into a
// run watcher check: a completed step that other steps depend on cannot end
// the run; a sink step, or a step that failed, may.
func TestWorker_OnTaskDoneMayEndRun(t *testing.T) {
	e := newBenchEnv(t)
	d := e.taskDones()
	// mayEndRun lists what each call said, and "other" for a call of
	// another run.
	mayEndRun := func(got []taskDone, runID string) []any {
		var out []any
		for _, c := range got {
			if c.runID != runID {
				out = append(out, "other")
				continue
			}
			out = append(out, c.mayEndRun)
		}
		return out
	}
	t.Run("Chain", func(t *testing.T) {
		ids := e.startRuns(t, 1, 3)
		runID := e.runOf(t, ids[0])
		d.open(t, "nudge-test")
		e.waitCompleted(t, ids)
		got := d.take(t, 3, 30*time.Second)
		if fmt.Sprint(mayEndRun(got, runID)) != "[false false true]" {
			t.Fatalf("nudges %v of run %s, want mayEndRun [false false true]", got, runID)
		}
	})
	t.Run("FailedStepWithDependents", func(t *testing.T) {
		ids := e.start(t, 1, 2, plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"false"}}, plan.RetryPolicy{})
		runID := e.runOf(t, ids[0])
		d.open(t, "nudge-test")
		if got := d.take(t, 1, 30*time.Second); got[0].runID != runID || !got[0].mayEndRun {
			t.Fatalf("nudge %v of run %s, want mayEndRun: a failed step may end the run", got[0], runID)
		}
	})
}

// TestWorker_AKeptOutcomeIsAnyReplicasToRecord: an outcome the store did
// not take is kept on the Conductor task handed back, not only in the
// memory of the worker that ran the step: another replica (here a worker
// started after the first one stopped) that gets the task records and
// reports it without running the step again, whether the run is paused or
// not.
func TestWorker_AKeptOutcomeIsAnyReplicasToRecord(t *testing.T) {
	e, _, ran, ids := keptOnItsTask(t)
	startWorker(t, e, e.emit) // another replica, with the store back
	recordedOnce(t, e, ids, ran)
}

// keptOnItsTask starts a run of one command step (it appends a line to
// ran) whose StepCompleted the store refuses, waits until its worker kept
// the outcome on the task it handed back, and stops that worker.
func keptOnItsTask(t *testing.T) (e *benchEnv, sink *failingSink, ran string, ids []string) {
	t.Helper()
	e = newBenchEnv(t)
	sink = &failingSink{emit: e.emit, failType: statestore.StepCompleted}
	sink.fail.Store(true)
	ran = filepath.Join(t.TempDir(), "ran")
	ids = e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c", `echo x >> "$RAN"`}, Env: map[string]string{"RAN": ran}}, plan.RetryPolicy{})
	first := startWorker(t, e, sink)
	deadline := time.Now().Add(30 * time.Second)
	for sink.refused.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("StepCompleted was never attempted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // its hand-back, with the outcome on the task
	if err := first.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e, sink, ran, ids
}

// recordedOnce waits for the run of ids to complete and checks that its
// step ran once (ran has one line) and its log has one StepCompleted.
func recordedOnce(t *testing.T, e *benchEnv, ids []string, ran string) {
	t.Helper()
	wf := e.waitCompleted(t, ids)[0]
	runID, _ := wf.Input["runId"].(string)
	recs, _ := e.store.Fetch(context.Background(), runID, 0, 0)
	if countEvents(recs, statestore.StepCompleted) != 1 {
		t.Fatalf("log %v, want one StepCompleted", eventTypesOf(recs))
	}
	out, err := os.ReadFile(ran)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(out), "x"); n != 1 {
		t.Fatalf("the step ran %d times, want once: its outcome was kept on its task", n)
	}
}

// failingReads is a reader of the run's state that fails while fail is
// set, as a store that stopped answering does (a PostgreSQL outage).
type failingReads struct {
	inner taskworkers.SnapshotReader
	fail  atomic.Bool
	reads atomic.Int32 // reads refused
}

func (f *failingReads) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	if f.fail.Load() {
		f.reads.Add(1)
		return nil, &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "injected outage"}
	}
	return f.inner.ProjectSnapshot(ctx, runID)
}

// An outcome kept on its task survives the hand-backs of a replica that
// could not read the run meanwhile: the store is down for both replicas,
// the other one gets the task, cannot read the run and hands the task back;
// once the store is back, whichever replica gets the task records the kept
// outcome, and the step does not run again. Before, that hand-back replaced
// the task's output (Conductor keeps only the last update's) and the other
// replica ran the finished step a second time, recording nothing.
func TestWorker_AKeptOutcomeSurvivesAnotherReplicasHandBack(t *testing.T) {
	e, sink, ran, ids := keptOnItsTask(t)
	// The other replica, with the store still down, gets the task.
	reads := &failingReads{inner: e.store}
	reads.fail.Store(true)
	second := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, reads, sink, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: "budget-test-2", Concurrency: map[string]int{plan.TaskType(plan.ExecutorCommand): 2}, PollTimeout: 100 * time.Millisecond,
		WriteBudget: 300 * time.Millisecond, HandBackAfter: time.Second, Logger: zaptest.NewLogger(t),
	})
	if err := second.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Close(context.Background()) })
	deadline := time.Now().Add(30 * time.Second)
	for reads.reads.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the other replica never read the run")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // its hand-back
	// The store comes back.
	reads.fail.Store(false)
	sink.fail.Store(false)
	recordedOnce(t, e, ids, ran)
}
