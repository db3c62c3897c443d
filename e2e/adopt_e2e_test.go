package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Adoption of existing workflow definitions (serve --adopt): workflows
// started in Conductor, not by the sidecar, from definitions nobody wrote
// for it, become runs of the log.

// simpleTask is a SIMPLE task of taskType sleeping sleepMs in the SDK
// worker, its definition inline (no retries).
func simpleTask(ref, taskType string, sleepMs int) map[string]any {
	return map[string]any{"name": taskType, "taskReferenceName": ref, "type": "SIMPLE",
		"inputParameters": map[string]any{"sleepMs": fmt.Sprint(sleepMs)},
		"taskDefinition":  map[string]any{"name": taskType, "retryCount": 0, "timeoutSeconds": 0, "responseTimeoutSeconds": 60}}
}

func registerDef(t *testing.T, condURL, name string, tasks []map[string]any) {
	t.Helper()
	conductorJSON(t, http.MethodPost, condURL+"/metadata/workflow", map[string]any{"name": name, "version": 1, "schemaVersion": 2,
		"ownerEmail": "e2e@example.com", "tasks": tasks}, nil)
}

// startWorkflow starts a workflow of name v1 in Conductor, as any client
// of Conductor would, and returns its id.
func startWorkflow(t *testing.T, condURL, name, correlationID string, input map[string]any) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"name": name, "version": 1, "correlationId": correlationID, "input": input})
	res, err := http.Post(condURL+"/workflow", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("start %s: %s %s", name, res.Status, out.String())
	}
	return strings.TrimSpace(out.String())
}

// eventsOf is the run's log, empty while the run is not in it yet.
func eventsOf(t *testing.T, p *proc, runID string) []statestore.RunEventRecord {
	t.Helper()
	page, err := p.client.Events(t.Context(), runID, 0, 1000)
	if err != nil {
		return nil
	}
	return page.Events
}

// stepTypes lists evs as eventType or eventType:stepId.
func stepTypes(evs []statestore.RunEventRecord) []string {
	var out []string
	for _, e := range evs {
		s := e.EventType
		if e.StepID != "" {
			s += ":" + e.StepID
		}
		out = append(out, s)
	}
	return out
}

// logAdopterReads logs the adopter's reads of Conductor, by reason.
func logAdopterReads(t *testing.T, p *proc) {
	t.Helper()
	res, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		t.Logf("metrics: %v", err)
		return
	}
	defer res.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(res.Body)
	var lines []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "sidecar_adopter_") {
			lines = append(lines, l)
		}
	}
	t.Logf("adopter: %s", strings.Join(lines, "; "))
}

// completedSteps are the step ids with a StepCompleted in evs.
func completedSteps(evs []statestore.RunEventRecord) map[string]int {
	out := map[string]int{}
	for _, e := range evs {
		if e.EventType == statestore.StepCompleted {
			out[e.StepID]++
		}
	}
	return out
}

