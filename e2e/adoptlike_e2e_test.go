package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Adopted runs get what plan runs get: the drain ETA, the audit, the event
// bus, admission's count, the metrics, a pause made in Conductor, a kill
// of the sidecar with their tasks in flight.

// TestE2E_AdoptedRunLikeAPlanRun: four workflows of an adopted definition
// (a SIMPLE task of 5 s, worked by the Python SDK's worker through the
// proxy, then a quick one), under --max-active-runs 1 and a webhook sink.
// The first three start together in Conductor and all run (admission
// never queues a start it does not make) and give the step its history.
// The fourth, paused while its step runs, drains with an estimate (run
// view and run list), is counted by the metrics, holds admission's one
// slot (a plan run submitted meanwhile is QUEUED and starts once the
// adopted run ends), is audited (pause, drain completed, resume), and
// every event of its log reaches the webhook in the log's order.
func TestE2E_AdoptedRunLikeAPlanRun(t *testing.T) {
	t.Parallel() // its own serve and data dir
	w := sdkWorkerFor(t, "python")
	condURL := conductortest.URL(t)
	consumer := &webhookConsumer{t: t, secret: []byte("e2e-adopt-bus-secret-0123456789")}
	hook := httptest.NewServer(consumer)
	t.Cleanup(hook.Close)
	secretFile := filepath.Join(t.TempDir(), "hook.key")
	if err := os.WriteFile(secretFile, consumer.secret, 0o600); err != nil {
		t.Fatal(err)
	}
	taskType := uniq("adopt_like")
	name := uniq("adopt_like")
	registerDef(t, condURL, name, []map[string]any{simpleTask("work", taskType, 5000), simpleTask("after", taskType, 0)})
	proxyAddr := sidecartest.FreeAddr(t)
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--conductor-proxy-listen", proxyAddr, "--adopt", name,
		"--adopt-interval", "300ms", "--max-active-runs", "1", "--admission-policy", "queue",
		"--bus-sink", "webhook:name=audit,url="+hook.URL+",secret-file="+secretFile)
	w.start(t, "http://"+proxyAddr+"/api", taskType, "", 4)

	// History: three at once, none held back by the limit of 1.
	var history []string
	for range 3 {
		history = append(history, startWorkflow(t, condURL, name, "", map[string]any{}))
	}
	for _, id := range history {
		if v := waitTerminal(t, p, id, 120*time.Second); v.Status != statestore.RunStatusCompleted {
			t.Fatalf("adopted run %s: %s, want COMPLETED\n%v", id, v.Status, stepTypes(allEvents(t, p, id)))
		}
	}

	runID := startWorkflow(t, condURL, name, "", map[string]any{})
	sidecartest.WaitFor(t, "work to start", 90*time.Second, func() bool {
		return eventIndex(eventsOf(t, p, runID), statestore.StepStarted, "work", 0) >= 0
	})
	if _, err := p.client.Pause(t.Context(), runID, 120, "adopted like a plan run"); err != nil {
		t.Fatal(err)
	}
	v, err := p.client.Run(t.Context(), runID)
	if err != nil {
		t.Fatal(err)
	}
	draining := v.Drain != nil && slices.Equal(v.Drain.InFlightStepIDs, []string{"work"})
	if draining {
		// The estimate rests on the three earlier runs' durations of work.
		if e := v.DrainETA; e == nil || e.P50 == "" || len(e.Unknown) > 0 || e.Samples < 1 {
			t.Fatalf("drain ETA of the adopted run: %+v, want an estimate from the 3 earlier runs", e)
		}
		// The drain monitor sets the gauge on its next pass.
		sidecartest.WaitFor(t, "the drain gauge to count the adopted run, or its drain to end", 120*time.Second, func() bool {
			_, how := drainEnd(t, allEvents(t, p, runID))
			return how != "" || metricValue(t, p.addr, "sidecar_drain_runs_draining") >= 1
		})
		if g := metricValue(t, p.addr, "sidecar_drain_inflight_steps"); g < 1 {
			t.Fatalf("sidecar_drain_runs_draining %v, sidecar_drain_inflight_steps %v while the adopted run drains", metricValue(t, p.addr, "sidecar_drain_runs_draining"), g)
		}
		l, err := listAll(t.Context(), p.client, url.Values{"planId": {name}, "substatus": {"DRAINING"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Runs) == 1 && (l.Runs[0].DrainETA == nil || l.Runs[0].DrainETA.P50 == "") {
			t.Fatalf("the run list's row of the draining adopted run has no estimate: %+v", l.Runs[0])
		}
	} else {
		t.Logf("work ended before the pause's first read (%+v): the estimate was not checked", v.Drain)
	}
	sidecartest.WaitFor(t, "the drain to complete", 120*time.Second, func() bool {
		_, how := drainEnd(t, allEvents(t, p, runID))
		return how == statestore.RunDrainCompleted
	})
	// The drain monitor's full pass (every 30 s) counts the runs by status.
	sidecartest.WaitFor(t, `sidecar_runs_active{status="PAUSED"} to count the adopted run`, 180*time.Second, func() bool {
		return metricValue(t, p.addr, `sidecar_runs_active{status="PAUSED"}`) == 1
	})

	// Admission: the paused adopted run holds the one slot.
	pl := &plan.Plan{PlanID: uniq("e2e-adopt-admission"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}}}
	queued := submit(t, p, pl, uniq("req"))
	if queued.Status != statestore.RunStatusQueued {
		t.Fatalf("a plan run submitted while the adopted run is paused under --max-active-runs 1: %+v, want QUEUED", queued)
	}
	if _, err := p.client.Resume(t.Context(), runID); err != nil {
		t.Fatal(err)
	}
	if v := waitTerminal(t, p, runID, 120*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("adopted run %s after resume, want COMPLETED", v.Status)
	}
	if v := waitTerminal(t, p, queued.RunID, 120*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("queued plan run %s, want COMPLETED once the adopted run ended", v.Status)
	}
	evs := allEvents(t, p, runID)
	validLog(t, evs)
	qevs := allEvents(t, p, queued.RunID)
	started := eventIndex(qevs, statestore.RunStarted, "", 0)
	if started < 0 || parseTime(t, qevs[started].PersistedAt).Before(parseTime(t, evs[len(evs)-1].PersistedAt)) {
		t.Fatalf("the queued plan run started (%v) before the adopted run ended at %s", types(qevs), evs[len(evs)-1].PersistedAt)
	}

	// Audit.
	code, out, errOut := sidecartest.Run(t, "audit", runID, "--server", "http://"+p.addr, "-o", "json")
	var entries []auditEntry
	if code != 0 || json.Unmarshal([]byte(out), &entries) != nil {
		t.Fatalf("audit of the adopted run: exit %d: %s%s", code, out, errOut)
	}
	var actions []string
	for _, e := range entries {
		actions = append(actions, e.Action)
	}
	if strings.Join(actions, ",") != "pause,drain completed,resume" || entries[0].Reason != "adopted like a plan run" {
		t.Fatalf("audit of the adopted run: %+v, want pause, drain completed, resume", entries)
	}

	// Event bus: every event of the log, first delivered in its order.
	sidecartest.WaitFor(t, "the webhook to get the adopted run's events", 60*time.Second, func() bool {
		got := map[string]bool{}
		for _, id := range consumer.ids() {
			got[id] = true
		}
		for _, e := range evs {
			if !got[e.EventID] {
				return false
			}
		}
		return true
	})
	first := map[string]int{}
	for i, id := range consumer.ids() {
		if _, ok := first[id]; !ok {
			first[id] = i
		}
	}
	for i := 1; i < len(evs); i++ {
		if first[evs[i].EventID] < first[evs[i-1].EventID] {
			t.Fatalf("the webhook got %s before %s of the adopted run", evs[i].EventType, evs[i-1].EventType)
		}
	}
	if consumer.bad != 0 {
		t.Fatalf("%d webhook requests with a bad signature", consumer.bad)
	}

	// Metrics: the proxy admitted the adopted runs' tasks, the drain ended drained.
	if n := metricValue(t, p.addr, `sidecar_proxy_external_tasks_total{outcome="admitted"}`); n < 8 {
		t.Fatalf(`sidecar_proxy_external_tasks_total{outcome="admitted"} %v, want the 8 tasks of the 4 adopted runs`, n)
	}
	if n := metricValue(t, p.addr, `sidecar_drain_duration_seconds_count{outcome="drained"}`); n != 1 {
		t.Fatalf(`sidecar_drain_duration_seconds_count{outcome="drained"} %v, want 1`, n)
	}
}

