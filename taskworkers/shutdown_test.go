package taskworkers_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/google/uuid"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// downConductor hands out one noop task, then refuses every report with
// updateErr: Conductor gone after the poll. A fault the shared Conductor of
// the test run cannot be put into (other packages' tests use it at the
// same time); the worker's real-Conductor tests are in worker_test.go.
type downConductor struct {
	once      sync.Once
	updates   atomic.Int64
	updateErr error
}

func (d *downConductor) BatchPoll(ctx context.Context, taskType, _ string, _ int, _ time.Duration) ([]model.Task, error) {
	var ts []model.Task
	d.once.Do(func() {
		ts = []model.Task{{TaskId: "t1", WorkflowInstanceId: "wf1", TaskType: taskType, ResponseTimeoutSeconds: 600, InputData: map[string]any{}}}
	})
	if ts == nil {
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return ts, nil
}

func (d *downConductor) UpdateTask(context.Context, *model.TaskResult) error {
	d.updates.Add(1)
	return d.updateErr
}

type idEmitter struct{ s statestore.Store }

func (e idEmitter) Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	w.EventID = uuid.NewString()
	return e.s.Append(ctx, w)
}

func (e idEmitter) EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	w.EventID = uuid.NewString()
	return e.s.AppendIf(ctx, w, lastSeq)
}

func startDown(t *testing.T, c *downConductor) *taskworkers.Worker {
	t.Helper()
	mem := memstore.New(statestore.ProjectorOptions{})
	if _, err := mem.Append(context.Background(), storetest.Event("run-down", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	w := taskworkers.New(c, mem, idEmitter{mem}, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID:    "down",
		Concurrency: map[string]int{plan.TaskType(plan.ExecutorNoop): 1},
		Decode: func(map[string]any) (*taskworkers.Assignment, error) {
			w := storetest.Event("run-down", statestore.StepStarted, "s")
			return &taskworkers.Assignment{RunID: w.RunID, TenantID: w.TenantID, ProjectID: w.ProjectID, EnvironmentID: w.EnvironmentID,
				PlanID: w.PlanID, PlanVersion: w.PlanVersion, Step: plan.Step{StepID: "s", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
				EngineTries: 1, LogicalAttempts: 1, OnStepFailure: "fail", Sink: true}, nil
		},
		Logger: zaptest.NewLogger(t),
	})
	if err := w.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.updates.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the task was never reported")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return w
}

// TestWorker_CloseWhileConductorDown: a shutdown whose grace period ends
// while reports to Conductor fail returns then, instead of retrying until
// the task's response timeout (before, a second SIGTERM did not end the
// grace period).
func TestWorker_CloseWhileConductorDown(t *testing.T) {
	w := startDown(t, &downConductor{updateErr: errors.New("dial tcp 127.0.0.1:8080: connect: connection refused")})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Close(ctx) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("Close still waits 15 s after a 300 ms grace period, on reports Conductor never takes")
	}
}

// TestWorker_ReportWorkflowGone: a 404 for the task's workflow ends the
// report's retries at once and frees the slot (before, slots retried
// every 5 s for minutes after Conductor restarted).
func TestWorker_ReportWorkflowGone(t *testing.T) {
	c := &downConductor{updateErr: &adapter.Error{Code: adapter.CodeNotFound, Op: "update task", Status: 404}}
	w := startDown(t, c)
	time.Sleep(time.Second)
	if n := c.updates.Load(); n != 1 {
		t.Fatalf("%d reports of a task whose workflow is gone, want 1", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.Close(ctx); err != nil {
		t.Fatalf("Close: %v (the slot was not freed)", err)
	}
}