// TestE2E_AdoptMixedDefinition_PauseResume: one unmodified definition
// mixing SIMPLE tasks (worked by the official Python SDK's worker through
// the task proxy) with a SWITCH, a FORK_JOIN, an HTTP task (to a local
// server) and a SUB_WORKFLOW, started in Conductor, is adopted (runId =
// workflowId, planId = the definition's name, labels from its input and
// correlationId), paused while two SIMPLE tasks run: the drain's in-flight
// count falls to 0 as the worker finishes them, nothing starts while
// paused; resumed, it completes, every task recorded once, the log valid.
//
// It has a Conductor of its own: the memory store's decider queue (an
// in-process Redis stand-in) can stop putting workflows back for
// evaluation after other tests' workloads ("Error while processing
// unacks" every minute in Conductor's log), and then a parent is never
// decided again once its sub-workflow completes, with or without the
// sidecar; a fresh server decides it within seconds.
func TestE2E_AdoptMixedDefinition_PauseResume(t *testing.T) {
	t.Parallel() // its own serve and data dir
	w := sdkWorkerFor(t, "python")
	conductortest.URL(t) // skips without a test Conductor
	condURL := startConductor(t)
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"notified":true}`))
	}))
	defer srv.Close()
	taskType := uniq("adopt_py")
	name := uniq("adopt_mixed")
	child := name + "_child"
	registerDef(t, condURL, child, []map[string]any{simpleTask("child_step", taskType, 0)})
	registerDef(t, condURL, name, []map[string]any{
		simpleTask("prepare", taskType, 0),
		{"name": "route", "taskReferenceName": "route", "type": "SWITCH", "evaluatorType": "value-param", "expression": "kind",
			"inputParameters": map[string]any{"kind": "${workflow.input.kind}"},
			"decisionCases": map[string]any{"big": []map[string]any{
				{"name": "fan", "taskReferenceName": "fan", "type": "FORK_JOIN", "forkTasks": [][]map[string]any{
					{simpleTask("work_a", taskType, 4000)}, {simpleTask("work_b", taskType, 7000)}}},
				{"name": "gather", "taskReferenceName": "gather", "type": "JOIN", "joinOn": []string{"work_a", "work_b"}},
			}},
			"defaultCase": []map[string]any{simpleTask("small", taskType, 0)}},
		{"name": "notify", "taskReferenceName": "notify", "type": "HTTP",
			"inputParameters": map[string]any{"http_request": map[string]any{"uri": srv.URL + "/notify", "method": "GET", "connectionTimeOut": 3000, "readTimeOut": 3000}}},
		{"name": "sub", "taskReferenceName": "sub", "type": "SUB_WORKFLOW", "subWorkflowParam": map[string]any{"name": child, "version": 1}},
		simpleTask("finish", taskType, 0),
	})

	proxyAddr := sidecartest.FreeAddr(t)
	p := newProc(sidecartest.Start(t, sidecartest.Options{ConductorURL: condURL, DataDir: t.TempDir(), Addr: sidecartest.FreeAddr(t),
		Args: []string{"--conductor-proxy-listen", proxyAddr, "--adopt", name, "--adopt-interval", "300ms"}}))
	w.start(t, "http://"+proxyAddr+"/api", taskType, "", 4)
	runID := startWorkflow(t, condURL, name, "order-42", map[string]any{"kind": "big", "labels": map[string]any{"team": "data"}})

	sidecartest.WaitFor(t, "work_a and work_b to start", 90*time.Second, func() bool {
		evs := eventsOf(t, p, runID)
		return eventIndex(evs, statestore.StepStarted, "work_a", 0) >= 0 && eventIndex(evs, statestore.StepStarted, "work_b", 0) >= 0
	})
	_, err := p.client.Pause(t.Context(), runID, 60, "adopted workflow test")
	recordedDespiteConductor(t, "pause", err)
	var counts []int
	sidecartest.WaitFor(t, "the drain to end", 60*time.Second, func() bool {
		if c := len(inFlight(t, p, runID)); len(counts) == 0 || counts[len(counts)-1] != c {
			counts = append(counts, c)
		}
		_, how := drainEnd(t, allEvents(t, p, runID))
		return how != ""
	})
	evs := allEvents(t, p, runID)
	took, how := drainEnd(t, evs)
	t.Logf("drain ended with %s %s after RunPaused; in-flight counts seen %v", how, took, counts)
	if how != statestore.RunDrainCompleted || counts[0] != 2 || counts[len(counts)-1] != 0 {
		t.Fatalf("drain: %s, in-flight counts %v; want RunDrainCompleted, from 2 down to 0\n%v", how, counts, stepTypes(evs))
	}
	for i := 1; i < len(counts); i++ {
		if counts[i] > counts[i-1] {
			t.Fatalf("the in-flight count rose while draining: %v", counts)
		}
	}
	// Paused: the worker polls on through the proxy, nothing starts.
	time.Sleep(4 * time.Second)
	evs = allEvents(t, p, runID)
	paused := eventIndex(evs, statestore.RunPaused, "", 0)
	for _, e := range evs[paused:] {
		if e.EventType == statestore.StepStarted && e.StepID != "gather" {
			t.Fatalf("step %s started while the run was paused\n%v", e.StepID, stepTypes(evs))
		}
	}
	if hits.Load() != 0 {
		t.Fatalf("the HTTP task ran while the run was paused")
	}
	_, err = p.client.Resume(t.Context(), runID)
	recordedDespiteConductor(t, "resume", err)
	if v := waitTerminal(t, p, runID, 90*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s after resume, want COMPLETED\n%v", v.Status, stepTypes(allEvents(t, p, runID)))
	}
	evs = allEvents(t, p, runID)
	t.Logf("log: %v", stepTypes(evs))
	validLog(t, evs)
	done := completedSteps(evs)
	for _, id := range []string{"prepare", "route", "fan", "work_a", "work_b", "gather", "notify", "sub", "finish"} {
		if done[id] != 1 {
			t.Fatalf("step %s completed %d times, want 1\n%v", id, done[id], stepTypes(evs))
		}
	}
	// The log keeps Conductor's order: each step of the chain completes
	// before the next one starts.
	chain := [][]string{{"prepare"}, {"route"}, {"fan"}, {"work_a", "work_b"}, {"gather"}, {"notify"}, {"sub"}, {"finish"}}
	for i := 1; i < len(chain); i++ {
		for _, before := range chain[i-1] {
			for _, after := range chain[i] {
				if eventIndex(evs, statestore.StepCompleted, before, 0) > eventIndex(evs, statestore.StepStarted, after, 0) {
					t.Fatalf("%s started before %s completed: the log is not in Conductor's order\n%v", after, before, stepTypes(evs))
				}
			}
		}
	}
	if done["small"] != 0 || done["child_step"] != 0 {
		t.Fatalf("the default case or the (not adopted) child's task is in the log: %v", done)
	}
	if hits.Load() != 1 {
		t.Fatalf("the HTTP task reached the local server %d times, want 1", hits.Load())
	}
	st := evs[0]
	if st.EventType != statestore.RunStarted || st.PlanID != name || st.PlanVersion != "1" || st.RunID != runID ||
		!strings.Contains(string(st.Payload), `"correlationId":"order-42"`) || !strings.Contains(string(st.Payload), `"team":"data"`) {
		t.Fatalf("first event %+v %s", st, st.Payload)
	}
	logAdopterReads(t, p)
	// The run list selects it by its labels.
	list, err := p.client.ListRuns(t.Context(), url.Values{"labelSelector": {"correlationId=order-42,team=data"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Runs) != 1 || list.Runs[0].RunID != runID {
		t.Fatalf("run list by label: %+v", list.Runs)
	}
}

// TestE2E_AdoptMidFlight: a workflow already running when the sidecar
// starts (its first SIMPLE task and an HTTP task done, worked straight
// against Conductor) is adopted by the periodic read of its definition's
// running list: its finished tasks are in the log as StepStarted and
// StepCompleted with Conductor's times; its next SIMPLE task, polled
// through the proxy, is gated and recorded, and the run completes with a
// valid log.
func TestE2E_AdoptMidFlight(t *testing.T) {
	w := sdkWorkerFor(t, "python")
	condURL := conductortest.URL(t)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{}`))
	}))
	defer srv.Close()
	early, late := uniq("adopt_early"), uniq("adopt_late")
	name := uniq("adopt_midflight")
	registerDef(t, condURL, name, []map[string]any{
		simpleTask("first", early, 0),
		{"name": "notify", "taskReferenceName": "notify", "type": "HTTP",
			"inputParameters": map[string]any{"http_request": map[string]any{"uri": srv.URL, "method": "GET"}}},
		simpleTask("second", late, 0),
	})
	// Before the sidecar: a worker straight on Conductor does the first task.
	direct := w.start(t, condURL, early, "", 1)
	runID := startWorkflow(t, condURL, name, "", map[string]any{})
	sidecartest.WaitFor(t, "first and notify to complete in Conductor", 60*time.Second, func() bool {
		var wf struct {
			Tasks []struct {
				Ref    string `json:"referenceTaskName"`
				Status string `json:"status"`
			} `json:"tasks"`
		}
		conductorJSON(t, http.MethodGet, condURL+"/workflow/"+runID+"?includeTasks=true", nil, &wf)
		for _, tk := range wf.Tasks {
			if tk.Ref == "second" {
				return true
			}
		}
		return false
	})
	direct.kill()

	proxyAddr := sidecartest.FreeAddr(t)
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--conductor-proxy-listen", proxyAddr, "--adopt", name+":1", "--adopt-interval", "300ms")
	sidecartest.WaitFor(t, "the running workflow to be adopted", 30*time.Second, func() bool {
		return eventIndex(eventsOf(t, p, runID), statestore.StepCompleted, "notify", 0) >= 0
	})
	evs := allEvents(t, p, runID)
	if evs[0].EventType != statestore.RunStarted || eventIndex(evs, statestore.StepStarted, "second", 0) >= 0 {
		t.Fatalf("at adoption: %v", stepTypes(evs))
	}
	for _, id := range []string{"first", "notify"} {
		i, j := eventIndex(evs, statestore.StepStarted, id, 0), eventIndex(evs, statestore.StepCompleted, id, 0)
		if i < 0 || j < i || !strings.Contains(string(evs[i].Payload), `"engineStartedAt"`) || !strings.Contains(string(evs[j].Payload), `"engineEndedAt"`) {
			t.Fatalf("step %s not recorded as finished before adoption\n%v", id, stepTypes(evs))
		}
	}
	w.start(t, "http://"+proxyAddr+"/api", late, "", 1)
	if v := waitTerminal(t, p, runID, 90*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s, want COMPLETED\n%v", v.Status, stepTypes(allEvents(t, p, runID)))
	}
	evs = allEvents(t, p, runID)
	validLog(t, evs)
	if done := completedSteps(evs); done["first"] != 1 || done["notify"] != 1 || done["second"] != 1 {
		t.Fatalf("completed steps %v\n%v", done, stepTypes(evs))
	}
	if i := eventIndex(evs, statestore.StepStarted, "second", 0); strings.Contains(string(evs[i].Payload), "engineStartedAt") {
		t.Fatalf("second was gated by the proxy; its StepStarted should be the gate's, got %s", evs[i].Payload)
	}
}