// TestE2E_AdoptPauseInConductor: an adopted workflow paused with
// Conductor's own API (PUT /workflow/{id}/pause) while one of its two
// forked SIMPLE tasks runs (the worker takes one task at a time, the other
// waits SCHEDULED, pollable in Conductor): the log records the pause
// (requestedBy conductor), the drain completes once the running task
// ends, the proxy hands the other task to nobody while the workflow is
// paused; resumed in Conductor, the log records it and the workflow
// completes with a valid log.
func TestE2E_AdoptPauseInConductor(t *testing.T) {
	t.Parallel() // its own serve and data dir
	w := sdkWorkerFor(t, "python")
	condURL := conductortest.URL(t)
	taskType := uniq("adopt_cpause")
	name := uniq("adopt_cpause")
	registerDef(t, condURL, name, []map[string]any{
		{"name": "fan", "taskReferenceName": "fan", "type": "FORK_JOIN", "forkTasks": [][]map[string]any{
			{simpleTask("one", taskType, 5000)}, {simpleTask("two", taskType, 5000)}}},
		{"name": "gather", "taskReferenceName": "gather", "type": "JOIN", "joinOn": []string{"one", "two"}},
	})
	proxyAddr := sidecartest.FreeAddr(t)
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--conductor-proxy-listen", proxyAddr, "--adopt", name, "--adopt-interval", "300ms")
	runID := startWorkflow(t, condURL, name, "", map[string]any{})
	w.start(t, "http://"+proxyAddr+"/api", taskType, "", 1)
	var first string
	sidecartest.WaitFor(t, "one of the forked tasks to start", 90*time.Second, func() bool {
		evs := eventsOf(t, p, runID)
		for _, id := range []string{"one", "two"} {
			if eventIndex(evs, statestore.StepStarted, id, 0) >= 0 {
				first = id
				return true
			}
		}
		return false
	})
	conductorCall(t, http.MethodPut, "/workflow/"+runID+"/pause", "")
	sidecartest.WaitFor(t, "the drain to complete", 120*time.Second, func() bool {
		_, how := drainEnd(t, allEvents(t, p, runID))
		return how == statestore.RunDrainCompleted
	})
	evs := allEvents(t, p, runID)
	paused := eventIndex(evs, statestore.RunPaused, "", 0)
	if !strings.Contains(string(evs[paused].Payload), `"requestedBy":"conductor"`) {
		t.Fatalf("RunPaused %s, want requestedBy conductor", evs[paused].Payload)
	}
	// The worker polls on through the proxy; the other task waits.
	time.Sleep(4 * time.Second)
	evs = allEvents(t, p, runID)
	for _, e := range evs {
		if e.EventType == statestore.StepStarted && e.StepID != first && e.StepID != "fan" {
			t.Fatalf("step %s started while the workflow was paused in Conductor\n%v", e.StepID, stepTypes(evs))
		}
	}
	conductorCall(t, http.MethodPut, "/workflow/"+runID+"/resume", "")
	if v := waitTerminal(t, p, runID, 120*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s after the resume in Conductor, want COMPLETED\n%v", v.Status, stepTypes(allEvents(t, p, runID)))
	}
	evs = allEvents(t, p, runID)
	t.Logf("log: %v", stepTypes(evs))
	validLog(t, evs)
	resumed := eventIndex(evs, statestore.RunResumed, "", 0)
	if resumed < 0 || !strings.Contains(string(evs[resumed].Payload), `"requestedBy":"conductor"`) {
		t.Fatalf("no RunResumed by conductor\n%v", stepTypes(evs))
	}
	other := map[string]string{"one": "two", "two": "one"}[first]
	if i := eventIndex(evs, statestore.StepStarted, other, 0); i < resumed {
		t.Fatalf("%s started at %d, before RunResumed at %d\n%v", other, i, resumed, stepTypes(evs))
	}
	if done := completedSteps(evs); done["one"] != 1 || done["two"] != 1 || done["gather"] != 1 {
		t.Fatalf("completed steps %v", done)
	}
}

