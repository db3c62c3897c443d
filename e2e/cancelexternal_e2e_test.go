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

// TestE2E_CancelKeepsAnInterruptedStepsOwnEnd: a cancel interrupts the
// run's command step running on this sidecar; the step's own end, with
// the output it wrote before the interrupt (its artifacts), is what the
// log records, not the cancel's read of Conductor's CANCELED task.
func TestE2E_CancelKeepsAnInterruptedStepsOwnEnd(t *testing.T) {
	t.Parallel() // its own serve and data dir
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-cancel-own")+`","planVersion":"1","steps":[
		{"stepId":"work","executor":{"type":"command","argv":["sh","-c","echo partial; sleep 30"]}}]}`)
	const runs = 3
	ids := make([]string, runs)
	for i := range ids {
		ids[i] = submit(t, p, pl, uniq("req")).RunID
	}
	for _, id := range ids {
		sidecartest.WaitFor(t, "the step to start", 60*time.Second, func() bool {
			return eventIndex(allEvents(t, p, id), statestore.StepStarted, "work", 0) >= 0
		})
	}
	time.Sleep(time.Second) // "partial" is written
	for _, id := range ids {
		if _, err := p.client.Cancel(t.Context(), id, "operator"); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		var evs []statestore.RunEventRecord
		sidecartest.WaitFor(t, "the step's end", 30*time.Second, func() bool {
			evs = allEvents(t, p, id)
			return eventIndex(evs, statestore.StepFailed, "work", 0) >= 0
		})
		f := evs[eventIndex(evs, statestore.StepFailed, "work", 0)]
		var payload statestore.StepFailedPayload
		if err := json.Unmarshal(f.Payload, &payload); err != nil {
			t.Fatal(err)
		}
		if payload.Error == nil || payload.Error.Code != "STEP_INTERRUPTED" || len(payload.Artifacts) == 0 {
			t.Errorf("run %s: StepFailed %s; want the step's own STEP_INTERRUPTED with its output (artifacts)", id, f.Payload)
		}
	}
}