// TestE2E_AdoptLoopAndDynamicFork: a definition with a DO_WHILE of two
// iterations around a SIMPLE task and a FORK_JOIN_DYNAMIC of two SIMPLE
// tasks, worked through the proxy: the loop's tasks are the steps
// step__1 and step__2, the loop itself is one step, the forked tasks keep
// the names the fork's input gave them, and the log is valid.
func TestE2E_AdoptLoopAndDynamicFork(t *testing.T) {
	w := sdkWorkerFor(t, "python")
	condURL := conductortest.URL(t)
	taskType := uniq("adopt_loop")
	conductorJSON(t, http.MethodPost, condURL+"/metadata/taskdefs", []map[string]any{{"name": taskType, "retryCount": 0,
		"timeoutSeconds": 0, "responseTimeoutSeconds": 60, "ownerEmail": "e2e@example.com"}}, nil)
	name := uniq("adopt_loopfork")
	registerDef(t, condURL, name, []map[string]any{
		{"name": "loop", "taskReferenceName": "loop", "type": "DO_WHILE",
			"loopCondition": "if ($.loop['iteration'] < 2) { true; } else { false; }",
			"loopOver":      []map[string]any{simpleTask("step", taskType, 0)}},
		{"name": "dfork", "taskReferenceName": "dfork", "type": "FORK_JOIN_DYNAMIC",
			"inputParameters":                map[string]any{"dynamicTasks": "${workflow.input.tasks}", "dynamicTasksInput": "${workflow.input.inputs}"},
			"dynamicForkTasksParam":          "dynamicTasks",
			"dynamicForkTasksInputParamName": "dynamicTasksInput"},
		{"name": "djoin", "taskReferenceName": "djoin", "type": "JOIN"},
	})
	proxyAddr := sidecartest.FreeAddr(t)
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--conductor-proxy-listen", proxyAddr, "--adopt", name, "--adopt-interval", "300ms")
	w.start(t, "http://"+proxyAddr+"/api", taskType, "", 2)
	runID := startWorkflow(t, condURL, name, "", map[string]any{
		"tasks": []map[string]any{
			{"name": taskType, "taskReferenceName": "img_0", "type": "SIMPLE"},
			{"name": taskType, "taskReferenceName": "img_1", "type": "SIMPLE"},
		},
		"inputs": map[string]any{"img_0": map[string]any{"sleepMs": "0"}, "img_1": map[string]any{"sleepMs": "0"}},
	})
	sidecartest.WaitFor(t, "the adopted run to end", 90*time.Second, func() bool {
		v, err := p.client.Run(t.Context(), runID)
		return err == nil && statestore.IsTerminalRunStatus(v.Status)
	})
	evs := allEvents(t, p, runID)
	t.Logf("log: %v", stepTypes(evs))
	if v := waitTerminal(t, p, runID, time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s, want COMPLETED\n%v", v.Status, stepTypes(evs))
	}
	validLog(t, evs)
	done := completedSteps(evs)
	for _, id := range []string{"step__1", "step__2", "loop", "dfork", "img_0", "img_1", "djoin"} {
		if done[id] != 1 {
			t.Fatalf("step %s completed %d times, want 1: %v\n%v", id, done[id], done, stepTypes(evs))
		}
	}
	if len(done) != 7 {
		t.Fatalf("completed steps %v, want exactly the 7 above", done)
	}
}