// TestE2E_AdoptKillSidecarWithTasksInFlight: the sidecar is killed (-9)
// while the Python SDK's worker runs the four forked SIMPLE tasks of an
// adopted workflow through the proxy; restarted on the same log and
// addresses, it takes the worker's reports, and the run completes with a
// valid log, each task started and completed once.
func TestE2E_AdoptKillSidecarWithTasksInFlight(t *testing.T) {
	t.Parallel() // its own serve and data dir
	w := sdkWorkerFor(t, "python")
	condURL := conductortest.URL(t)
	taskType := uniq("adopt_kills")
	name := uniq("adopt_kills")
	ids := []string{"w0", "w1", "w2", "w3"}
	var branches [][]map[string]any
	for _, id := range ids {
		branches = append(branches, []map[string]any{simpleTask(id, taskType, 6000)})
	}
	registerDef(t, condURL, name, []map[string]any{
		{"name": "fan", "taskReferenceName": "fan", "type": "FORK_JOIN", "forkTasks": branches},
		{"name": "gather", "taskReferenceName": "gather", "type": "JOIN", "joinOn": ids},
		simpleTask("after", taskType, 0),
	})
	dataDir, addr, proxyAddr := t.TempDir(), sidecartest.FreeAddr(t), sidecartest.FreeAddr(t)
	flags := []string{"--conductor-proxy-listen", proxyAddr, "--adopt", name, "--adopt-interval", "300ms"}
	p := startServe(t, dataDir, addr, flags...)
	w.start(t, "http://"+proxyAddr+"/api", taskType, "", 4)
	runID := startWorkflow(t, condURL, name, "", map[string]any{})
	sidecartest.WaitFor(t, "the 4 forked tasks to start", 90*time.Second, func() bool {
		evs := eventsOf(t, p, runID)
		for _, id := range ids {
			if eventIndex(evs, statestore.StepStarted, id, 0) < 0 {
				return false
			}
		}
		return true
	})
	p.stop(syscall.SIGKILL)
	p = startServe(t, dataDir, addr, flags...)
	if v := waitTerminal(t, p, runID, 180*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("adopted run %s after the restart, want COMPLETED\n%v", v.Status, stepTypes(allEvents(t, p, runID)))
	}
	evs := allEvents(t, p, runID)
	t.Logf("log: %v", stepTypes(evs))
	validLog(t, evs)
	for _, id := range append(ids, "fan", "gather", "after") {
		if s, c := count(evs, statestore.StepStarted, id), count(evs, statestore.StepCompleted, id); s != 1 || c != 1 {
			t.Fatalf("step %s: %d StepStarted, %d StepCompleted, want 1 and 1\n%v", id, s, c, stepTypes(evs))
		}
	}
}

