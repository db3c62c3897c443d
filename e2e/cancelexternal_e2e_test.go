package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_CancelRecordsAnOutsideWorkersStep: a cancel through the sidecar
// of a plan run whose external step an outside worker holds (and never
// reports: it died) records the step as Conductor ended it, CANCELED, before
// RunCancelled: the cancelled run keeps no step in flight.
func TestE2E_CancelRecordsAnOutsideWorkersStep(t *testing.T) {
	t.Parallel() // its own serve, data dir and task type
	taskType := strings.ReplaceAll(uniq("ext_cancel"), "-", "_")
	proxyAddr := sidecartest.FreeAddr(t)
	domain := uniq("e2e-cancel-ext")
	p := newProc(sidecartest.Start(t, sidecartest.Options{DataDir: t.TempDir(), Addr: sidecartest.FreeAddr(t), Name: domain,
		Args: []string{"--conductor-proxy-listen", proxyAddr}}))
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-cancel-ext")+`","planVersion":"1","steps":[
		{"stepId":"outside","timeoutSeconds":300,"executor":{"type":"external","taskType":"`+taskType+`"}}]}`)
	started := submit(t, p, pl, "req-1")
	sidecartest.WaitFor(t, "an outside worker to get the task through the proxy", 60*time.Second, func() bool {
		res, err := http.Get("http://" + proxyAddr + "/api/tasks/poll/" + taskType + "?workerid=e2e-worker&domain=" + domain)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var tk struct {
			TaskID string `json:"taskId"`
		}
		return res.StatusCode == http.StatusOK && json.NewDecoder(res.Body).Decode(&tk) == nil && tk.TaskID != ""
	})
	v, err := p.client.Cancel(t.Context(), started.RunID, "operator")
	if err != nil {
		t.Fatal(err)
	}
	evs := allEvents(t, p, started.RunID)
	if v.Status != statestore.RunStatusCancelled {
		t.Fatalf("cancel answered %s\n%v", v.Status, types(evs))
	}
	if st := v.Step("outside"); st == nil || st.Status != statestore.StepStatusFailed || st.Error == nil || st.Error.Code != "ENGINE_TASK_CANCELED" {
		t.Fatalf("outside %+v after the cancel; want FAILED ENGINE_TASK_CANCELED, as Conductor ended it\n%v", st, types(evs))
	}
	if f, c := eventIndex(evs, statestore.StepFailed, "outside", 0), eventIndex(evs, statestore.RunCancelled, "", 0); f < 0 || f > c {
		t.Fatalf("want the step's end before RunCancelled\n%v", types(evs))
	}
}