// TestE2E_AdoptBulkPauseThenCancel: two adopted workflows selected by the
// label their input gave them are paused in bulk while their SIMPLE tasks
// run (both drain), then cancelled in bulk: both end CANCELLED in the log
// and TERMINATED in Conductor, their next task never started, their logs
// valid.
func TestE2E_AdoptBulkPauseThenCancel(t *testing.T) {
	w := sdkWorkerFor(t, "python")
	condURL := conductortest.URL(t)
	taskType := uniq("adopt_bulk")
	name := uniq("adopt_bulk")
	registerDef(t, condURL, name, []map[string]any{simpleTask("work", taskType, 4000), simpleTask("after", taskType, 0)})
	proxyAddr := sidecartest.FreeAddr(t)
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--conductor-proxy-listen", proxyAddr, "--adopt", name+":1", "--adopt-interval", "300ms")
	w.start(t, "http://"+proxyAddr+"/api", taskType, "", 2)
	team := strings.ReplaceAll(uniq("team"), "_", "-")
	ids := []string{
		startWorkflow(t, condURL, name, "", map[string]any{"labels": map[string]any{"team": team}}),
		startWorkflow(t, condURL, name, "", map[string]any{"labels": map[string]any{"team": team}}),
	}
	sidecartest.WaitFor(t, "both work steps to start", 90*time.Second, func() bool {
		for _, id := range ids {
			if eventIndex(eventsOf(t, p, id), statestore.StepStarted, "work", 0) < 0 {
				return false
			}
		}
		return true
	})
	res, err := p.client.Bulk(t.Context(), "pause", httpapi.BulkRequest{LabelSelector: "team=" + team, Reason: "bulk test", TimeoutSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2 {
		t.Fatalf("bulk pause selected %+v, want the 2 adopted runs", res.Runs)
	}
	sidecartest.WaitFor(t, "both drains to complete", 60*time.Second, func() bool {
		for _, id := range ids {
			if _, how := drainEnd(t, allEvents(t, p, id)); how != statestore.RunDrainCompleted {
				return false
			}
		}
		return true
	})
	if _, err := p.client.Bulk(t.Context(), "cancel", httpapi.BulkRequest{LabelSelector: "team=" + team, Reason: "bulk test over"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		v := waitTerminal(t, p, id, 60*time.Second)
		evs := allEvents(t, p, id)
		if v.Status != statestore.RunStatusCancelled || eventIndex(evs, statestore.StepStarted, "after", 0) >= 0 {
			t.Fatalf("run %s: %s, want CANCELLED with after never started\n%v", id, v.Status, stepTypes(evs))
		}
		validLog(t, evs)
		var wf struct {
			Status string `json:"status"`
		}
		conductorJSON(t, http.MethodGet, condURL+"/workflow/"+id+"?includeTasks=false", nil, &wf)
		if wf.Status != "TERMINATED" {
			t.Fatalf("workflow %s is %s in Conductor, want TERMINATED", id, wf.Status)
		}
	}
}

// recordedDespiteConductor fails t unless err is nil or the API's 503
// ENGINE_UNAVAILABLE: the request is recorded in the log and Conductor,
// which did not answer in time (a Conductor of a test's own, cold and on
// a loaded machine), is brought in line by the follower; what the test
// asserts next (the drain, the run's end) shows that it was.
func recordedDespiteConductor(t *testing.T, what string, err error) {
	t.Helper()
	switch code := apiCode(err); {
	case err == nil:
	case code == "503 ENGINE_UNAVAILABLE":
		t.Logf("%s recorded, Conductor slow to answer: %v", what, err)
	default:
		t.Fatalf("%s: %v", what, err)
	}
}