// TestE2E_AdoptPausedInConductorBeforeItsFirstPoll: a workflow paused in
// Conductor while its SIMPLE task waits SCHEDULED (pollable: Conductor's
// pause does not withdraw it), before any worker polled it. The worker's
// first poll through the proxy adopts the workflow: the adoption finds it
// PAUSED, so the log records the pause (requestedBy conductor) before the
// gate decides, and the task is handed back, not started. Resumed in
// Conductor, the task starts and the run completes.
func TestE2E_AdoptPausedInConductorBeforeItsFirstPoll(t *testing.T) {
	t.Parallel() // its own serve and data dir
	w := sdkWorkerFor(t, "python")
	condURL := conductortest.URL(t)
	taskType := uniq("adopt_prepaused")
	name := uniq("adopt_prepaused")
	registerDef(t, condURL, name, []map[string]any{simpleTask("work", taskType, 0)})
	proxyAddr := sidecartest.FreeAddr(t)
	// A long --adopt-interval: the workflow is adopted by the worker's
	// poll, not by a read of the running list.
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--conductor-proxy-listen", proxyAddr, "--adopt", name, "--adopt-interval", "1m")
	runID := startWorkflow(t, condURL, name, "", map[string]any{})
	conductorCall(t, http.MethodPut, "/workflow/"+runID+"/pause", "")
	w.start(t, "http://"+proxyAddr+"/api", taskType, "", 1)
	sidecartest.WaitFor(t, "the workflow to be adopted and its pause recorded", 90*time.Second, func() bool {
		return eventIndex(eventsOf(t, p, runID), statestore.RunPaused, "", 0) >= 0
	})
	evs := allEvents(t, p, runID)
	paused := eventIndex(evs, statestore.RunPaused, "", 0)
	if s := eventIndex(evs, statestore.StepStarted, "work", 0); s >= 0 && s < paused {
		t.Fatalf("work started (log index %d) in a workflow paused in Conductor, before the log had its pause (index %d)\n%v", s, paused, stepTypes(evs))
	}
	if !strings.Contains(string(evs[paused].Payload), `"requestedBy":"conductor"`) {
		t.Fatalf("RunPaused %s, want requestedBy conductor", evs[paused].Payload)
	}
	conductorCall(t, http.MethodPut, "/workflow/"+runID+"/resume", "")
	if v := waitTerminal(t, p, runID, 120*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s after the resume in Conductor, want COMPLETED\n%v", v.Status, stepTypes(allEvents(t, p, runID)))
	}
	evs = allEvents(t, p, runID)
	t.Logf("log: %v", stepTypes(evs))
	validLog(t, evs)
	if r, s := eventIndex(evs, statestore.RunResumed, "", 0), eventIndex(evs, statestore.StepStarted, "work", 0); r < 0 || s < r {
		t.Fatalf("work started at %d, RunResumed at %d: want the start after the resume\n%v", s, r, stepTypes(evs))
	}
}

