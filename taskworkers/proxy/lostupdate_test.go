package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
)

// TestProxy_RetryAnsweredFromTheLogCarriesTheWorkersOutput: a worker's
// update is recorded but never reaches Conductor (Conductor away: the
// worker gets 502 and gives up, as conductor-python does after a minute);
// Conductor times the try out and schedules the next one, which the gate
// answers from the log instead of running the step again. The answer
// carries the output the worker reported: before, it carried none, and
// the workflow went on with nulls where the step's output was read.
func TestProxy_RetryAnsweredFromTheLogCarriesTheWorkersOutput(t *testing.T) {
	var away atomic.Bool
	e := newEnvOpts(t, envOpts{proxyConductor: func(curl string) string {
		u, err := url.Parse(curl)
		if err != nil {
			t.Fatal(err)
		}
		rp := conductortest.ReverseProxy(t, u)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if away.Load() && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/tasks") {
				w.WriteHeader(http.StatusServiceUnavailable) // Conductor's front, its server down
				return
			}
			rp.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		return srv.URL + u.Path
	}})
	_, wfID := e.startRetried(t, 2, 2)
	first := e.pollOne(t)
	away.Store(true)
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": first.TaskID, "workflowInstanceId": first.WorkflowInstanceID,
		"status": "COMPLETED", "outputData": map[string]any{"orderId": "o-42"}})
	if resp.StatusCode/100 == 2 {
		t.Fatalf("the update with Conductor away: %d %s, want an error", resp.StatusCode, body)
	}
	away.Store(false)
	e.timeOut(t, wfID, first.TaskID)
	ctx := context.Background()
	waitFor(t, "the next try to be answered from the log", time.Minute, func() bool {
		if got := e.pollBatch(t, 1); len(got) > 0 {
			t.Fatalf("the next try was handed out: %+v", got[0])
		}
		wf, err := e.client.Workflow(ctx, wfID, true)
		if err != nil {
			t.Fatal(err)
		}
		if wf.Status != "COMPLETED" {
			return false
		}
		last := wf.Tasks[len(wf.Tasks)-1]
		if last.TaskId == first.TaskID || last.OutputData["orderId"] != "o-42" {
			t.Fatalf("the next try ended %s with output %v, want the worker's (orderId o-42)", last.Status, last.OutputData)
		}
		return true
	})
}
