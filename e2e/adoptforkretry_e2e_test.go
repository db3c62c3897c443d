package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_AdoptedForkBranchRetried: 24 adopted workflows whose FORK branch
// task fails its first try, with retries left, through the task proxy.
// Conductor retries it, the worker completes the retry, the workflow
// completes; the log ends the first try (RunStepTryEnded) and never fails
// the step. Conductor 3.32 shows the failed try FAILED, not yet retried,
// for a moment before the decide that schedules its retry: a read of the
// workflow then must not take the failure for a final one (the gate would
// fail each retry from the log, and the workflow with them). The branch
// ends with a NOOP the JOIN waits on, the shape that keeps 3.32's own
// JOIN race away (docs/conductor.md), so a failure here is the sidecar's.
func TestE2E_AdoptedForkBranchRetried(t *testing.T) {
	t.Parallel() // its own serve, data dir and definitions
	condURL := conductortest.URL(t)
	taskType := uniq("adopt_forkretry")
	name := uniq("adopt_forkretry")
	flaky := map[string]any{"name": taskType, "taskReferenceName": "flaky", "type": "SIMPLE",
		"taskDefinition": map[string]any{"name": taskType, "retryCount": 2, "retryLogic": "FIXED", "retryDelaySeconds": 0,
			"timeoutSeconds": 0, "responseTimeoutSeconds": 60}}
	registerDef(t, condURL, name, []map[string]any{
		{"name": "fan", "taskReferenceName": "fan", "type": "FORK_JOIN", "forkTasks": [][]map[string]any{
			{flaky, {"name": "nop", "taskReferenceName": "nop", "type": "NOOP"}},
			{simpleTask("other", taskType, 0)}}},
		{"name": "gather", "taskReferenceName": "gather", "type": "JOIN", "joinOn": []string{"nop", "other"}},
		simpleTask("after", taskType, 0),
	})
	proxyAddr := sidecartest.FreeAddr(t)
	p := newProc(sidecartest.Start(t, sidecartest.Options{ConductorURL: condURL, DataDir: t.TempDir(), Addr: sidecartest.FreeAddr(t),
		Args: []string{"--conductor-proxy-listen", proxyAddr, "--adopt", name}}))

	// The worker: one loop that batch-polls through the proxy, fails the
	// flaky task's first try and completes everything else. One: 3.21's
	// memory store can lose a task under concurrent batch polls of one
	// queue (docs/conductor.md).
	stop := make(chan struct{})
	var loop sync.WaitGroup
	defer func() { close(stop); loop.Wait() }()
	loop.Add(1)
	go func() {
		defer loop.Done()
		proxyWorker(t, proxyAddr, taskType, "e2e-forkretry", stop)
	}()
	const runs = 24
	ids := make([]string, runs)
	for i := range ids {
		ids[i] = startWorkflow(t, condURL, name, fmt.Sprintf("forkretry-%d", i), map[string]any{})
	}
	var failed []string
	deadline := time.Now().Add(3 * time.Minute)
	for _, id := range ids {
		status := conductorStatus(t, id)
		for status == "RUNNING" && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			status = conductorStatus(t, id)
		}
		evs := allEvents(t, p, id)
		if status != "COMPLETED" || eventIndex(evs, statestore.StepFailed, "flaky", 0) >= 0 {
			failed = append(failed, fmt.Sprintf("%s: Conductor %s, log %v\n  %s", id, status, types(evs), conductorTasks(t, id)))
			continue
		}
		validLog(t, evs)
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d adopted workflows whose fork branch's first try failed did not complete, or their log failed the step:\n%s",
			len(failed), runs, strings.Join(failed, "\n"))
	}
}

// proxyWorker polls taskType through the proxy at proxyAddr until stop,
// failing the first try of the task "flaky" and completing every other.
func proxyWorker(t *testing.T, proxyAddr, taskType, workerID string, stop <-chan struct{}) {
	type task struct {
		TaskID             string `json:"taskId"`
		WorkflowInstanceID string `json:"workflowInstanceId"`
		ReferenceTaskName  string `json:"referenceTaskName"`
		RetryCount         int    `json:"retryCount"`
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for {
		select {
		case <-stop:
			return
		default:
		}
		res, err := client.Get("http://" + proxyAddr + "/api/tasks/poll/batch/" + taskType + "?count=4&timeout=500&workerid=" + workerID)
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		var tasks []task
		if res.StatusCode != http.StatusOK || json.NewDecoder(res.Body).Decode(&tasks) != nil {
			tasks = nil
			time.Sleep(200 * time.Millisecond)
		}
		res.Body.Close()
		for _, tk := range tasks {
			r := map[string]any{"taskId": tk.TaskID, "workflowInstanceId": tk.WorkflowInstanceID, "status": "COMPLETED",
				"workerId": workerID, "outputData": map[string]any{"by": workerID}}
			if tk.ReferenceTaskName == "flaky" && tk.RetryCount == 0 {
				r["status"], r["reasonForIncompletion"] = "FAILED", "first try fails"
			}
			b, _ := json.Marshal(r)
			if res, err := client.Post("http://"+proxyAddr+"/api/tasks", "application/json", bytes.NewReader(b)); err == nil {
				res.Body.Close()
			} else {
				t.Logf("report of %s: %v", tk.TaskID, err)
			}
		}
	}
}
