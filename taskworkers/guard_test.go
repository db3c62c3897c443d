package taskworkers_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// otherOutcomeFirst is the noop executor with another writer's StepFailed
// of the same attempt landing while it runs (after the step's
// StepStarted): a second worker that ran the same task (Conductor
// redelivered it after a response timeout) and recorded its outcome
// first. The worker's own outcome, decided after, is no longer a valid
// transition.
type otherOutcomeFirst struct {
	t     *testing.T
	e     *benchEnv
	inner taskworkers.Executor
	once  sync.Once
}

func (o *otherOutcomeFirst) Execute(ctx context.Context, x taskworkers.Execution) (taskworkers.Result, error) {
	o.once.Do(func() {
		snap, err := o.e.store.ProjectSnapshot(ctx, x.RunID)
		if err != nil {
			o.t.Errorf("read the run: %v", err)
			return
		}
		w := &statestore.RunEventWrite{EventType: statestore.StepFailed, EmittedAt: time.Now().UTC().Format(time.RFC3339Nano),
			RunID: x.RunID, TenantID: snap.TenantID, ProjectID: snap.ProjectID, EnvironmentID: snap.EnvironmentID,
			PlanID: snap.PlanID, PlanVersion: snap.PlanVersion, StepID: x.StepID, EngineAttemptID: 1, LogicalAttemptID: x.LogicalAttemptID,
			Payload: json.RawMessage(`{"error":{"code":"OTHER_WORKER","message":"the other worker's outcome","retryable":false}}`)}
		w.IdempotencyKey = w.KeyInput().Key()
		if _, err := o.e.emit.Emit(ctx, w); err != nil {
			o.t.Errorf("the other worker's StepFailed: %v", err)
		}
	})
	return o.inner.Execute(ctx, x)
}

func guardWorker(t *testing.T, e *benchEnv, runs taskworkers.SnapshotReader) *taskworkers.Worker {
	t.Helper()
	return guardWorkerWith(t, e, runs, nil)
}

func guardWorkerWith(t *testing.T, e *benchEnv, runs taskworkers.SnapshotReader, m *taskworkers.Metrics, wrap ...func(taskworkers.Executor) taskworkers.Executor) *taskworkers.Worker {
	t.Helper()
	executors := exec.New(exec.Options{}).Executors()
	for _, f := range wrap {
		executors[plan.ExecutorNoop] = f(executors[plan.ExecutorNoop])
	}
	w := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, runs, e.emit, nil, executors, taskworkers.Options{
		WorkerID: "guard-test", Concurrency: map[string]int{plan.TaskType(plan.ExecutorNoop): 1, plan.TaskType(plan.ExecutorSleep): 1},
		PollTimeout: 100 * time.Millisecond, HandBackAfter: time.Hour, Logger: zaptest.NewLogger(t), Metrics: m,
	})
	if err := w.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	return w
}

func runIDOf(t *testing.T, e *benchEnv, workflowID string) string {
	t.Helper()
	wf, err := e.client.Workflow(context.Background(), workflowID, false)
	if err != nil {
		t.Fatal(err)
	}
	runID, _ := wf.Input[plan.InputRunID].(string)
	return runID
}