// TestE2E_AdoptRetryStep: under --adopt-on-step-failure pause, a SIMPLE
// task of an adopted workflow whose worker (the Python SDK's, through the
// proxy) reports FAILED for good is held: StepFailed (held), the run
// paused (stepFailed) in the log and in Conductor, the task not failed in
// Conductor. RETRY_STEP then RESUME run it again as logical attempt 2,
// which completes, and so does the workflow, with a valid log.
func TestE2E_AdoptRetryStep(t *testing.T) {
	p, runID := heldAdoptedStep(t, "adopt_retry", "")
	sidecartest.WaitFor(t, "the workflow to be paused in Conductor", 60*time.Second, func() bool {
		return conductorStatus(t, runID) == "PAUSED"
	})
	if _, err := p.client.RetryStep(t.Context(), runID, "flaky", "flaky once"); err != nil {
		t.Fatalf("RETRY_STEP of the adopted run's held step: %v\n%v", err, stepTypes(allEvents(t, p, runID)))
	}
	if _, err := p.client.Resume(t.Context(), runID); err != nil {
		t.Fatal(err)
	}
	if v := waitTerminal(t, p, runID, 180*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s after RETRY_STEP and resume, want COMPLETED\n%v", v.Status, stepTypes(allEvents(t, p, runID)))
	}
	evs := allEvents(t, p, runID)
	t.Logf("log: %v", stepTypes(evs))
	validLog(t, evs)
	if eventIndex(evs, statestore.StepFailed, "flaky", 1) < 0 || eventIndex(evs, statestore.StepCompleted, "flaky", 2) < 0 ||
		count(evs, statestore.StepCompleted, "after") != 1 {
		t.Fatalf("want flaky failed as logical attempt 1, completed as 2, then after\n%v", stepTypes(evs))
	}
	if i := eventIndex(evs, statestore.StepFailed, "flaky", 1); !strings.Contains(string(evs[i].Payload), `"onStepFailure":"pause"`) {
		t.Fatalf("StepFailed %s: want it held (onStepFailure pause)", evs[i].Payload)
	}
}

// heldAdoptedStep starts serve adopting a definition of two SIMPLE tasks,
// flaky and after, under --adopt-on-step-failure pause, the Python SDK's
// worker through the proxy (flaky fails its first try), and a workflow of
// it; it returns once flaky failed and the run paused, held.
// conductorURL, when set, is the front of Conductor serve talks to.
func heldAdoptedStep(t *testing.T, prefix, conductorURL string) (*proc, string) {
	t.Helper()
	w := sdkWorkerFor(t, "python")
	condURL := conductortest.URL(t)
	taskType, name := uniq(prefix), uniq(prefix)
	flaky := simpleTask("flaky", taskType, 0)
	flaky["inputParameters"].(map[string]any)["failOnceFile"] = filepath.Join(t.TempDir(), "failed-once")
	registerDef(t, condURL, name, []map[string]any{flaky, simpleTask("after", taskType, 0)})
	proxyAddr := sidecartest.FreeAddr(t)
	p := newProc(sidecartest.Start(t, sidecartest.Options{DataDir: t.TempDir(), Addr: sidecartest.FreeAddr(t), ConductorURL: conductorURL,
		Args: []string{"--conductor-proxy-listen", proxyAddr, "--adopt", name, "--adopt-interval", "300ms", "--adopt-on-step-failure", "pause"}}))
	w.start(t, "http://"+proxyAddr+"/api", taskType, "", 1)
	runID := startWorkflow(t, condURL, name, "", map[string]any{})
	sidecartest.WaitFor(t, "flaky to fail and the run to pause", 120*time.Second, func() bool {
		evs := eventsOf(t, p, runID)
		return eventIndex(evs, statestore.StepFailed, "flaky", 0) >= 0 && eventIndex(evs, statestore.RunPaused, "", 0) >= 0
	})
	return p, runID
}

