package proxy_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// TestProxy_TheSidecarsOwnTasksAreNotForOutsideWorkers: a task of a step
// the sidecar executes itself (sidecar_noop here; command, http and sleep
// alike) is neither handed to a worker polling through the proxy nor
// completed or failed by one: its start and its outcome are the
// sidecar's workers' to record, and a worker that took one would run a
// step the log shows nobody running (a pause would drain at once) and end
// it with nothing recorded. Polls of those types and updates of such a
// task are refused (403 PROXY_TASK_RESERVED) and sent nowhere.
func TestProxy_TheSidecarsOwnTasksAreNotForOutsideWorkers(t *testing.T) {
	e := newEnv(t)
	c, err := plan.Compile(&plan.Plan{PlanID: "proxy-own-" + uuid.NewString()[:8], PlanVersion: "1",
		Steps: []plan.Step{{StepID: "own", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}}})
	if err != nil {
		t.Fatal(err)
	}
	started, err := e.runs.StartRun(context.Background(), adapter.StartRequest{TenantID: "t", ProjectID: "p", EnvironmentID: "e",
		RunRequestID: uuid.NewString(), Plan: c})
	if err != nil {
		t.Fatal(err)
	}
	runID, wfID := started.Run.RunID, started.Run.WorkflowID
	refused := func(what string, resp *http.Response, body []byte) {
		t.Helper()
		var got struct{ Code string }
		_ = json.Unmarshal(body, &got)
		if resp.StatusCode != http.StatusForbidden || got.Code != proxy.CodeTaskReserved {
			t.Fatalf("%s through the proxy: HTTP %d %s, want 403 %s", what, resp.StatusCode, body, proxy.CodeTaskReserved)
		}
	}
	q := url.Values{"workerid": {"outside"}, "count": {"1"}, "timeout": {"100"}, "domain": {e.domain}}
	for _, tt := range plan.TaskTypes {
		resp, body := call(t, http.MethodGet, e.url+"/tasks/poll/batch/"+tt+"?"+q.Encode(), nil)
		refused("batch poll of "+tt, resp, body)
		resp, body = call(t, http.MethodGet, e.url+"/tasks/poll/"+tt+"?"+q.Encode(), nil)
		refused("poll of "+tt, resp, body)
	}
	// The task stayed queued: the sidecar's worker (here, Conductor
	// polled directly) takes it.
	var polled []task
	base := strings.TrimSuffix(e.client.BaseURL(), "/")
	waitFor(t, "the noop task, polled from Conductor", 10*time.Second, func() bool {
		_, b := call(t, http.MethodGet, base+"/tasks/poll/batch/"+plan.TaskTypeNoop+"?"+q.Encode(), nil)
		_ = json.Unmarshal(b, &polled)
		return len(polled) > 0
	})
	tk := polled[0]
	if tk.WorkflowInstanceID != wfID {
		t.Fatalf("polled a task of workflow %s, want %s", tk.WorkflowInstanceID, wfID)
	}
	result := map[string]any{"taskId": tk.TaskID, "workflowInstanceId": wfID, "status": "COMPLETED", "outputData": map[string]any{"from": "outside"}}
	resp, body := call(t, http.MethodPost, e.url+"/tasks", result)
	refused("update", resp, body)
	resp, body = call(t, http.MethodPost, e.url+"/tasks/update-v2", result)
	refused("update-v2", resp, body)
	_, b := call(t, http.MethodGet, base+"/tasks/"+tk.TaskID, nil)
	var ref struct{ ReferenceTaskName string }
	if err := json.Unmarshal(b, &ref); err != nil || ref.ReferenceTaskName == "" {
		t.Fatalf("the task's reference name: %s (%v)", b, err)
	}
	resp, body = call(t, http.MethodPost, e.url+"/tasks/"+wfID+"/"+ref.ReferenceTaskName+"/COMPLETED", map[string]any{"from": "outside"})
	refused("update by reference name", resp, body)
	// A body the proxy does not read as a task result names the task too.
	resp, body = call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": tk.TaskID, "workflowInstanceId": wfID, "status": "COMPLETED", "outputData": "not an object"})
	refused("update with an odd body", resp, body)

	_, b = call(t, http.MethodGet, base+"/tasks/"+tk.TaskID, nil)
	var now task
	if err := json.Unmarshal(b, &now); err != nil || now.Status != "IN_PROGRESS" {
		t.Fatalf("the task in Conductor after the refused updates: %s (%v), want IN_PROGRESS", b, err)
	}
	if n := count(e.events(t, runID), statestore.StepCompleted); n != 0 {
		t.Fatalf("%d StepCompleted in the log after refused updates", n)
	}
}
