package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// conductorCall sends an empty-bodied request to Conductor's own REST API,
// as an operator's script or Conductor's UI would, and fails on an error
// status.
func conductorCall(t *testing.T, method, path, body string) {
	t.Helper()
	if code, out := conductorTry(t, method, path, body); code >= 300 {
		t.Fatalf("%s %s: %d %s", method, path, code, out)
	}
}

// conductorTry is conductorCall that returns the status and body.
func conductorTry(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, conductortest.URL(t)+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

func metricLine(t *testing.T, p *proc, prefix string) string {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestE2E_ConductorRestartOfAnEndedRunIsRefused: a workflow whose run the
// log already ended is restarted, or retried, in Conductor.
// A run ends once: the sidecar refuses the tasks Conductor makes for it
// (the workflow fails in Conductor with RUN_<status>), the log does not
// change, and the refusal is logged and counted.
func TestE2E_ConductorRestartOfAnEndedRunIsRefused(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	type endedRun struct {
		runID, workflowID string
		events            int
	}
	ended := func(id, js string) endedRun {
		started := submit(t, p, mustPlan(t, js), "req-"+id)
		waitTerminal(t, p, started.RunID, 60*time.Second)
		return endedRun{started.RunID, started.WorkflowID, len(allEvents(t, p, started.RunID))}
	}
	completed := uniq("e2e-restart")
	done := ended("done", `{"planId":"`+completed+`","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`)
	// Conductor itself refuses to restart it: the compiled workflow is
	// not restartable (plan.Compile). A rerun it accepts.
	if code, out := conductorTry(t, http.MethodPost, "/workflow/"+done.workflowID+"/restart", "{}"); code < 400 || !strings.Contains(out, "non-restartable") {
		t.Fatalf("restart of a completed workflow: %d %s, want Conductor's refusal", code, out)
	}
	refused := func(n string) func() bool {
		return func() bool {
			return strings.HasSuffix(metricLine(t, p, `sidecar_worker_tasks_handed_back_total{reason="run_ended"}`), " "+n)
		}
	}
	conductorCall(t, http.MethodPost, "/workflow/"+done.workflowID+"/rerun", `{"reRunFromWorkflowId":"`+done.workflowID+`"}`)
	sidecartest.WaitFor(t, "the rerun's task to be refused", 60*time.Second, refused("1"))
	sidecartest.WaitFor(t, "the rerun workflow to fail", 60*time.Second, func() bool { return conductorStatus(t, done.workflowID) == "FAILED" })

	failing := uniq("e2e-retry")
	failed := ended("failed", `{"planId":"`+failing+`","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"command","argv":["false"]}}]}`)
	conductorCall(t, http.MethodPost, "/workflow/"+failed.workflowID+"/retry", "")
	sidecartest.WaitFor(t, "the retry's task to be refused", 60*time.Second, refused("2"))
	sidecartest.WaitFor(t, "the retried workflow to fail again", 60*time.Second, func() bool { return conductorStatus(t, failed.workflowID) == "FAILED" })

	for _, r := range []endedRun{done, failed} {
		if got := len(allEvents(t, p, r.runID)); got != r.events {
			t.Fatalf("run %s (workflow %s) has %d events after Conductor's action, had %d: the log of an ended run changed", r.runID, r.workflowID, got, r.events)
		}
		v, err := p.client.Run(t.Context(), r.runID)
		if err != nil {
			t.Fatal(err)
		}
		if v.Status != statestore.RunStatusCompleted && v.Status != statestore.RunStatusFailed {
			t.Fatalf("run %s is %s", r.runID, v.Status)
		}
	}
	// The restart of the failed run, too.
	conductorCall(t, http.MethodPost, "/workflow/"+failed.workflowID+"/restart", "")
	sidecartest.WaitFor(t, "the restart's task to be refused", 60*time.Second, refused("3"))
	sidecartest.WaitFor(t, "the restarted workflow to fail", 60*time.Second, func() bool { return conductorStatus(t, failed.workflowID) == "FAILED" })
	if got := len(allEvents(t, p, failed.runID)); got != failed.events {
		t.Fatalf("run %s has %d events after a restart in Conductor, had %d", failed.runID, got, failed.events)
	}
	if l := metricLine(t, p, `sidecar_worker_tasks_handed_back_total{reason="run_ended"}`); !strings.HasSuffix(l, " 3") {
		t.Fatalf("refusals counted: %q, want 3 (rerun, retry, restart)", l)
	}
}
