package taskworkers_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// taskDone is one call of Options.OnTaskDone.
type taskDone struct {
	runID       string
	mayEndRun   bool
	mayEndDrain bool
}

// taskDones opens a worker (one noop and one command task at a time) whose
// OnTaskDone calls are kept, in order, for take.
type taskDones struct {
	e     *benchEnv
	calls chan taskDone
}

func (e *benchEnv) taskDones() *taskDones {
	return &taskDones{e: e, calls: make(chan taskDone, 16)}
}

// open starts the worker; it is closed with the test.
func (d *taskDones) open(t *testing.T, workerID string) {
	t.Helper()
	w := taskworkers.New(adapter.DomainPoller{Client: d.e.client, Domain: d.e.domain}, d.e.store, d.e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: workerID, Concurrency: map[string]int{plan.TaskType(plan.ExecutorNoop): 1, plan.TaskType(plan.ExecutorCommand): 1},
		Logger: zaptest.NewLogger(t), OnTaskDone: func(runID string, mayEndRun, mayEndDrain bool) { d.calls <- taskDone{runID, mayEndRun, mayEndDrain} },
	})
	if err := w.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
}

// take returns the next n calls, failing the test after wait.
func (d *taskDones) take(t *testing.T, n int, wait time.Duration) []taskDone {
	t.Helper()
	var got []taskDone
	timeout := time.After(wait)
	for len(got) < n {
		select {
		case c := <-d.calls:
			got = append(got, c)
		case <-timeout:
			t.Fatalf("%d calls after %s, want %d: %v", len(got), wait, n, got)
		}
	}
	return got
}

// runOf returns the run id of a run's workflow.
func (e *benchEnv) runOf(t *testing.T, workflowID string) string {
	t.Helper()
	wf, err := e.client.Workflow(context.Background(), workflowID, false)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := wf.Input["runId"].(string)
	return id
}
