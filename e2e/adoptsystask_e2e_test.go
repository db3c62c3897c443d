package e2e

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_AdoptPauseWaitsForConductorsHTTPCalls: Conductor runs an HTTP
// task it scheduled whatever the workflow's pause (3.21 shows it
// SCHEDULED, with no start time, while it makes the call), so a pause of
// an adopted run drains until the call returns, even when no read of the
// adopter saw the task before: here none could (the adopter reads the run
// at its discovery, at a pause, after a resume and at its end only:
// --adopt-interval 10m), and the WAIT before the first HTTP task, in
// progress when the run was adopted, ended unseen. The second HTTP task,
// which Conductor schedules as the run resumes, is in the log while its
// call runs, and a second pause drains for it too; so is the third,
// scheduled by a resume made in Conductor itself, and a pause made in
// Conductor drains for it.
func TestE2E_AdoptPauseWaitsForConductorsHTTPCalls(t *testing.T) {
	t.Parallel() // its own serve, data dir and definition
	condURL := conductortest.URL(t)
	calls := make(chan chan struct{}, 3) // each call's gate, as it arrives
	var gates []chan struct{}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		gate := make(chan struct{})
		calls <- gate
		<-gate
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"done":true}`))
	}))
	defer srv.Close()
	defer func() {
		for _, g := range gates {
			select {
			case <-g:
			default:
				close(g)
			}
		}
	}()
	arrives := func(which string) chan struct{} {
		t.Helper()
		select {
		case g := <-calls:
			gates = append(gates, g)
			return g
		case <-time.After(90 * time.Second):
			t.Fatalf("Conductor never made %s's call", which)
			return nil
		}
	}
	httpTask := func(ref string) map[string]any {
		return map[string]any{"name": ref, "taskReferenceName": ref, "type": "HTTP", "inputParameters": map[string]any{
			"http_request": map[string]any{"uri": srv.URL + "/" + ref, "method": "GET", "connectionTimeOut": 3000, "readTimeOut": 120000}}}
	}
	name := uniq("adopt_http_pause")
	registerDef(t, condURL, name, []map[string]any{
		{"name": "hold", "taskReferenceName": "hold", "type": "WAIT", "inputParameters": map[string]any{"duration": "8 seconds"}},
		httpTask("call"), httpTask("call2"), httpTask("call3"),
	})
	runID := startWorkflow(t, condURL, name, "", map[string]any{})
	t.Cleanup(func() { // a workflow the test left running (409 once it ended)
		req, _ := http.NewRequest(http.MethodDelete, condURL+"/workflow/"+runID+"?reason=test+ended", nil)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	})
	// Started after the workflow: its discovery at start adopts it.
	p := newProc(sidecartest.Start(t, sidecartest.Options{ConductorURL: condURL, DataDir: t.TempDir(), Addr: sidecartest.FreeAddr(t),
		Args: []string{"--adopt", name, "--adopt-interval", "10m"}}))
	sidecartest.WaitFor(t, "the workflow to be adopted", 60*time.Second, func() bool {
		return eventIndex(eventsOf(t, p, runID), statestore.RunStarted, "", 0) >= 0
	})
	completed := func(ref string) bool {
		var wf struct {
			Tasks []struct{ ReferenceTaskName, Status string }
		}
		conductorJSON(t, http.MethodGet, condURL+"/workflow/"+runID+"?includeTasks=true", nil, &wf)
		for _, task := range wf.Tasks {
			if task.ReferenceTaskName == ref && task.Status == "COMPLETED" {
				return true
			}
		}
		return false
	}
	pauseDrains := func(step string) {
		t.Helper()
		v, err := p.client.Pause(t.Context(), runID, 120, "while "+step+"'s call runs")
		recordedDespiteConductor(t, "pause", err)
		if v != nil && v.Substatus != "DRAINING" {
			t.Errorf("pause answered %s/%s, want PAUSED/DRAINING: %s's call is under way", v.Status, v.Substatus, step)
		}
		time.Sleep(2 * time.Second)
		evs := allEvents(t, p, runID)
		var paused []statestore.RunEventRecord // from the last RunPaused
		for i := len(evs) - 1; i >= 0; i-- {
			if evs[i].EventType == statestore.RunPaused {
				paused = evs[i:]
				break
			}
		}
		if _, how := drainEnd(t, paused); how != "" || !slices.Contains(inFlight(t, p, runID), step) {
			t.Fatalf("drain %q, in flight %v while %s's call runs; want draining with %s in flight\n%v",
				how, inFlight(t, p, runID), step, step, stepTypes(evs))
		}
	}

	first := arrives("call")
	pauseDrains("call")
	close(first)
	sidecartest.WaitFor(t, "Conductor to complete call", 60*time.Second, func() bool { return completed("call") })
	_, err := p.client.Resume(t.Context(), runID)
	recordedDespiteConductor(t, "resume", err)

	// Conductor schedules call2 as it resumes the workflow.
	second := arrives("call2")
	sidecartest.WaitFor(t, "call2 in the log while its call runs", 20*time.Second, func() bool {
		return eventIndex(allEvents(t, p, runID), statestore.StepStarted, "call2", 0) >= 0
	})
	pauseDrains("call2")
	close(second)
	sidecartest.WaitFor(t, "Conductor to complete call2", 60*time.Second, func() bool { return completed("call2") })

	// Resumed and paused again in Conductor itself: call3, which
	// Conductor schedules as it resumes, is in the log while its call
	// runs, and the pause made in Conductor drains for it.
	conductorJSON(t, http.MethodPut, condURL+"/workflow/"+runID+"/resume", nil, nil)
	third := arrives("call3")
	sidecartest.WaitFor(t, "call3 in the log while its call runs", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, runID), statestore.StepStarted, "call3", 0) >= 0
	})
	conductorJSON(t, http.MethodPut, condURL+"/workflow/"+runID+"/pause", nil, nil)
	sidecartest.WaitFor(t, "the pause made in Conductor in the log", 30*time.Second, func() bool {
		v, err := p.client.Run(t.Context(), runID)
		return err == nil && v.Status == statestore.RunStatusPaused
	})
	time.Sleep(2 * time.Second)
	if evs := allEvents(t, p, runID); !slices.Contains(inFlight(t, p, runID), "call3") {
		t.Fatalf("in flight %v while call3's call runs, after a pause made in Conductor; want call3\n%v", inFlight(t, p, runID), stepTypes(evs))
	}
	close(third)
	sidecartest.WaitFor(t, "Conductor to complete call3", 60*time.Second, func() bool { return completed("call3") })
	_, err = p.client.Resume(t.Context(), runID)
	recordedDespiteConductor(t, "resume", err)
	if v := waitTerminal(t, p, runID, 60*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run ended %s, want COMPLETED", v.Status)
	}
	evs := allEvents(t, p, runID)
	for _, step := range []string{"call", "call2", "call3"} {
		if completedSteps(evs)[step] != 1 || count(evs, statestore.StepStarted, step) != 1 {
			t.Fatalf("%s recorded %d started, %d completed; want 1 each\n%v", step, count(evs, statestore.StepStarted, step), completedSteps(evs)[step], stepTypes(evs))
		}
	}
}

// TestE2E_AdoptCancelRecordsTheTasksEnds: a cancel through the sidecar of
// an adopted run whose HTTP task's call is under way (a task Conductor
// runs itself) records the task's end as Conductor has it after its
// terminate before RunCancelled: the ended run keeps no step in flight,
// as when the workflow is terminated in Conductor.
func TestE2E_AdoptCancelRecordsTheTasksEnds(t *testing.T) {
	t.Parallel() // its own serve, data dir and definition
	condURL := conductortest.URL(t)
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-release
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"done":true}`))
	}))
	defer srv.Close()
	defer close(release)
	name := uniq("adopt_cancel_http")
	registerDef(t, condURL, name, []map[string]any{{"name": "call", "taskReferenceName": "call", "type": "HTTP", "inputParameters": map[string]any{
		"http_request": map[string]any{"uri": srv.URL + "/call", "method": "GET", "connectionTimeOut": 3000, "readTimeOut": 120000}}}})
	p := newProc(sidecartest.Start(t, sidecartest.Options{ConductorURL: condURL, DataDir: t.TempDir(), Addr: sidecartest.FreeAddr(t),
		Args: []string{"--adopt", name, "--adopt-interval", "300ms"}}))
	runID := startWorkflow(t, condURL, name, "", map[string]any{})
	select {
	case <-arrived:
	case <-time.After(90 * time.Second):
		t.Fatal("Conductor never made the call")
	}
	sidecartest.WaitFor(t, "the call in flight in the log", 60*time.Second, func() bool {
		return eventIndex(eventsOf(t, p, runID), statestore.StepStarted, "call", 0) >= 0
	})
	v, err := p.client.Cancel(t.Context(), runID, "operator")
	if err != nil {
		t.Fatal(err)
	}
	evs := allEvents(t, p, runID)
	if v.Status != statestore.RunStatusCancelled || len(v.InFlight()) > 0 {
		t.Fatalf("cancel answered %s with %v in flight; want CANCELLED with no step in flight\n%v", v.Status, v.InFlight(), stepTypes(evs))
	}
	end, cancelled := -1, eventIndex(evs, statestore.RunCancelled, "", 0)
	for _, et := range []string{statestore.StepFailed, statestore.StepCompleted} {
		if i := eventIndex(evs, et, "call", 0); i >= 0 {
			end = i
		}
	}
	if end < 0 || end > cancelled {
		t.Fatalf("want the call's end as Conductor has it before RunCancelled\n%v", stepTypes(evs))
	}
}
