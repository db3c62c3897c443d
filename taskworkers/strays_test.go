package taskworkers_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"syscall"
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

// losingPoller polls the real Conductor, and throws away the answer of the
// first poll that got tasks, as a connection reset while the answer was on
// its way would (Conductor restarting on PostgreSQL did exactly that in
// TestE2E_ConductorRestartOnPostgres: the task stayed IN_PROGRESS under the
// sidecar's worker id for its response timeout). The fault is forced; the
// server and its state are real.
type losingPoller struct {
	adapter.DomainPoller
	loseType string // "": any task type
	mu       sync.Mutex
	lost     []string
}

func (p *losingPoller) BatchPoll(ctx context.Context, taskType, workerID string, count int, timeout time.Duration) ([]model.Task, error) {
	tasks, err := p.DomainPoller.BatchPoll(ctx, taskType, workerID, count, timeout)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || len(tasks) == 0 || p.lost != nil || (p.loseType != "" && taskType != p.loseType) {
		return tasks, err
	}
	for _, t := range tasks {
		p.lost = append(p.lost, t.TaskId)
	}
	return nil, fmt.Errorf("batch poll: %w", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET})
}

// TestWorker_LostPollAnswerIsHandedBack: the tasks of a poll answer that
// never arrived are handed back once no poll can still deliver them, and
// their runs go on; without that they wait for Conductor's response
// timeout (minutes).
func TestWorker_LostPollAnswerIsHandedBack(t *testing.T) {
	e := newBenchEnv(t)
	const runs = 3
	ids := e.startRunsWith(t, runs, plan.ExecutorSpec{Type: plan.ExecutorNoop}, plan.RetryPolicy{})
	poller := &losingPoller{DomainPoller: adapter.DomainPoller{Client: e.client, Domain: e.domain}}
	const workerID = "strays-test"
	w := taskworkers.New(poller, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: workerID, Concurrency: map[string]int{plan.TaskType(plan.ExecutorNoop): 4}, PollTimeout: 100 * time.Millisecond,
		Recover: func(ctx context.Context) ([]model.Task, error) { return e.runs.InFlightTasks(ctx, workerID) },
		Logger:  zaptest.NewLogger(t),
	})
	if err := w.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })

	deadline := time.Now().Add(60 * time.Second)
	for _, id := range ids {
		wf, err := e.client.Workflow(context.Background(), id, false)
		if err != nil {
			t.Fatal(err)
		}
		runID, _ := wf.Input[plan.InputRunID].(string)
		for {
			recs, err := e.store.Fetch(context.Background(), runID, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			done := false
			for _, r := range recs {
				done = done || r.EventType == statestore.StepCompleted
			}
			if done {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %s: its step never completed; the lost answer's tasks %v were not handed back", runID, poller.lost)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if len(poller.lost) == 0 {
		t.Fatal("no poll answer was lost: the test tested nothing")
	}
}

// TestWorker_StrayLookKeepsHeldTasks: the look for strays never hands back
// a task this process holds: a sleep step running while a lost poll answer
// is recovered is polled once and started once.
func TestWorker_StrayLookKeepsHeldTasks(t *testing.T) {
	e := newBenchEnv(t)
	held := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 20}, plan.RetryPolicy{})
	noop := plan.TaskType(plan.ExecutorNoop)
	poller := &losingPoller{DomainPoller: adapter.DomainPoller{Client: e.client, Domain: e.domain}, loseType: noop}
	const workerID = "strays-held-test"
	w := taskworkers.New(poller, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: workerID, Concurrency: map[string]int{noop: 2, plan.TaskType(plan.ExecutorSleep): 2}, PollTimeout: 100 * time.Millisecond,
		Recover: func(ctx context.Context) ([]model.Task, error) { return e.runs.InFlightTasks(ctx, workerID) },
		Logger:  zaptest.NewLogger(t),
	})
	if err := w.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	time.Sleep(time.Second) // the sleep step runs
	lostRun := e.startRunsWith(t, 1, plan.ExecutorSpec{Type: plan.ExecutorNoop}, plan.RetryPolicy{})
	wfs := e.waitCompleted(t, append(held, lostRun...))
	if len(poller.lost) == 0 {
		t.Fatal("no poll answer was lost: the test tested nothing")
	}
	for _, wf := range wfs {
		for _, task := range wf.Tasks {
			if wf.WorkflowId == held[0] && task.PollCount != 1 {
				t.Errorf("the held sleep task was polled %d times: the look for strays handed it back", task.PollCount)
			}
		}
	}
}
