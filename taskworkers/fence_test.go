package taskworkers_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// pauseAfterRead is the run state as the gate reads it, with a RunPaused
// appended right after the gate's first read of each run: the pause lands
// between the gate's decision and its StepStarted, the interleaving a
// black-box run under load hit in 6 of 400 runs. The store is the real
// one; only the timing is forced.
type pauseAfterRead struct {
	t     *testing.T
	e     *benchEnv
	mu    sync.Mutex
	reads map[string]int
}

func (p *pauseAfterRead) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := p.e.store.ProjectSnapshot(ctx, runID)
	p.mu.Lock()
	p.reads[runID]++
	first := p.reads[runID] == 1
	p.mu.Unlock()
	if err != nil || !first || snap.Status != statestore.RunStatusRunning {
		return snap, err
	}
	w := &statestore.RunEventWrite{EventType: statestore.RunPaused, EmittedAt: time.Now().UTC().Format(time.RFC3339Nano),
		RunID: runID, TenantID: snap.TenantID, ProjectID: snap.ProjectID, EnvironmentID: snap.EnvironmentID,
		PlanID: snap.PlanID, PlanVersion: snap.PlanVersion, EngineAttemptID: 1, LogicalAttemptID: 1,
		Payload: json.RawMessage(`{"drainTimeoutSeconds":300,"requestedBy":"fence-test"}`)}
	w.IdempotencyKey = w.KeyInput().Key()
	if _, err := p.e.emit.Emit(ctx, w); err != nil {
		p.t.Errorf("append RunPaused: %v", err)
	}
	return snap, nil
}

func (p *pauseAfterRead) count(runID string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reads[runID]
}

// TestWorker_PauseIsAFence: once RunPaused is persisted, no StepStarted of
// the run is, even when the gate read the run as RUNNING just before the
// pause. The StepStarted is refused (RUN_CHANGED), the gate
// reads the run again, sees it paused and hands the task back.
func TestWorker_PauseIsAFence(t *testing.T) {
	e := newBenchEnv(t)
	const runs = 8
	ids := e.startRunsWith(t, runs, plan.ExecutorSpec{Type: plan.ExecutorNoop}, plan.RetryPolicy{})
	state := &pauseAfterRead{t: t, e: e, reads: map[string]int{}}
	w := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, state, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: "fence-test", Concurrency: map[string]int{plan.TaskType(plan.ExecutorNoop): 4}, PollTimeout: 100 * time.Millisecond,
		HandBackAfter: time.Hour, Logger: zaptest.NewLogger(t),
	})
	if err := w.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })

	runIDs := make([]string, 0, runs)
	for _, id := range ids {
		wf, err := e.client.Workflow(context.Background(), id, false)
		if err != nil {
			t.Fatal(err)
		}
		runID, _ := wf.Input[plan.InputRunID].(string)
		runIDs = append(runIDs, runID)
	}
	// Each run's task is gated once (RUNNING, then the pause lands) and
	// then either started (the defect) or read again and handed back.
	deadline := time.Now().Add(30 * time.Second)
	for _, runID := range runIDs {
		for {
			recs, err := e.store.Fetch(context.Background(), runID, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if state.count(runID) >= 2 || len(recs) > 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %s: the worker never gated its task (reads %d, %d events)", runID, state.count(runID), len(recs))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(200 * time.Millisecond) // a StepStarted in flight lands now
	for _, runID := range runIDs {
		recs, err := e.store.Fetch(context.Background(), runID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		paused := false
		for _, r := range recs {
			switch r.EventType {
			case statestore.RunPaused:
				paused = true
			case statestore.StepStarted:
				if paused {
					t.Errorf("run %s: StepStarted (runSeq %d) persisted after RunPaused: the pause is not a fence", runID, r.RunSeq)
				}
			}
		}
		if !paused {
			t.Errorf("run %s: no RunPaused", runID)
		}
	}
}
