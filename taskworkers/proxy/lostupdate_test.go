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
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
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
	e := newEnvOpts(t, envOpts{proxyConductor: awayFront(t, &away)})
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
	answeredFromTheLog(t, e, wfID, first.TaskID, "o-42")
}

// TestProxy_AnOutputKeptBeforeARestartReachesTheNextTry: the serve that
// recorded the worker's update restarts while Conductor is away, and the
// worker has given up its update. Once Conductor is back and has timed
// the try out, the next try, which the gate answers from the log, carries
// the worker's output, read from the keep: before, the output lived in the
// dead process's memory only, and the try completed with an empty output.
func TestProxy_AnOutputKeptBeforeARestartReachesTheNextTry(t *testing.T) {
	var away atomic.Bool
	e := newEnvOpts(t, envOpts{proxyConductor: awayFront(t, &away)})
	_, wfID := e.startRetried(t, 2, 2)
	first := e.pollOne(t)
	away.Store(true)
	update := map[string]any{"taskId": first.TaskID, "workflowInstanceId": first.WorkflowInstanceID,
		"status": "COMPLETED", "outputData": map[string]any{"orderId": "o-44"}}
	if resp, body := call(t, http.MethodPost, e.url+"/tasks", update); resp.StatusCode/100 == 2 {
		t.Fatalf("the update with Conductor away: %d %s, want an error", resp.StatusCode, body)
	}
	e = newEnvOpts(t, envOpts{shareLogOf: e}) // serve starts again, Conductor back
	away.Store(false)
	e.timeOut(t, wfID, first.TaskID)
	answeredFromTheLog(t, e, wfID, first.TaskID, "o-44")
}

// TestProxy_AWorkersRetryAfterARestartKeepsItsOutput: the serve that
// recorded the worker's update restarts while Conductor is away, and had
// no keep to put the output in (it was full or away): the output it kept
// in memory is gone. The worker keeps retrying its update,
// and once Conductor is back and has timed the try out, its retry is
// refused (409 PROXY_TRY_TIMED_OUT), as documented, but the output it
// carries is kept for the next try, which the gate answers from the log:
// before, that try completed with an empty output.
func TestProxy_AWorkersRetryAfterARestartKeepsItsOutput(t *testing.T) {
	var away atomic.Bool
	e := newEnvOpts(t, envOpts{proxyConductor: awayFront(t, &away), noOutputKeep: true})
	_, wfID := e.startRetried(t, 2, 2)
	first := e.pollOne(t)
	away.Store(true)
	update := map[string]any{"taskId": first.TaskID, "workflowInstanceId": first.WorkflowInstanceID,
		"status": "COMPLETED", "outputData": map[string]any{"orderId": "o-43"}}
	if resp, body := call(t, http.MethodPost, e.url+"/tasks", update); resp.StatusCode/100 == 2 {
		t.Fatalf("the update with Conductor away: %d %s, want an error", resp.StatusCode, body)
	}
	e = newEnvOpts(t, envOpts{shareLogOf: e, noOutputKeep: true}) // serve starts again, Conductor back
	away.Store(false)
	e.timeOut(t, wfID, first.TaskID)
	resp, body := call(t, http.MethodPost, e.url+"/tasks", update) // the worker's retry
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), proxy.CodeTryTimedOut) {
		t.Fatalf("the worker's retry after Conductor timed the try out: %d %s, want 409 %s", resp.StatusCode, body, proxy.CodeTryTimedOut)
	}
	answeredFromTheLog(t, e, wfID, first.TaskID, "o-43")
}

// awayFront is a front before Conductor that answers the workers' updates
// 503 while away is set, as Conductor's front does with its server down.
func awayFront(t *testing.T, away *atomic.Bool) func(string) string {
	return func(curl string) string {
		u, err := url.Parse(curl)
		if err != nil {
			t.Fatal(err)
		}
		rp := conductortest.ReverseProxy(t, u)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if away.Load() && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/tasks") {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			rp.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		return srv.URL + u.Path
	}
}

// answeredFromTheLog waits until the workflow completed with its last try
// (not first) answered from the log, never handed out, with orderId in
// its output.
func answeredFromTheLog(t *testing.T, e *env, wfID, first, orderID string) {
	t.Helper()
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
		if last.TaskId == first || last.OutputData["orderId"] != orderID {
			t.Fatalf("the next try ended %s with output %v, want the worker's (orderId %s)", last.Status, last.OutputData, orderID)
		}
		return true
	})
}
