package proxy_test

import (
	"net/http"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
	"github.com/conductor-sidecar/sidecar/taskworkers"
)

// TestProxy_OutcomeRefusalOnTheLatestRead: an outside worker's outcome
// that the run's state refuses is not recorded, so the refusal is decided
// on a read that sees every append. On a read that lags the log (one that
// does not show the step's StepStarted) the outcome of a step that ran
// was refused, and the task offered to a worker again.
func TestProxy_OutcomeRefusalOnTheLatestRead(t *testing.T) {
	e := newEnvOpts(t, envOpts{reads: func(s taskworkers.SnapshotReader) taskworkers.SnapshotReader {
		return storetest.NewLaggingReads(s)
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
