package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"

	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// plainWorkflow registers a workflow definition of one SIMPLE task of
// type e.tt and starts it straight on Conductor (not through the proxy);
// it is terminated at the end of the test.
func (e *env) plainWorkflow(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	name := "plain_" + e.tt
	def := fmt.Sprintf(`{"name":%q,"version":1,"ownerEmail":"x@y","schemaVersion":2,"tasks":[{"name":%q,"taskReferenceName":"a","type":"SIMPLE",
		"taskDefinition":{"name":%q,"ownerEmail":"x@y","responseTimeoutSeconds":30,"retryCount":0}}]}`, name, e.tt, e.tt)
	if err := e.client.RegisterWorkflowDefJSON(ctx, []byte(def)); err != nil {
		t.Fatal(err)
	}
	wfID, err := e.client.StartWorkflow(ctx, model.StartWorkflowRequest{Name: name, Version: 1, Input: map[string]any{"x": 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.client.Terminate(context.Background(), wfID, "test over") })
	return wfID
}

// refused reports whether an answer is the proxy's refusal of a route.
func refused(resp *http.Response, body []byte) bool {
	var e struct{ Code, Message string }
	_ = json.Unmarshal(body, &e)
	return resp.StatusCode == http.StatusForbidden && e.Code == "PROXY_ROUTE_NOT_FORWARDED" &&
		strings.Contains(e.Message, "--conductor-proxy-forward-all")
}

// TestProxy_RefusesWhatWorkersDoNotCall: through the proxy, Conductor's
// workflow and admin calls (resume, terminate, config, task search) are
// refused 403 PROXY_ROUTE_NOT_FORWARDED and change nothing in Conductor,
// also when a task route's path leads elsewhere ("..", ";"); the calls
// workers make (task and task definition reads, task logs, health, polls,
// updates) still reach Conductor.
func TestProxy_RefusesWhatWorkersDoNotCall(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	wfID := e.plainWorkflow(t)
	if err := e.client.Pause(ctx, wfID); err != nil {
		t.Fatal(err)
	}
	origin := strings.TrimSuffix(e.url, "/api")
	for _, c := range []struct{ method, path string }{
		{http.MethodPut, "/api/workflow/" + wfID + "/resume"},
		{http.MethodDelete, "/api/workflow/" + wfID + "?reason=via-proxy"},
		{http.MethodPost, "/api/workflow/" + wfID + "/terminate"},
		{http.MethodGet, "/api/workflow/" + wfID},
		{http.MethodGet, "/admin/config"},
		{http.MethodGet, "/api/admin/config"},
		{http.MethodGet, "/api/tasks/search"},
		{http.MethodGet, "/api/tasks/queue/all"},
		{http.MethodDelete, "/api/metadata/taskdefs/" + e.tt},
		{http.MethodPut, "/api/tasks/../workflow/" + wfID + "/resume"},
		{http.MethodPut, "/api/tasks/x/..;/../workflow/" + wfID + "/resume"},
		// The shape of an update by reference, resolved by Conductor to
		// POST /workflow/{name}: a start.
		{http.MethodPost, "/api/tasks/../workflow/COMPLETED"},
		{http.MethodPost, "/api/tasks/./x/y/COMPLETED"},
		{http.MethodPost, "/api/tasks/queue/requeue/COMPLETED"},
	} {
		resp, body := call(t, c.method, origin+c.path, nil)
		if !refused(resp, body) {
			t.Errorf("%s %s through the proxy: %d %.200s, want 403 PROXY_ROUTE_NOT_FORWARDED naming --conductor-proxy-forward-all", c.method, c.path, resp.StatusCode, body)
		}
	}
	wf, err := e.client.Workflow(ctx, wfID, false)
	if err != nil {
		t.Fatal(err)
	}
	if wf.Status != "PAUSED" {
		t.Fatalf("Conductor's workflow is %s after the refused calls, want still PAUSED", wf.Status)
	}

	// The workers' calls.
	if err := e.client.Resume(ctx, wfID); err != nil {
		t.Fatal(err)
	}
	var got []task
	waitFor(t, "the plain task", 2*time.Minute, func() bool {
		q := url.Values{"workerid": {"w"}, "count": {"1"}, "timeout": {"100"}}
		resp, body := call(t, http.MethodGet, e.url+"/tasks/poll/batch/"+e.tt+"?"+q.Encode(), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("poll: %d %s", resp.StatusCode, body)
		}
		_ = json.Unmarshal(body, &got)
		return len(got) > 0
	})
	tk := got[0].TaskID
	for _, c := range []struct {
		method, path string
		body         any
		want         int // 0: any answer of Conductor's
	}{
		{http.MethodGet, "/health", nil, http.StatusOK},
		{http.MethodGet, "/api/metadata/taskdefs", nil, http.StatusOK},
		{http.MethodPost, "/api/metadata/taskdefs", []map[string]any{{"name": e.tt, "ownerEmail": "x@y", "responseTimeoutSeconds": 30}}, http.StatusOK},
		{http.MethodPut, "/api/metadata/taskdefs", map[string]any{"name": e.tt, "ownerEmail": "x@y", "responseTimeoutSeconds": 30, "retryCount": 0}, http.StatusOK},
		{http.MethodGet, "/api/metadata/taskdefs/" + e.tt, nil, http.StatusOK},
		{http.MethodGet, "/api/tasks/" + tk, nil, http.StatusOK},
		{http.MethodPost, "/api/tasks/" + tk + "/log", "a line of the worker's", http.StatusOK},
		{http.MethodGet, "/api/tasks/" + tk + "/log", nil, http.StatusOK},
		{http.MethodGet, "/api/tasks/externalstoragelocation?path=x&operation=READ&payloadType=TASK_INPUT", nil, 0},
	} {
		resp, body := call(t, c.method, origin+c.path, c.body)
		if refused(resp, body) || c.want != 0 && resp.StatusCode != c.want {
			t.Errorf("%s %s through the proxy: %d %.200s, want Conductor's answer (%d)", c.method, c.path, resp.StatusCode, body, c.want)
		}
	}
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": tk, "workflowInstanceId": wfID, "status": "COMPLETED"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("update: %d %s", resp.StatusCode, body)
	}
	waitFor(t, "the plain workflow to complete", 2*time.Minute, func() bool {
		wf, err := e.client.Workflow(ctx, wfID, false)
		return err == nil && wf.Status == "COMPLETED"
	})
}

// TestProxy_ForwardAll: with Options.ForwardAll the proxy forwards
// Conductor's whole API, a workflow's pause included.
func TestProxy_ForwardAll(t *testing.T) {
	e := newEnvOpts(t, envOpts{proxy: func(o *proxy.Options) { o.ForwardAll = true }})
	wfID := e.plainWorkflow(t)
	resp, body := call(t, http.MethodPut, e.url+"/workflow/"+wfID+"/pause", nil)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("pause through the proxy with ForwardAll: %d %.200s, want Conductor's 2xx", resp.StatusCode, body)
	}
	wf, err := e.client.Workflow(context.Background(), wfID, false)
	if err != nil || wf.Status != "PAUSED" {
		t.Fatalf("Conductor's workflow after a pause through the proxy with ForwardAll: %v %v, want PAUSED", wf, err)
	}
}