func checkLog(t *testing.T, e *benchEnv, runID string) []statestore.RunEventRecord {
	t.Helper()
	recs, err := e.store.Fetch(context.Background(), runID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, alerts := statestore.Reduce(nil, recs); len(alerts) != 0 {
		types := make([]string, len(recs))
		for i, r := range recs {
			types[i] = r.EventType
		}
		t.Fatalf("the worker appended an event the projector flags: %s (log %s)", alerts[0].Reason, strings.Join(types, " "))
	}
	return recs
}

// TestWorker_OutcomeGuard: the worker checks the step's outcome against
// the run's state before it appends it (Layer 1): the state its
// StepStarted left, with the outcome appended conditioned on it, or, the
// run having moved on, the state read again. When the log already has
// another outcome for the attempt, it appends nothing and reports to
// Conductor what the log says, so that the log and Conductor agree.
// Without the check (or with an unconditional append after the check on
// the StepStarted's state) the log gets StepCompleted after StepFailed.
func TestWorker_OutcomeGuard(t *testing.T) {
	e := newBenchEnv(t)
	ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorNoop}, plan.RetryPolicy{})
	reg := prometheus.NewRegistry()
	w := guardWorkerWith(t, e, e.store, taskworkers.NewMetrics(reg), func(x taskworkers.Executor) taskworkers.Executor {
		return &otherOutcomeFirst{t: t, e: e, inner: x}
	})
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	e.waitEnded(t, ids)
	wf, err := e.client.Workflow(context.Background(), ids[0], true)
	if err != nil {
		t.Fatal(err)
	}
	recs := checkLog(t, e, runIDOf(t, e, ids[0]))
	for _, r := range recs {
		if r.EventType == statestore.StepCompleted {
			t.Fatalf("StepCompleted (runSeq %d) appended after the other worker's StepFailed", r.RunSeq)
		}
	}
	if wf.Status != model.FailedWorkflow {
		t.Fatalf("workflow %s, want FAILED as the log says", wf.Status)
	}
	// The refusal is the only trace of the worker's own outcome.
	if n := storetest.Counter(t, reg, "sidecar_worker_steps_total", "refused"); n != 1 {
		t.Fatalf("sidecar_worker_steps_total{outcome=\"refused\"} %v, want 1", n)
	}
}

// TestWorker_TryEndedGuard: a step interrupted by the worker's shutdown
// records RunStepTryEnded only if the run's state allows it; for a run
// cancelled in the log meanwhile it appends nothing.
func TestWorker_TryEndedGuard(t *testing.T) {
	e := newBenchEnv(t)
	ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 60}, plan.RetryPolicy{EngineTries: 3})
	runID := runIDOf(t, e, ids[0])
	w := guardWorker(t, e, e.store)
	deadline := time.Now().Add(30 * time.Second)
	for {
		snap, err := e.store.ProjectSnapshot(context.Background(), runID)
		if err == nil && len(snap.Steps) == 1 && snap.Steps[0].Status == statestore.StepStatusRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the step never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	snap, err := e.store.ProjectSnapshot(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{statestore.RunCancelRequested, statestore.RunCancelled} {
		ev := runEventLike(t, e, snap, typ, 1)
		if _, err := e.emit.Emit(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
	}
	// A short grace period: the step is interrupted, its try ends.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_ = w.Close(ctx)
	for _, r := range checkLog(t, e, runID) {
		if r.EventType == statestore.RunStepTryEnded {
			t.Fatalf("RunStepTryEnded (runSeq %d) appended to a cancelled run", r.RunSeq)
		}
	}
}

// countingReads counts the run state reads of a worker.
type countingReads struct {
	taskworkers.SnapshotReader
	mu sync.Mutex
	n  int
}

func (c *countingReads) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.SnapshotReader.ProjectSnapshot(ctx, runID)
}

// TestWorker_OutcomeReusesTheStartRead: a step of a run that did not move
// while it ran costs one read of the run's state (the gate's), not two:
// the outcome is checked against the state its StepStarted left and
// appended conditioned on it.
func TestWorker_OutcomeReusesTheStartRead(t *testing.T) {
	e := newBenchEnv(t)
	ids := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorNoop}, plan.RetryPolicy{})
	reads := &countingReads{SnapshotReader: e.store}
	w := guardWorker(t, e, reads)
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	e.waitEnded(t, ids)
	recs := checkLog(t, e, runIDOf(t, e, ids[0]))
	if got := recs[len(recs)-1].EventType; got != statestore.StepCompleted {
		t.Fatalf("last event %s, want StepCompleted", got)
	}
	reads.mu.Lock()
	defer reads.mu.Unlock()
	if reads.n != 1 {
		t.Fatalf("%d reads of the run's state for one step, want 1", reads.n)
	}
}