// TestE2E_AdoptOnTheFirstRequest: a workflow of an adopted definition,
// started in Conductor a moment ago, before any poll or running-list read
// adopted it, is a run at the first request that names it: a pause
// answers with the run paused (not RUN_NOT_FOUND), the log starts
// RunStarted, RunPaused, and Conductor's workflow is PAUSED. A workflow
// of the definition that already ended is not adopted by a request: a
// status read of it stays RUN_NOT_FOUND.
func TestE2E_AdoptOnTheFirstRequest(t *testing.T) {
	t.Parallel() // its own serve and data dir
	condURL := conductortest.URL(t)
	taskType := uniq("adopt_ondemand")
	name := uniq("adopt_ondemand")
	registerDef(t, condURL, name, []map[string]any{simpleTask("work", taskType, 0)})
	// No worker polls, and the running list is read every 5 minutes.
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--adopt", name, "--adopt-interval", "1m")
	ended := startWorkflow(t, condURL, name, "", map[string]any{})
	conductorCall(t, http.MethodDelete, "/workflow/"+ended, "")
	runID := startWorkflow(t, condURL, name, "", map[string]any{})
	t.Cleanup(func() { _, _ = p.client.Cancel(context.Background(), runID, "test done") })
	if _, err := p.client.Pause(t.Context(), runID, 60, "at once"); err != nil {
		t.Fatalf("pause of a workflow of an adopted definition started a moment ago: %v", err)
	}
	evs := allEvents(t, p, runID)
	if len(evs) < 2 || evs[0].EventType != statestore.RunStarted || evs[1].EventType != statestore.RunPaused {
		t.Fatalf("log %v, want RunStarted, RunPaused first", stepTypes(evs))
	}
	if s := conductorStatus(t, runID); s != "PAUSED" {
		t.Fatalf("Conductor's workflow %s after the pause, want PAUSED", s)
	}
	if _, err := p.client.Run(t.Context(), ended); apiCode(err) != "404 RUN_NOT_FOUND" {
		t.Fatalf("status of a workflow that ended before any adoption: %v, want 404 RUN_NOT_FOUND", err)
	}
}

// TestE2E_AdoptOnDemandWhileConductorIsAway: with Conductor not answering,
// a request naming a workflow id the log does not have cannot tell whether
// it is an adopted definition's new workflow: it answers 503
// ENGINE_UNAVAILABLE (the CLI exits 6, retry), not RUN_NOT_FOUND.
func TestE2E_AdoptOnDemandWhileConductorIsAway(t *testing.T) {
	t.Parallel() // its own serve and data dir
	s := sidecartest.Start(t, sidecartest.Options{ConductorURL: "http://" + sidecartest.FreeAddr(t) + "/api", Probe: "/healthz",
		Args: []string{"--adopt", uniq("adopt_away")}})
	code, _, errOut := sidecartest.Run(t, "status", "0b7a3c9e-3f1d-4e5a-9c2b-8d6f4a1e2b3c", "--server", s.URL())
	if code != sidecartest.ExitUnavailable || !strings.Contains(errOut, "ENGINE_UNAVAILABLE") {
		t.Fatalf("status of an unknown workflow id while Conductor is away: exit %d %s, want exit %d ENGINE_UNAVAILABLE", code, errOut, sidecartest.ExitUnavailable)
	}
}

