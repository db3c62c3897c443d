package proxy_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
)

// laggingReads answers every read of a run, but one that must see every
// append (statestore.WithLatest), with the first state it read of it: a
// JetStream replica behind its leader, as during a leader election. A
// fake: a real cluster lags only for moments nobody can choose.
type laggingReads struct {
	inner taskworkers.SnapshotReader
	mu    sync.Mutex
	first map[string]*statestore.RunSnapshot
}

func (l *laggingReads) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	if statestore.Latest(ctx) {
		return l.inner.ProjectSnapshot(ctx, runID)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.first[runID]; ok {
		return s, nil
	}
	s, err := l.inner.ProjectSnapshot(ctx, runID)
	if err == nil {
		l.first[runID] = s
	}
	return s, err
}

// TestProxy_OutcomeRefusalOnTheLatestRead: an outside worker's outcome
// that the run's state refuses is not recorded, so the refusal is decided
// on a read that sees every append. On a read that lags the log (one that
// does not show the step's StepStarted) the outcome of a step that ran
// was refused, and the task offered to a worker again.
func TestProxy_OutcomeRefusalOnTheLatestRead(t *testing.T) {
	e := newEnvOpts(t, envOpts{reads: func(s taskworkers.SnapshotReader) taskworkers.SnapshotReader {
		return &laggingReads{inner: s, first: map[string]*statestore.RunSnapshot{}}
	}})
	runID, _ := e.start(t, 1, 60)
	tk := e.pollOne(t)
	e.control(t, runID, statestore.RunPaused, 1) // the step is in flight: it drains
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": tk.TaskID, "workflowInstanceId": tk.WorkflowInstanceID,
		"status": "COMPLETED", "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("update: %d %s", resp.StatusCode, body)
	}
	if n := count(e.events(t, runID), statestore.StepCompleted); n != 1 {
		t.Fatalf("%d StepCompleted after the outside worker's update, want 1", n)
	}
}
