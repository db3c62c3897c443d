package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_AdoptDeadWorkerWhilePausedIsRetried: a worker takes an adopted
// run's task through the proxy and dies while the run is paused. The
// proxy fails the task once its response timeout passed (Conductor times
// out no task of a PAUSED workflow), so the drain ends; the task's
// definition allows a retry, and at resume Conductor retries it, a live
// worker completes the retry and the workflow completes: as without the
// pause, where Conductor times the try out and retries it. The log gets
// the try's end (RunStepTryEnded), never a final StepFailed.
func TestE2E_AdoptDeadWorkerWhilePausedIsRetried(t *testing.T) {
	t.Parallel() // its own serve and data dir
	condURL := conductortest.URL(t)
	taskType := uniq("adopt_dead")
	name := uniq("adopt_dead")
	registerDef(t, condURL, name, []map[string]any{{"name": taskType, "taskReferenceName": "work", "type": "SIMPLE",
		"taskDefinition": map[string]any{"name": taskType, "retryCount": 1, "retryLogic": "FIXED", "retryDelaySeconds": 0,
			"timeoutSeconds": 0, "responseTimeoutSeconds": 3}}})
	proxyAddr := sidecartest.FreeAddr(t)
	p := newProc(sidecartest.Start(t, sidecartest.Options{DataDir: t.TempDir(), Addr: sidecartest.FreeAddr(t),
		Args: []string{"--conductor-proxy-listen", proxyAddr, "--adopt", name, "--adopt-interval", "300ms"}}))
	runID := startWorkflow(t, condURL, name, "dead-worker", map[string]any{})

	type task struct {
		TaskID             string `json:"taskId"`
		WorkflowInstanceID string `json:"workflowInstanceId"`
		RetryCount         int    `json:"retryCount"`
	}
	poll := func() *task {
		res, err := http.Get("http://" + proxyAddr + "/api/tasks/poll/" + taskType + "?workerid=e2e-worker")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var tk task
		if res.StatusCode != http.StatusOK || json.NewDecoder(res.Body).Decode(&tk) != nil || tk.TaskID == "" {
			return nil
		}
		return &tk
	}
	var first *task
	sidecartest.WaitFor(t, "the worker to get the task through the proxy", 60*time.Second, func() bool {
		first = poll()
		return first != nil
	})
	// The worker dies with the task: no report ever comes.
	if _, err := p.client.Pause(t.Context(), runID, 60, "the worker died"); err != nil {
		t.Fatal(err)
	}
	sidecartest.WaitFor(t, "the drain to end", 60*time.Second, func() bool {
		_, how := drainEnd(t, allEvents(t, p, runID))
		return how != ""
	})
	evs := allEvents(t, p, runID)
	if _, how := drainEnd(t, evs); how != statestore.RunDrainCompleted {
		t.Fatalf("drain ended with %s, want RunDrainCompleted once the response timeout passed\n%v", how, types(evs))
	}
	// Past a few adopter reads of the paused workflow (every 300 ms).
	time.Sleep(2 * time.Second)
	if i := eventIndex(allEvents(t, p, runID), statestore.StepFailed, "work", 0); i >= 0 {
		t.Fatalf("a try Conductor retries at resume was recorded failed for good while paused\n%v", types(allEvents(t, p, runID)))
	}
	if _, err := p.client.Resume(t.Context(), runID); err != nil {
		t.Fatal(err)
	}
	var retry *task
	sidecartest.WaitFor(t, "a live worker to get the retry", 60*time.Second, func() bool {
		retry = poll()
		return retry != nil
	})
	if retry.RetryCount != 1 || retry.TaskID == first.TaskID {
		t.Fatalf("after the resume the worker got %+v, want the retry of %s", retry, first.TaskID)
	}
	b, _ := json.Marshal(map[string]any{"taskId": retry.TaskID, "workflowInstanceId": retry.WorkflowInstanceID, "status": "COMPLETED",
		"workerId": "e2e-worker", "outputData": map[string]any{"ok": true}})
	res, err := http.Post("http://"+proxyAddr+"/api/tasks", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("the retry's report: %s", res.Status)
	}
	v := waitTerminal(t, p, runID, 60*time.Second)
	evs = allEvents(t, p, runID)
	if v.Status != statestore.RunStatusCompleted || conductorStatus(t, runID) != "COMPLETED" {
		t.Fatalf("run %s, Conductor %s after the retry completed; want COMPLETED in both\n%v\n%s", v.Status, conductorStatus(t, runID), types(evs), conductorTasks(t, runID))
	}
	validLog(t, evs)
}