// TestE2E_AdoptHeldStepCompletedInConductor: an adopted run's held step
// whose task is completed by hand in Conductor, then retried and resumed:
// no worker runs the retried attempt, so it is recorded as Conductor
// completed it (logical attempt 2, naming the task) before the step that
// follows it starts, and the run completes. Conductor schedules that step
// as it resumes the workflow, and its worker polls it at once: the
// ReadSlowly cases have Conductor answer every read of the workflow after
// the retry slower than the gate's budget for reading it before it starts
// a step (a loaded machine), resumed alone and by a bulk resume.
func TestE2E_AdoptHeldStepCompletedInConductor(t *testing.T) {
	for _, c := range []struct {
		name       string
		slow, bulk bool
	}{{"Resume", false, false}, {"ReadSlowly", true, false}, {"BulkResumeReadSlowly", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // its own serve, data dir, definition and front of Conductor
			heldStepCompletedInConductor(t, c.slow, c.bulk)
		})
	}
}

func heldStepCompletedInConductor(t *testing.T, slow, bulk bool) {
	front := newSlowReads(t)
	p, runID := heldAdoptedStep(t, "adopt_heldhand", front.URL)
	var held conductorTask
	sidecartest.WaitFor(t, "the workflow paused in Conductor with flaky's task held", 60*time.Second, func() bool {
		wf, err := readConductorWorkflow(t, runID)
		if err != nil || wf.Status != "PAUSED" {
			return false
		}
		for _, tk := range wf.Tasks {
			if tk.ReferenceTaskName == "flaky" && (tk.Status == "SCHEDULED" || tk.Status == "IN_PROGRESS") {
				held = tk
				return true
			}
		}
		return false
	})
	conductorCall(t, http.MethodPost, "/tasks", `{"taskId":"`+held.TaskID+`","workflowInstanceId":"`+runID+`","status":"COMPLETED","outputData":{"byHand":true}}`)
	if _, err := p.client.RetryStep(t.Context(), runID, "flaky", "completed by hand"); err != nil {
		t.Fatalf("RETRY_STEP: %v", err)
	}
	if slow {
		front.slow(runID, 4*time.Second)
	}
	if bulk {
		v, err := p.client.Run(t.Context(), runID)
		if err != nil {
			t.Fatal(err)
		}
		res, err := p.client.Bulk(t.Context(), "resume", httpapi.BulkRequest{PlanID: v.PlanID, Reason: "completed by hand"})
		if err != nil || len(res.Runs) != 1 {
			t.Fatalf("bulk resume: %+v, %v; want the run resumed", res, err)
		}
	} else if _, err := p.client.Resume(t.Context(), runID); err != nil {
		t.Fatal(err)
	}
	v := waitTerminal(t, p, runID, 180*time.Second)
	evs := allEvents(t, p, runID)
	t.Logf("log: %v", stepTypes(evs))
	if v.Status != statestore.RunStatusCompleted || v.Step("flaky") == nil || v.Step("flaky").Status != statestore.StepStatusSuccess {
		t.Fatalf("run %s, flaky %+v; want COMPLETED with flaky SUCCESS (completed in Conductor)\n%s", v.Status, v.Step("flaky"), eventLines(evs))
	}
	validLog(t, evs)
	i := eventIndex(evs, statestore.StepCompleted, "flaky", 2)
	if eventIndex(evs, statestore.StepStarted, "flaky", 2) < 0 || i < 0 || !strings.Contains(string(evs[i].Payload), held.TaskID) {
		t.Fatalf("want flaky's logical attempt 2 started and completed as Conductor did, naming task %s\n%s", held.TaskID, eventLines(evs))
	}
	if a := eventIndex(evs, statestore.StepStarted, "after", 0); a < i {
		t.Fatalf("after started before flaky's retried attempt was recorded complete (it depends on it)\n%s", eventLines(evs))
	}
}

// slowReads is a front of the test Conductor that, once slow is called,
// answers every read of one workflow (GET /workflow/{id}) after a delay.
type slowReads struct {
	URL string

	mu    sync.Mutex
	id    string
	delay time.Duration
}

func newSlowReads(t *testing.T) *slowReads {
	t.Helper()
	target, err := url.Parse(conductortest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	s := &slowReads{}
	proxy := conductortest.ReverseProxy(t, target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d := s.delayOf(r); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL + target.Path
	return s
}

// slow delays every read of workflow id by d from now on.
func (s *slowReads) slow(id string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.id, s.delay = id, d
}

func (s *slowReads) delayOf(r *http.Request) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.id == "" || r.Method != http.MethodGet || path.Base(r.URL.Path) != s.id || path.Base(path.Dir(r.URL.Path)) != "workflow" {
		return 0
	}
	return s.delay
}
