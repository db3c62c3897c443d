package proxy_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/keep"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// env is a real Conductor, an embedded JetStream log, the task workers
// (polling nothing: they only gate external steps) and the proxy.
type env struct {
	js     jetstream.JetStream
	client *adapter.Client
	runs   *adapter.Runs
	store  *natsstore.Store
	emit   *registry.Emitter
	domain string
	url    string // the proxy's base URL, as a worker's server URL
	tt     string // the external task type
	worker *taskworkers.Worker
	proxy  *proxy.Proxy
	// adopter is the adopter of envOpts.adopt (nil without).
	adopter *adapter.Adopter
}

func newEnv(t testing.TB, tokens ...string) *env {
	t.Helper()
	return newEnvWith(t, nil, tokens...)
}

// newEnvWith is newEnv with the proxy's Steps (the task workers) seen
// through wrap, when not nil.
func newEnvWith(t testing.TB, wrap func(proxy.Steps) proxy.Steps, tokens ...string) *env {
	t.Helper()
	return newEnvOpts(t, envOpts{wrap: wrap, tokens: tokens})
}

// envOpts changes what newEnvOpts builds.
type envOpts struct {
	// wrap, when set, is what the proxy sees of the task workers.
	wrap func(proxy.Steps) proxy.Steps
	// reads, when set, is how the task workers read the runs' state
	// (given the store).
	reads func(taskworkers.SnapshotReader) taskworkers.SnapshotReader
	// events, when set, is how the task workers append (given the
	// registry's emitter).
	events func(*registry.Emitter) taskworkers.Emitter
	tokens []string
	// pausedTask, when set, is the task workers' OnPausedTask.
	pausedTask func(runID string)
	// taskDone, when set, is the task workers' OnTaskDone.
	taskDone func(runID string, mayEndRun, mayEndDrain bool)
	// transport, when set, carries the proxy's forwarded requests.
	transport http.RoundTripper
	// embedded configures the embedded NATS server of the log.
	embedded natsstore.EmbeddedConfig
	// workerConductor, when set, is the Conductor URL the task workers
	// use (given the real one), e.g. a front that holds their calls.
	workerConductor func(string) string
	// worker, when set, changes the task workers' options (e.g. the
	// task types they poll).
	worker func(*taskworkers.Options)
	// proxy, when set, changes the proxy's options (its limits).
	proxy func(*proxy.Options)
	// proxyConductor, when set, is the Conductor URL the proxy forwards
	// to (given the real one), e.g. a front that compresses its answers.
	proxyConductor func(string) string
	// adopt, when set, are the adopted definitions (an adapter.Adopter
	// is the task workers' Options.Adopted and adopts in their guard).
	adopt []adapter.AdoptSpec
	// adopter, when set, changes the adopter's options.
	adopter func(*adapter.AdopterOptions)
	// shareLogOf, when set, is an env whose log, Conductor, domain and
	// task type the new task workers and proxy work on: another replica,
	// or, when the test stopped that env's, a restarted serve.
	shareLogOf *env
	// noOutputKeep leaves the task workers without a durable keep of
	// unreported outputs (as when it was full or away): they keep them
	// in memory only.
	noOutputKeep bool
}

func newEnvOpts(t testing.TB, o envOpts) *env {
	t.Helper()
	wrap, reads, tokens := o.wrap, o.reads, o.tokens
	curl := conductortest.URL(t)
	ctx := context.Background()
	var (
		js     jetstream.JetStream
		store  *natsstore.Store
		client *adapter.Client
		emit   *registry.Emitter
		domain string
		runs   *adapter.Runs
		tt     = "ext_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
		err    error
	)
	if r := o.shareLogOf; r != nil {
		js, store, client, emit, domain, runs, tt = r.js, r.store, r.client, r.emit, r.domain, r.runs, r.tt
	} else {
		js, _ = natstest.StartIn(t, t.TempDir(), o.embedded)
		if store, err = natsstore.Open(ctx, js, natsstore.Options{}); err != nil {
			t.Fatal(err)
		}
		ids, err := registry.Open(ctx, js, registry.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if client, err = adapter.NewClient(adapter.ClientOptions{BaseURL: curl}); err != nil {
			t.Fatal(err)
		}
		emit = registry.NewEmitter(ids, store)
		domain = "proxy" + uuid.NewString()[:8]
		if runs, err = adapter.OpenRuns(ctx, js, client, emit, adapter.RunsOptions{TaskDomain: domain}); err != nil {
			t.Fatal(err)
		}
	}
	var runState taskworkers.SnapshotReader = store
	budget := time.Duration(0) // the default
	if reads != nil {
		runState = reads(store)
		budget = time.Minute // slow reads do not use the write budget up
	}
	var events taskworkers.Emitter = emit
	if o.events != nil {
		events = o.events(emit)
	}
	wclient := client
	if o.workerConductor != nil {
		if wclient, err = adapter.NewClient(adapter.ClientOptions{BaseURL: o.workerConductor(curl)}); err != nil {
			t.Fatal(err)
		}
	}
	var adopter *adapter.Adopter
	if len(o.adopt) > 0 {
		// A pause the adopter finds in Conductor is recorded, as serve's
		// watcher records it (drain's follower).
		keys, err := drain.OpenKeys(ctx, js, drain.KeysOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pauses := drain.NewFollower(store, emit, client, keys, drain.FollowerOptions{Drains: keys, Calls: drain.NewCalls(),
			Alone: func() bool { return true }, Logger: zaptest.NewLogger(t)})
		aopts := adapter.AdopterOptions{Specs: o.adopt, Pauses: pauses, Logger: zaptest.NewLogger(t)}
		if o.adopter != nil {
			o.adopter(&aopts)
		}
		adopter = adapter.NewAdopter(runs, store, aopts)
		if err := adopter.Open(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = adopter.Close(context.Background()) })
	}
	wopts := taskworkers.Options{
		WorkerID: "proxy-test", HandBackAfter: time.Second, Tasks: wclient, Definitions: wclient, ExternalCheck: 500 * time.Millisecond, WriteBudget: budget,
		Guard: func(ctx context.Context, runID, workflowID string) error {
			if adopter != nil && adopter.Adopts(runID, workflowID) {
				return adopter.Ensure(ctx, workflowID)
			}
			_, err := runs.EnsureStarted(ctx, runID, workflowID)
			return err
		},
		OnPausedTask: o.pausedTask, OnTaskDone: o.taskDone, Logger: zaptest.NewLogger(t),
	}
	if adopter != nil {
		wopts.Adopted = adopter
	}
	if !o.noOutputKeep { // as serve with its proxy on
		ks, err := keep.Open(ctx, js, keep.Options{})
		if err != nil {
			t.Fatal(err)
		}
		wopts.OutputKeep = ks
	}
	if o.worker != nil {
		o.worker(&wopts)
	}
	w := taskworkers.New(adapter.DomainPoller{Client: wclient, Domain: domain}, runState, events, nil, nil, wopts)
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	var steps proxy.Steps = w
	if wrap != nil {
		steps = wrap(w)
	}
	pcurl := curl
	if o.proxyConductor != nil {
		pcurl = o.proxyConductor(curl)
	}
	popts := proxy.Options{Conductor: pcurl, Tokens: tokens, Transport: o.transport, Logger: zaptest.NewLogger(t)}
	if o.proxy != nil {
		o.proxy(&popts)
	}
	p, err := proxy.New(steps, popts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.Open(ln)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return &env{js: js, client: client, runs: runs, store: store, emit: emit, domain: domain, worker: w, proxy: p, adopter: adopter,
		url: "http://" + ln.Addr().String() + "/api", tt: tt}
}

// start starts a run of n parallel external steps (timeout seconds each)
// and returns its runId and workflowId.
func (e *env) start(t *testing.T, n int, timeout int64) (string, string) {
	t.Helper()
	var steps []plan.Step
	for i := 0; i < n; i++ {
		steps = append(steps, plan.Step{StepID: fmt.Sprintf("x%d", i), TimeoutSeconds: timeout,
			Executor: plan.ExecutorSpec{Type: plan.ExecutorExternal, TaskType: e.tt, Input: map[string]string{"n": fmt.Sprint(i)}}})
	}
	return e.startPlan(t, &plan.Plan{PlanID: "proxy-" + uuid.NewString()[:8], PlanVersion: "1", Steps: steps})
}

// startPlan starts a run of p and returns its runId and workflowId.
func (e *env) startPlan(t *testing.T, p *plan.Plan) (string, string) {
	t.Helper()
	c, err := plan.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.runs.StartRun(context.Background(), adapter.StartRequest{TenantID: "t", ProjectID: "p", EnvironmentID: "e",
		RunRequestID: uuid.NewString(), Plan: c})
	if err != nil {
		t.Fatal(err)
	}
	return res.Run.RunID, res.Run.WorkflowID
}

// task is what an outside worker reads of a polled task.
type task struct {
	TaskID             string         `json:"taskId"`
	WorkflowInstanceID string         `json:"workflowInstanceId"`
	InputData          map[string]any `json:"inputData"`
	OutputData         map[string]any `json:"outputData"`
	Status             string         `json:"status"`
}

// pollBatch polls through the proxy as the SDKs do.
func (e *env) pollBatch(t *testing.T, count int) []task {
	t.Helper()
	q := url.Values{"workerid": {"sdk-worker"}, "count": {fmt.Sprint(count)}, "timeout": {"100"}, "domain": {e.domain}}
	resp, body := call(t, http.MethodGet, e.url+"/tasks/poll/batch/"+e.tt+"?"+q.Encode(), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("batch poll: %d %s", resp.StatusCode, body)
	}
	var out []task
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("batch poll answer %q: %v", body, err)
	}
	return out
}

// pollOne batch-polls one task through the proxy until one is handed out.
func (e *env) pollOne(t *testing.T) task {
	t.Helper()
	var got []task
	waitFor(t, "an external task", 10*time.Second, func() bool {
		got = e.pollBatch(t, 1)
		return len(got) > 0
	})
	return got[0]
}

func call(t *testing.T, method, u string, body any) (*http.Response, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// postAs sends body as it is with Content-Type contentType (none when
// "") and returns the answer with its body.
func postAs(t *testing.T, u, contentType, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func (e *env) events(t *testing.T, runID string) []statestore.RunEventRecord {
	t.Helper()
	recs, err := e.store.Fetch(context.Background(), runID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func count(recs []statestore.RunEventRecord, eventType string) int {
	n := 0
	for _, r := range recs {
		if r.EventType == eventType {
			n++
		}
	}
	return n
}

func (e *env) control(t *testing.T, runID, eventType string, cycle int64) {
	t.Helper()
	snap, err := e.store.ProjectSnapshot(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	w := &statestore.RunEventWrite{EventType: eventType, EmittedAt: time.Now().UTC().Format(time.RFC3339Nano), RunID: runID,
		TenantID: snap.TenantID, ProjectID: snap.ProjectID, EnvironmentID: snap.EnvironmentID, PlanID: snap.PlanID, PlanVersion: snap.PlanVersion,
		EngineAttemptID: 1, LogicalAttemptID: cycle}
	w.IdempotencyKey = w.KeyInput().Key()
	if _, err := e.emit.Emit(context.Background(), w); err != nil {
		t.Fatal(err)
	}
}

// pollDirect polls one task of the external task type straight from
// Conductor (not through the proxy), in domain ("" for none), as a worker
// that bypasses the proxy does.
func (e *env) pollDirect(t *testing.T, domain string) task {
	t.Helper()
	var direct []task
	waitFor(t, "a task polled from Conductor directly", 10*time.Second, func() bool {
		q := url.Values{"workerid": {"direct-worker"}, "count": {"1"}, "timeout": {"100"}}
		if domain != "" {
			q.Set("domain", domain)
		}
		_, b := call(t, http.MethodGet, strings.TrimSuffix(e.client.BaseURL(), "/")+"/tasks/poll/batch/"+e.tt+"?"+q.Encode(), nil)
		_ = json.Unmarshal(b, &direct)
		return len(direct) > 0
	})
	return direct[0]
}

// startOneTask registers definition name, one SIMPLE task "a" of the
// external task type (responseTimeout seconds), starts a workflow of it in
// Conductor with input and returns its id.
func (e *env) startOneTask(t *testing.T, name string, responseTimeout int, input map[string]any) string {
	t.Helper()
	ctx := context.Background()
	def := fmt.Sprintf(`{"name":%q,"version":1,"ownerEmail":"x@y","schemaVersion":2,"tasks":[{"name":%q,"taskReferenceName":"a","type":"SIMPLE",
		"taskDefinition":{"name":%q,"ownerEmail":"x@y","responseTimeoutSeconds":%d,"retryCount":0}}]}`, name, e.tt, e.tt, responseTimeout)
	if err := e.client.RegisterWorkflowDefJSON(ctx, []byte(def)); err != nil {
		t.Fatal(err)
	}
	wfID, err := e.client.StartWorkflow(ctx, model.StartWorkflowRequest{Name: name, Version: 1, Input: input})
	if err != nil {
		t.Fatal(err)
	}
	return wfID
}

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestProxy_GatesAndRecordsExternalSteps: a polled task reaches the worker
// only with its StepStarted in the log; nothing is handed out while the
// run is paused; an update is recorded (StepCompleted) before Conductor
// has it; the run completes.
func TestProxy_GatesAndRecordsExternalSteps(t *testing.T) {
	e := newEnv(t)
	runID, wfID := e.start(t, 3, 60)
	got := []task{e.pollOne(t)}
	recs := e.events(t, runID)
	if n := count(recs, statestore.StepStarted); n != 1 {
		t.Fatalf("after one task was handed out: %d StepStarted, want 1", n)
	}
	if got[0].InputData["n"] == nil {
		t.Fatalf("the step's input did not reach the worker: %v", got[0].InputData)
	}
	// Paused: the two other tasks are handed back, never to the worker.
	e.control(t, runID, statestore.RunPaused, 1)
	for i := 0; i < 5; i++ {
		if tasks := e.pollBatch(t, 5); len(tasks) != 0 {
			t.Fatalf("a task was handed out while the run is paused: %+v", tasks)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if n := count(e.events(t, runID), statestore.StepStarted); n != 1 {
		t.Fatalf("while paused: %d StepStarted, want still 1", n)
	}
	// The in-flight one finishes while paused (the drain): recorded first.
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": got[0].TaskID, "workflowInstanceId": got[0].WorkflowInstanceID,
		"status": "COMPLETED", "outputData": map[string]any{"ok": true}, "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusOK || string(body) != got[0].TaskID {
		t.Fatalf("update: %d %q, want 200 and the task id (Conductor's answer)", resp.StatusCode, body)
	}
	snap, _ := e.store.ProjectSnapshot(context.Background(), runID)
	if st := snap.Step("x" + fmt.Sprint(got[0].InputData["n"])); st == nil || st.Status != statestore.StepStatusSuccess {
		t.Fatalf("the completed step is not SUCCESS in the log: %+v", st)
	}
	e.control(t, runID, statestore.RunResumed, 1)
	// Resumed: the rest are handed out, completed through update-v2.
	done := 1
	waitFor(t, "the other tasks", 30*time.Second, func() bool {
		for _, tk := range e.pollBatch(t, 5) {
			resp, body := call(t, http.MethodPost, e.url+"/tasks/update-v2", map[string]any{"taskId": tk.TaskID,
				"workflowInstanceId": tk.WorkflowInstanceID, "status": "COMPLETED", "workerId": "sdk-worker"})
			if resp.StatusCode/100 != 2 {
				t.Fatalf("update-v2: %d %s", resp.StatusCode, body)
			}
			done++
		}
		return done == 3
	})
	waitFor(t, "the workflow to complete", 60*time.Second, func() bool {
		wf, err := e.client.Workflow(context.Background(), wfID, false)
		return err == nil && wf.Status == "COMPLETED"
	})
	recs = e.events(t, runID)
	if count(recs, statestore.StepStarted) != 3 || count(recs, statestore.StepCompleted) != 3 {
		t.Fatalf("log: %d StepStarted, %d StepCompleted, want 3 and 3", count(recs, statestore.StepStarted), count(recs, statestore.StepCompleted))
	}
}

// TestProxy_ForwardedOutcomeNudgesItsRun: once Conductor took an outside
// worker's final update, the run's watcher and drain monitor are told
// about that run (OnTaskDone), as for the sidecar's own steps: a drain can
// end, and the run's last step can end the run, without waiting for a scan.
func TestProxy_ForwardedOutcomeNudgesItsRun(t *testing.T) {
	type nudge struct {
		runID                  string
		mayEndRun, mayEndDrain bool
	}
	nudges := make(chan nudge, 16)
	e := newEnvOpts(t, envOpts{taskDone: func(runID string, mayEndRun, mayEndDrain bool) {
		nudges <- nudge{runID, mayEndRun, mayEndDrain}
	}})
	runID, _ := e.start(t, 1, 60)
	tk := e.pollOne(t)
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": tk.TaskID, "workflowInstanceId": tk.WorkflowInstanceID,
		"status": "COMPLETED", "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("update: %d %s", resp.StatusCode, body)
	}
	select {
	case n := <-nudges:
		// The run's only step: its end may end the run.
		if want := (nudge{runID, true, true}); n != want {
			t.Fatalf("nudged %+v, want %+v", n, want)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the run was not nudged after Conductor took the update")
	}
}

// TestProxy_RefusedUpdateIsRelayed: an update Conductor refuses reaches
// the worker as Conductor answered it.
func TestProxy_RefusedUpdateIsRelayed(t *testing.T) {
	e := newEnv(t)
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": uuid.NewString(), "workflowInstanceId": uuid.NewString(), "status": "COMPLETED"})
	direct, dbody := call(t, http.MethodPost, strings.TrimSuffix(e.client.BaseURL(), "/")+"/tasks", map[string]any{"taskId": uuid.NewString(), "workflowInstanceId": uuid.NewString(), "status": "COMPLETED"})
	if resp.StatusCode != direct.StatusCode || resp.StatusCode/100 == 2 {
		t.Fatalf("through the proxy: %d %s; direct: %d %s", resp.StatusCode, body, direct.StatusCode, dbody)
	}
}

// TestProxy_PassesOtherTasksThrough: tasks of a workflow that is no run
// of the log reach the worker untouched and its update is forwarded.
func TestProxy_PassesOtherTasksThrough(t *testing.T) {
	e := newEnv(t)
	wfID := e.startOneTask(t, "plain_"+e.tt, 30, map[string]any{"x": 1})
	ctx := context.Background()
	var got []task
	waitFor(t, "the plain task", 10*time.Second, func() bool {
		q := url.Values{"workerid": {"w"}, "count": {"1"}, "timeout": {"100"}}
		resp, body := call(t, http.MethodGet, e.url+"/tasks/poll/batch/"+e.tt+"?"+q.Encode(), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("poll: %d %s", resp.StatusCode, body)
		}
		_ = json.Unmarshal(body, &got)
		return len(got) > 0
	})
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": got[0].TaskID, "workflowInstanceId": wfID, "status": "COMPLETED"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("update: %d %s", resp.StatusCode, body)
	}
	waitFor(t, "the plain workflow to complete", 20*time.Second, func() bool {
		wf, err := e.client.Workflow(ctx, wfID, false)
		return err == nil && wf.Status == "COMPLETED"
	})
}

// TestProxy_GatesAnAdoptedWorkflowsTasks: a task of an adopted
// definition's workflow, whose input holds no plan step, is gated as an
// external step's: it reaches the worker with its StepStarted in the log
// (the workflow adopted as a run), and its update is recorded before
// Conductor has it. A task of the same type in a workflow of another
// definition passes through, no run made of it.
func TestProxy_GatesAnAdoptedWorkflowsTasks(t *testing.T) {
	adopted, other := "adopted_"+uuid.NewString()[:8], "other_"+uuid.NewString()[:8]
	e := newEnvOpts(t, envOpts{adopt: []adapter.AdoptSpec{{Name: adopted}}})
	ctx := context.Background()
	for _, name := range []string{adopted, other} {
		def := fmt.Sprintf(`{"name":%q,"version":1,"ownerEmail":"x@y","schemaVersion":2,"tasks":[{"name":%q,"taskReferenceName":"a","type":"SIMPLE",
			"inputParameters":{"n":"${workflow.input.n}"},
			"taskDefinition":{"name":%q,"ownerEmail":"x@y","responseTimeoutSeconds":60,"retryCount":0}}]}`, name, e.tt, e.tt)
		if err := e.client.RegisterWorkflowDefJSON(ctx, []byte(def)); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[string]string{}
	for _, name := range []string{adopted, other} {
		id, err := e.client.StartWorkflow(ctx, model.StartWorkflowRequest{Name: name, Version: 1, Input: map[string]any{"n": 1}})
		if err != nil {
			t.Fatal(err)
		}
		ids[id] = name
	}
	var got []task
	waitFor(t, "both tasks", time.Minute, func() bool {
		q := url.Values{"workerid": {"w"}, "count": {"2"}, "timeout": {"100"}}
		resp, body := call(t, http.MethodGet, e.url+"/tasks/poll/batch/"+e.tt+"?"+q.Encode(), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("poll: %d %s", resp.StatusCode, body)
		}
		var tasks []task
		_ = json.Unmarshal(body, &tasks)
		for _, tk := range tasks {
			if ids[tk.WorkflowInstanceID] == adopted {
				// Handed out: its StepStarted is in the log already.
				if c := count(e.events(t, tk.WorkflowInstanceID), statestore.StepStarted); c != 1 {
					t.Fatalf("the adopted workflow's task reached the worker with %d StepStarted in the log, want 1", c)
				}
			}
		}
		got = append(got, tasks...)
		return len(got) == 2
	})
	for _, tk := range got {
		resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": tk.TaskID, "workflowInstanceId": tk.WorkflowInstanceID,
			"status": "COMPLETED", "workerId": "w"})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("update: %d %s", resp.StatusCode, body)
		}
		recs := e.events(t, tk.WorkflowInstanceID)
		if ids[tk.WorkflowInstanceID] == other {
			if len(recs) != 0 {
				t.Fatalf("the other definition's workflow has a log: %d events", len(recs))
			}
			continue
		}
		if c := count(recs, statestore.StepCompleted); c != 1 {
			t.Fatalf("after the adopted task's update: %d StepCompleted, want 1", c)
		}
	}
}

// TestProxy_UpdateBeforeAdoption: a task of an adopted definition's
// workflow that a worker polled from Conductor directly, reported through
// the proxy before anything adopted its workflow, adopts the workflow
// first: the log reads RunStarted, StepStarted, StepCompleted, and the run
// is consistent. A workflow found PAUSED in Conductor is adopted paused
// and the update refused (409 PROXY_TASK_NOT_ADMITTED): no outcome, and
// no step left in flight.
func TestProxy_UpdateBeforeAdoption(t *testing.T) {
	for _, paused := range []bool{false, true} {
		t.Run(fmt.Sprintf("paused=%v", paused), func(t *testing.T) {
			name := "adopted_" + uuid.NewString()[:8]
			e := newEnvOpts(t, envOpts{adopt: []adapter.AdoptSpec{{Name: name}},
				// No running-list read in the test's time: only the update can adopt.
				adopter: func(o *adapter.AdopterOptions) { o.DiscoverEvery = 100_000 }})
			ctx := context.Background()
			wfID := e.startOneTask(t, name, 60, map[string]any{})
			direct := e.pollDirect(t, "")
			if paused {
				if err := e.client.Pause(ctx, wfID); err != nil {
					t.Fatal(err)
				}
			}
			resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": direct.TaskID, "workflowInstanceId": wfID, "status": "COMPLETED"})
			recs := e.events(t, wfID)
			var order []string
			for _, r := range recs {
				order = append(order, r.EventType)
			}
			if paused {
				if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), proxy.CodeTaskNotAdmitted) {
					t.Fatalf("update of a paused workflow's task before adoption: %d %s, want 409 %s", resp.StatusCode, body, proxy.CodeTaskNotAdmitted)
				}
				// The adopter's own pass may adopt the workflow first and
				// record the task's start (the mid-flight rule): the
				// refusal then ends that try, so no step is left in flight
				// for a drain to wait on.
				if c := count(recs, statestore.StepCompleted); c != 0 {
					t.Fatalf("an outcome recorded for a refused update: %v", order)
				}
				snap, err := e.store.ProjectSnapshot(ctx, wfID)
				if err != nil {
					t.Fatal(err)
				}
				if f := snap.InFlight(); len(f) != 0 {
					t.Fatalf("steps %v in flight after a refused update: %v", f, order)
				}
				return
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("update before adoption: %d %s", resp.StatusCode, body)
			}
			if got := strings.Join(order, " "); got != "RunStarted StepStarted StepCompleted" {
				t.Fatalf("the log %q, want RunStarted StepStarted StepCompleted", got)
			}
			snap, err := e.store.ProjectSnapshot(ctx, wfID)
			if err != nil {
				t.Fatal(err)
			}
			if snap.Inconsistent {
				t.Fatal("the run is INCONSISTENT")
			}
		})
	}
}

// firstRead runs hook once, right after the task workers' first read of
// a run's state that finds no such run (any read, with anyRead).
type firstRead struct {
	taskworkers.SnapshotReader
	fired   atomic.Bool // not a sync.Once: the hook's own reads pass
	hook    atomic.Pointer[func()]
	anyRead bool
}

// set arms hook.
func (f *firstRead) set(hook func()) { f.hook.Store(&hook) }

func (f *firstRead) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := f.SnapshotReader.ProjectSnapshot(ctx, runID)
	if hook := f.hook.Load(); hook != nil && (f.anyRead || errors.Is(err, statestore.ErrNotFound)) && f.fired.CompareAndSwap(false, true) {
		(*hook)()
	}
	return snap, err
}

// TestProxy_DuplicateUpdatesOfATaskPolledDirectly: a worker that polled a
// run's task from Conductor directly sends its update twice at once (its
// SDK's retry). The second, decided on a read taken before the first was
// recorded, finds the outcome in the log: it is answered as taken, not
// refused as of a paused or ended run (the run is RUNNING).
func TestProxy_DuplicateUpdatesOfATaskPolledDirectly(t *testing.T) {
	reads := &firstRead{anyRead: true}
	e := newEnvOpts(t, envOpts{reads: func(s taskworkers.SnapshotReader) taskworkers.SnapshotReader { reads.SnapshotReader = s; return reads }})
	runID, wfID := e.start(t, 1, 60)
	direct := e.pollDirect(t, e.domain)
	update := map[string]any{"taskId": direct.TaskID, "workflowInstanceId": wfID, "status": "COMPLETED"}
	reads.set(func() {
		// The second update read the run; the first is taken whole now.
		if resp, body := call(t, http.MethodPost, e.url+"/tasks", update); resp.StatusCode != http.StatusOK {
			t.Errorf("the first update: %d %s", resp.StatusCode, body)
		}
	})
	resp, body := call(t, http.MethodPost, e.url+"/tasks", update)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the second update of the same task, the run RUNNING: %d %s, want 200", resp.StatusCode, body)
	}
	if c := count(e.events(t, runID), statestore.StepCompleted); c != 1 {
		t.Fatalf("%d StepCompleted, want 1", c)
	}
}

// TestProxy_UpdateRacingAdoptionAndPause: a worker polled an adopted
// definition's task from Conductor directly and reports it through the
// proxy; the update finds no run, and meanwhile another request adopts the
// workflow (its mid-flight rule records the in-progress task's start) and
// pauses it. The gate then hands the task back and refuses the update
// (409): the step must not stay in flight in the log, where nothing holds
// it and the pause's drain would wait for it until its timeout.
func TestProxy_UpdateRacingAdoptionAndPause(t *testing.T) {
	name := "adopted_" + uuid.NewString()[:8]
	reads := &firstRead{}
	e := newEnvOpts(t, envOpts{adopt: []adapter.AdoptSpec{{Name: name}},
		adopter: func(o *adapter.AdopterOptions) { o.DiscoverEvery = 100_000 },
		reads:   func(s taskworkers.SnapshotReader) taskworkers.SnapshotReader { reads.SnapshotReader = s; return reads }})
	ctx := context.Background()
	wfID := e.startOneTask(t, name, 60, map[string]any{})
	direct := e.pollDirect(t, "")
	reads.set(func() {
		if err := e.adopter.Ensure(ctx, wfID); err != nil {
			t.Errorf("adopt: %v", err)
		}
		e.control(t, wfID, statestore.RunPaused, 1)
	})
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": direct.TaskID, "workflowInstanceId": wfID, "status": "COMPLETED"})
	recs := e.events(t, wfID)
	snap, _ := statestore.Reduce(nil, recs)
	if snap == nil {
		t.Fatalf("no log: %d %s", resp.StatusCode, body)
	}
	st := snap.Step("a")
	inFlight := st != nil && st.Status == statestore.StepStatusRunning && !st.Idle
	switch resp.StatusCode {
	case http.StatusConflict:
		if inFlight {
			var types []string
			for _, r := range recs {
				types = append(types, r.EventType)
			}
			t.Fatalf("the update was refused and its task handed back, but the log keeps the step in flight: %v", types)
		}
	case http.StatusOK:
		if st == nil || st.Status != statestore.StepStatusSuccess {
			t.Fatalf("the update was taken, but the step is %+v in the log", st)
		}
	default:
		t.Fatalf("update: %d %s", resp.StatusCode, body)
	}
}

// TestProxy_Token: with tokens set, a request without one is refused and
// one with a token (header or first path segment) is forwarded.
func TestProxy_Token(t *testing.T) {
	e := newEnv(t, "s3cret")
	resp, _ := call(t, http.MethodGet, e.url+"/metadata/taskdefs", nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %d, want 401", resp.StatusCode)
	}
	withPath := strings.Replace(e.url, "/api", "/s3cret/api", 1)
	if resp, body := call(t, http.MethodGet, withPath+"/metadata/taskdefs", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("token in the path: %d %s", resp.StatusCode, body)
	}
	req, _ := http.NewRequest(http.MethodGet, e.url+"/metadata/taskdefs", nil)
	req.Header.Set(proxy.TokenHeader, "s3cret")
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != http.StatusOK {
		t.Fatalf("token in the header: %d", r2.StatusCode)
	}
	// Both (a server URL with the token, and the header): served, the
	// token taken off the path, never refused with the path logged.
	req, _ = http.NewRequest(http.MethodGet, withPath+"/metadata/taskdefs", nil)
	req.Header.Set(proxy.TokenHeader, "s3cret")
	r3, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r3.Body.Close()
	if r3.StatusCode != http.StatusOK {
		t.Fatalf("token in the path and the header: %d, want 200", r3.StatusCode)
	}
	// A wrong header is not made good by the path's token.
	req, _ = http.NewRequest(http.MethodGet, withPath+"/metadata/taskdefs", nil)
	req.Header.Set(proxy.TokenHeader, "wrong")
	r4, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r4.Body.Close()
	if r4.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a wrong header with the token in the path: %d, want 401", r4.StatusCode)
	}
}

// seenHeaders records the headers of the requests the proxy sends
// Conductor.
type seenHeaders struct {
	mu  sync.Mutex
	got []http.Header
}

func (s *seenHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.got = append(s.got, r.Header.Clone())
	s.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

// TestProxy_ForwardsTheWorkersHeadersNotItsToken: a poll and an update
// reach Conductor with the worker's own headers (its Conductor key), not
// with the proxy's token nor the hop-by-hop headers of the worker's
// connection to the proxy.
func TestProxy_ForwardsTheWorkersHeadersNotItsToken(t *testing.T) {
	rec := &seenHeaders{}
	e := newEnvOpts(t, envOpts{tokens: []string{"s3cret"}, transport: rec})
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/tasks/poll/batch/" + e.tt + "?count=1&timeout=100"},
		{http.MethodPost, "/tasks/update-v2"},
	} {
		var body io.Reader
		if c.method == http.MethodPost {
			body = strings.NewReader(`{"taskId":"` + uuid.NewString() + `","workflowInstanceId":"` + uuid.NewString() + `","status":"COMPLETED"}`)
		}
		req, err := http.NewRequest(c.method, e.url+c.path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(proxy.TokenHeader, "s3cret")
		req.Header.Set("X-Authorization", "worker-key")
		req.Header.Set("Keep-Alive", "timeout=5")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		rec.mu.Lock()
		got := rec.got
		rec.got = nil
		rec.mu.Unlock()
		if len(got) == 0 {
			t.Fatalf("%s %s: nothing reached Conductor (%d)", c.method, c.path, resp.StatusCode)
		}
		for _, h := range got {
			if h.Get("X-Authorization") != "worker-key" || h.Get(proxy.TokenHeader) != "" || h.Get("Keep-Alive") != "" {
				t.Fatalf("%s %s reached Conductor with headers %v: want the worker's X-Authorization, not the proxy's token nor Keep-Alive", c.method, c.path, h)
			}
		}
	}
}

// gzipFront serves Conductor (its API at base) behind a front that
// gzips every answer whose request accepts gzip, as Conductor does with
// Spring Boot's server.compression enabled; it returns the front's API
// URL.
func gzipFront(t testing.TB, base string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	rp := conductortest.ReverseProxy(t, u)
	rp.ModifyResponse = func(resp *http.Response) error {
		if !strings.Contains(resp.Request.Header.Get("Accept-Encoding"), "gzip") || resp.Header.Get("Content-Encoding") != "" {
			return nil
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		var zipped bytes.Buffer
		zw := gzip.NewWriter(&zipped)
		_, _ = zw.Write(b)
		_ = zw.Close()
		resp.Body = io.NopCloser(&zipped)
		resp.ContentLength = int64(zipped.Len())
		resp.Header.Set("Content-Length", fmt.Sprint(zipped.Len()))
		resp.Header.Set("Content-Encoding", "gzip")
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv.URL + u.Path
}

// TestProxy_GatesWhenConductorCompresses: with a Conductor that gzips its
// answers and a worker that accepts gzip (Python's requests does), an
// external step's task still reaches the worker only through the gate
// (its StepStarted in the log), and its update is recorded before it is
// forwarded: the proxy reads Conductor's answers decoded.
func TestProxy_GatesWhenConductorCompresses(t *testing.T) {
	e := newEnvOpts(t, envOpts{proxyConductor: func(base string) string { return gzipFront(t, base) }})
	runID, wfID := e.start(t, 1, 60)
	var got []task
	waitFor(t, "the external task", time.Minute, func() bool {
		q := url.Values{"workerid": {"w"}, "count": {"1"}, "timeout": {"100"}, "domain": {e.domain}}
		req, _ := http.NewRequest(http.MethodGet, e.url+"/tasks/poll/batch/"+e.tt+"?"+q.Encode(), nil)
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r io.Reader = resp.Body
		if resp.Header.Get("Content-Encoding") == "gzip" {
			if r, err = gzip.NewReader(resp.Body); err != nil {
				t.Fatal(err)
			}
		}
		b, _ := io.ReadAll(r)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("poll: %d %s", resp.StatusCode, b)
		}
		_ = json.Unmarshal(b, &got)
		return len(got) > 0
	})
	if c := count(e.events(t, runID), statestore.StepStarted); c != 1 {
		t.Fatalf("the task reached the worker with %d StepStarted in the log, want 1", c)
	}
	body, _ := json.Marshal(map[string]any{"taskId": got[0].TaskID, "workflowInstanceId": wfID, "status": "COMPLETED", "workerId": "w"})
	req, _ := http.NewRequest(http.MethodPost, e.url+"/tasks", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("update: %d", resp.StatusCode)
	}
	if c := count(e.events(t, runID), statestore.StepCompleted); c != 1 {
		t.Fatalf("after the update: %d StepCompleted, want 1", c)
	}
}

// TestProxy_DeadWorkerEndsItsTry: a worker that takes a task and dies
// leaves it to Conductor's response timeout; the try is then recorded
// ended (RunStepTryEnded, taskTimedOut), so a drain does not wait for it.
func TestProxy_DeadWorkerEndsItsTry(t *testing.T) {
	e := newEnv(t)
	runID, _ := e.start(t, 1, 2)
	waitFor(t, "the external task", 10*time.Second, func() bool { return len(e.pollBatch(t, 1)) > 0 })
	// The worker dies: no update. The watch has Conductor time the task
	// out after 2 s (its sweeper alone took minutes on a busy server).
	waitFor(t, "RunStepTryEnded", 90*time.Second, func() bool {
		return count(e.events(t, runID), statestore.RunStepTryEnded) == 1
	})
	snap, _ := e.store.ProjectSnapshot(context.Background(), runID)
	if st := snap.Step("x0"); st == nil || !st.Idle {
		t.Fatalf("the step of the dead worker is still in flight: %+v", st)
	}
}

// TestProxy_DeadWorkerWhilePausedEndsAsTheTimeout: a worker dies holding
// a task of a run that is paused (Conductor's workflow PAUSED, which
// Conductor does not time tasks out in). The drain still ends (the try is
// recorded ended at the response timeout), and the task ends as without
// the pause: Conductor times it out when the workflow resumes (TIMED_OUT,
// not FAILED by the sidecar). A report of the worker after the timeout is
// refused (409 PROXY_TRY_TIMED_OUT): not recorded, not forwarded, as
// Conductor takes none after a timeout.
func TestProxy_DeadWorkerWhilePausedEndsAsTheTimeout(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	runID, wfID := e.start(t, 1, 2)
	tk := e.pollOne(t)
	e.control(t, runID, statestore.RunPaused, 1)
	if err := e.client.Pause(ctx, wfID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "RunStepTryEnded", 90*time.Second, func() bool {
		return count(e.events(t, runID), statestore.RunStepTryEnded) == 1
	})
	status := func() string {
		got, err := e.client.Task(ctx, tk.TaskID)
		if err != nil {
			t.Fatal(err)
		}
		return string(got.Status)
	}
	if s := status(); s != "IN_PROGRESS" {
		t.Fatalf("the paused workflow's task after its try ended: %s, want IN_PROGRESS (left to Conductor's timeout at resume)", s)
	}
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": tk.TaskID, "workflowInstanceId": tk.WorkflowInstanceID,
		"status": "COMPLETED", "outputData": map[string]any{"late": true}, "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), proxy.CodeTryTimedOut) {
		t.Fatalf("a report after the timeout: %d %s, want 409 %s", resp.StatusCode, body, proxy.CodeTryTimedOut)
	}
	if n := count(e.events(t, runID), statestore.StepCompleted); n != 0 {
		t.Fatalf("the late report was recorded: %d StepCompleted", n)
	}
	if s := status(); s != "IN_PROGRESS" {
		t.Fatalf("the task after the late report: %s, want IN_PROGRESS (not forwarded)", s)
	}
	e.control(t, runID, statestore.RunResumed, 1)
	if err := e.client.Resume(ctx, wfID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Conductor to time the task out", 60*time.Second, func() bool { return status() != "IN_PROGRESS" })
	if s := status(); s != "TIMED_OUT" {
		t.Fatalf("the task after the resume: %s, want TIMED_OUT, as without the pause", s)
	}
}

// TestProxy_UpdateConductorWouldNotTakeAsSent: the proxy records an
// outcome before it forwards the update, so an update Conductor would not
// take as sent is known first. A body nested deeper than Conductor's
// parser takes (1000) is refused (400 PROXY_BAD_UPDATE): nothing recorded,
// nothing forwarded, the task still the worker's. A COMPLETED output over
// Conductor's limit (10 MB by default) is recorded as Conductor ends it,
// failed for good, and Conductor fails the task.
func TestProxy_UpdateConductorWouldNotTakeAsSent(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	t.Run("NestedTooDeep", func(t *testing.T) {
		runID, _ := e.start(t, 1, 60)
		tk := e.pollOne(t)
		deep := `{"taskId":"` + tk.TaskID + `","workflowInstanceId":"` + tk.WorkflowInstanceID + `","status":"COMPLETED","outputData":{"n":` +
			strings.Repeat("[", 1500) + strings.Repeat("]", 1500) + `}}`
		resp, body := postAs(t, e.url+"/tasks", "application/json", deep)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), proxy.CodeBadUpdate) {
			t.Fatalf("an update nested 1,500 deep: %d %s, want 400 %s", resp.StatusCode, body, proxy.CodeBadUpdate)
		}
		if n := count(e.events(t, runID), statestore.StepCompleted); n != 0 {
			t.Fatalf("the refused update was recorded: %d StepCompleted", n)
		}
		if got, err := e.client.Task(ctx, tk.TaskID); err != nil || got.Status != "IN_PROGRESS" {
			t.Fatalf("the task after the refused update: %v %v, want IN_PROGRESS", got.Status, err)
		}
	})
	t.Run("OutputOverConductorsLimit", func(t *testing.T) {
		runID, _ := e.start(t, 1, 60)
		tk := e.pollOne(t)
		resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": tk.TaskID, "workflowInstanceId": tk.WorkflowInstanceID,
			"status": "COMPLETED", "outputData": map[string]any{"blob": strings.Repeat("x", proxy.DefaultMaxTaskOutputBytes+1024)}, "workerId": "sdk-worker"})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("an update over Conductor's output limit: %d %.200s, want Conductor's 200", resp.StatusCode, body)
		}
		recs := e.events(t, runID)
		if c, f := count(recs, statestore.StepCompleted), count(recs, statestore.StepFailed); c != 0 || f != 1 {
			t.Fatalf("recorded %d StepCompleted and %d StepFailed, want the failure Conductor makes of it", c, f)
		}
		got, err := e.client.Task(ctx, tk.TaskID)
		if err != nil || got.Status != "FAILED_WITH_TERMINAL_ERROR" {
			t.Fatalf("Conductor's task: %v %v, want FAILED_WITH_TERMINAL_ERROR", got.Status, err)
		}
	})
}

// barrierSteps are the task workers, whose Admit first waits (up to a
// few seconds) until n calls are inside it at once.
type barrierSteps struct {
	proxy.Steps
	n        int
	arrived  chan struct{}
	together atomic.Int32 // Admits that met all n-1 others
}

func (b *barrierSteps) Admit(t *model.Task, a *taskworkers.Assignment) bool {
	b.arrived <- struct{}{}
	deadline := time.Now().Add(5 * time.Second)
	for len(b.arrived) < b.n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if len(b.arrived) >= b.n {
		b.together.Add(1)
	}
	return b.Steps.Admit(t, a)
}

// TestProxy_AdmitsABatchAtOnce: the external steps' tasks of one batch
// poll's answer are admitted concurrently (one round of appends, not one
// after another), and each is handed out with its StepStarted in the log.
func TestProxy_AdmitsABatchAtOnce(t *testing.T) {
	const n = 4
	b := &barrierSteps{n: n, arrived: make(chan struct{}, n)}
	e := newEnvWith(t, func(s proxy.Steps) proxy.Steps { b.Steps = s; return b })
	var runIDs []string
	for range n {
		runID, _ := e.start(t, 1, 60)
		runIDs = append(runIDs, runID)
	}
	// Conductor queues the tasks as each workflow starts: wait until all n
	// are pollable, then take them in one batch poll.
	waitFor(t, "the tasks to be queued", 10*time.Second, func() bool {
		var size map[string]map[string]map[string]int64
		// Conductor's queues, read directly: the proxy forwards no admin call.
		_, body := call(t, http.MethodGet, strings.TrimSuffix(e.client.BaseURL(), "/")+"/tasks/queue/all/verbose", nil)
		_ = json.Unmarshal(body, &size)
		q := 0
		for name, shards := range size {
			if strings.Contains(name, e.tt) {
				for _, s := range shards {
					q += int(s["size"])
				}
			}
		}
		return q >= n
	})
	got := e.pollBatch(t, n)
	if len(got) != n {
		t.Fatalf("batch poll: %d tasks, want %d", len(got), n)
	}
	if c := b.together.Load(); c != n {
		t.Fatalf("%d of %d Admits met the others: the batch's tasks were admitted one after another", c, n)
	}
	for _, runID := range runIDs {
		if c := count(e.events(t, runID), statestore.StepStarted); c != 1 {
			t.Fatalf("run %s: %d StepStarted, want 1", runID, c)
		}
	}
}

// TestProxy_OutcomeAlreadyLoggedIsNotRecordedAgain: the log already holds
// another writer's outcome of the attempt (StepFailed, final); the
// worker's COMPLETED update through the proxy records nothing (the
// outcome check refuses it) and is not forwarded: the log's outcome is
// reported to Conductor instead.
func TestProxy_OutcomeAlreadyLoggedIsNotRecordedAgain(t *testing.T) {
	e := newEnv(t)
	runID, wfID := e.start(t, 1, 60)
	got := []task{e.pollOne(t)}
	snap, err := e.store.ProjectSnapshot(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	st := snap.Step("x0")
	if st == nil || st.Status != statestore.StepStatusRunning {
		t.Fatalf("step x0: %+v, want RUNNING", st)
	}
	ref := statestore.RunRef{RunID: runID, TenantID: snap.TenantID, ProjectID: snap.ProjectID, EnvironmentID: snap.EnvironmentID,
		PlanID: snap.PlanID, PlanVersion: snap.PlanVersion}
	failed, err := statestore.NewEvent(ref, statestore.StepFailed, "x0", st.EngineAttemptID, st.LogicalAttemptID,
		statestore.StepFailedPayload{Error: &statestore.StepError{Code: "OTHER_WRITER", Message: "recorded by another writer"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.emit.Emit(context.Background(), failed); err != nil {
		t.Fatal(err)
	}
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": got[0].TaskID, "workflowInstanceId": wfID, "status": "COMPLETED"})
	if resp.StatusCode/100 != 2 {
		t.Fatalf("update: %d %s", resp.StatusCode, body)
	}
	recs := e.events(t, runID)
	if c := count(recs, statestore.StepCompleted); c != 0 {
		t.Fatalf("%d StepCompleted after the logged StepFailed, want 0 (the outcome check refuses it)", c)
	}
	waitFor(t, "Conductor to have the logged failure", 10*time.Second, func() bool {
		var wf struct {
			Tasks []struct {
				TaskID string `json:"taskId"`
				Status string `json:"status"`
			} `json:"tasks"`
		}
		_, b := call(t, http.MethodGet, strings.TrimSuffix(e.client.BaseURL(), "/")+"/workflow/"+wfID+"?includeTasks=true", nil)
		_ = json.Unmarshal(b, &wf)
		for _, tk := range wf.Tasks {
			if tk.TaskID == got[0].TaskID {
				return strings.HasPrefix(tk.Status, "FAILED")
			}
		}
		return false
	})
}

// slowReads is the store's state reads, each taking delay while on: a
// store far away, or busy.
type slowReads struct {
	taskworkers.SnapshotReader
	delay time.Duration
	on    atomic.Bool
}

func (s *slowReads) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	if s.on.Load() {
		time.Sleep(s.delay)
	}
	return s.SnapshotReader.ProjectSnapshot(ctx, runID)
}

// TestProxy_UpdateWaitsForOneReadOfTheRun: an update of an external
// step's task waits for one read of the run's state, not two: with every
// read taking 4 s, the update is answered (recorded and forwarded) in
// less than 8 s. The outcome is still checked against the run's state
// (TestProxy_OutcomeAlreadyLoggedIsNotRecordedAgain) and recorded before
// Conductor has it.
func TestProxy_UpdateWaitsForOneReadOfTheRun(t *testing.T) {
	const delay = 4 * time.Second
	slow := &slowReads{delay: delay}
	e := newEnvOpts(t, envOpts{reads: func(r taskworkers.SnapshotReader) taskworkers.SnapshotReader { slow.SnapshotReader = r; return slow }})
	runID, wfID := e.start(t, 1, 60)
	got := e.pollOne(t)
	slow.on.Store(true)
	began := time.Now()
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": got.TaskID, "workflowInstanceId": wfID, "status": "COMPLETED", "workerId": "sdk-worker"})
	took := time.Since(began)
	slow.on.Store(false)
	if resp.StatusCode != http.StatusOK || string(body) != got.TaskID {
		t.Fatalf("update: %d %q, want 200 and the task id", resp.StatusCode, body)
	}
	if c := count(e.events(t, runID), statestore.StepCompleted); c != 1 {
		t.Fatalf("%d StepCompleted, want 1", c)
	}
	if took >= 2*delay {
		t.Fatalf("the update took %s with reads of %s each: it waited for more than one read of the run", took.Round(time.Millisecond), delay)
	}
}

// startedRefused is the registry's emitter, refusing every StepStarted
// while on: a store outage for the starts only, which the real store
// cannot be made to show.
type startedRefused struct {
	*registry.Emitter
	on      atomic.Bool
	refused atomic.Int32
}

func (s *startedRefused) refuse(w *statestore.RunEventWrite) error {
	if s.on.Load() && w.EventType == statestore.StepStarted {
		s.refused.Add(1)
		return &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "injected outage"}
	}
	return nil
}

func (s *startedRefused) Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	if err := s.refuse(w); err != nil {
		return statestore.AppendResult{}, err
	}
	return s.Emitter.Emit(ctx, w)
}

func (s *startedRefused) EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	if err := s.refuse(w); err != nil {
		return statestore.AppendResult{}, err
	}
	return s.Emitter.EmitIf(ctx, w, lastSeq)
}

// TestProxy_UpdateAfterAQueuedStartRecordsBoth: the store refused the
// task's StepStarted (queued in the outbox: StepStarted fails open) and
// comes back; the worker's update, at once, puts the StepStarted in the
// log first and then the StepCompleted, and is forwarded.
func TestProxy_UpdateAfterAQueuedStartRecordsBoth(t *testing.T) {
	sink := &startedRefused{}
	sink.on.Store(true)
	e := newEnvOpts(t, envOpts{events: func(em *registry.Emitter) taskworkers.Emitter { sink.Emitter = em; return sink }})
	runID, wfID := e.start(t, 1, 60)
	got := e.pollOne(t)
	if c := count(e.events(t, runID), statestore.StepStarted); c != 0 {
		t.Fatalf("%d StepStarted while the store refuses them, want 0 (queued)", c)
	}
	// The outbox's own replays fail and back off (to seconds apart).
	waitFor(t, "the outbox's replays to back off", time.Minute, func() bool { return sink.refused.Load() >= 5 })
	sink.on.Store(false)
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": got.TaskID, "workflowInstanceId": wfID, "status": "COMPLETED", "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusOK || string(body) != got.TaskID {
		t.Fatalf("update: %d %q, want 200 and the task id", resp.StatusCode, body)
	}
	recs := e.events(t, runID)
	var types []string
	for _, r := range recs {
		types = append(types, r.EventType)
	}
	if len(recs) != 3 || recs[1].EventType != statestore.StepStarted || recs[2].EventType != statestore.StepCompleted {
		t.Fatalf("log %v, want RunStarted, StepStarted, StepCompleted", types)
	}
}

// failOneUpdate answers the first task update the proxy forwards with a
// 503 of its own, without sending it to Conductor (Conductor's answer
// lost, or serve killed between the record and the forward); every other
// request passes.
type failOneUpdate struct{ failed atomic.Bool }

func (f *failOneUpdate) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/tasks") && f.failed.CompareAndSwap(false, true) {
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Status: "503 Service Unavailable", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": {"text/plain"}}, Body: io.NopCloser(strings.NewReader("unavailable")), Request: r}, nil
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestProxy_RetriedUpdateKeepsTheWorkersOutput: an update whose outcome was
// recorded but whose forward failed is retried by the worker's SDK with
// the same body; the retry reaches Conductor as the worker sent it, with
// its output, and the outcome is recorded once.
func TestProxy_RetriedUpdateKeepsTheWorkersOutput(t *testing.T) {
	e := newEnvOpts(t, envOpts{transport: &failOneUpdate{}})
	runID, wfID := e.start(t, 1, 60)
	got := e.pollOne(t)
	update := map[string]any{"taskId": got.TaskID, "workflowInstanceId": wfID, "status": "COMPLETED", "outputData": map[string]any{"result": 42}}
	if resp, body := call(t, http.MethodPost, e.url+"/tasks", update); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first update: %d %s, want Conductor's 503", resp.StatusCode, body)
	}
	if c := count(e.events(t, runID), statestore.StepCompleted); c != 1 {
		t.Fatalf("%d StepCompleted after the first update, want 1", c)
	}
	if resp, body := call(t, http.MethodPost, e.url+"/tasks", update); resp.StatusCode/100 != 2 {
		t.Fatalf("retried update: %d %s", resp.StatusCode, body)
	}
	var tk struct {
		Status     string         `json:"status"`
		OutputData map[string]any `json:"outputData"`
	}
	_, b := call(t, http.MethodGet, strings.TrimSuffix(e.client.BaseURL(), "/")+"/tasks/"+got.TaskID, nil)
	if err := json.Unmarshal(b, &tk); err != nil {
		t.Fatal(err)
	}
	if tk.Status != "COMPLETED" || tk.OutputData["result"] != float64(42) {
		t.Fatalf("the task in Conductor: %s output %v, want COMPLETED with the worker's output {result: 42}", tk.Status, tk.OutputData)
	}
	if c := count(e.events(t, runID), statestore.StepCompleted); c != 1 {
		t.Fatalf("%d StepCompleted after the retry, want 1", c)
	}
}

// TestProxy_UpdateOfATaskPolledDirectly: a worker that polled its task
// from Conductor directly and reports through the proxy. While the run
// runs, the gate decides the start at the update: StepStarted, then the
// outcome, recorded in that order, and Conductor gets the worker's
// update with its output. While the run is paused, the step may not
// start: the update is refused (409 PROXY_TASK_NOT_ADMITTED, nothing
// recorded or forwarded) and the task goes back to Conductor's queue, not
// silently dropped with a 200.
func TestProxy_UpdateOfATaskPolledDirectly(t *testing.T) {
	for _, paused := range []bool{false, true} {
		t.Run(fmt.Sprintf("paused=%v", paused), func(t *testing.T) {
			e := newEnv(t)
			runID, wfID := e.start(t, 1, 60)
			direct := e.pollDirect(t, e.domain)
			if paused {
				e.control(t, runID, statestore.RunPaused, 1)
			}
			update := map[string]any{"taskId": direct.TaskID, "workflowInstanceId": wfID, "status": "COMPLETED", "outputData": map[string]any{"by": "direct"}}
			resp, body := call(t, http.MethodPost, e.url+"/tasks", update)
			recs := e.events(t, runID)
			var tk struct {
				Status     string         `json:"status"`
				OutputData map[string]any `json:"outputData"`
			}
			if paused {
				if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), proxy.CodeTaskNotAdmitted) {
					t.Fatalf("update of a paused run's task the gate never handed out: %d %s, want 409 %s", resp.StatusCode, body, proxy.CodeTaskNotAdmitted)
				}
				if c := count(recs, statestore.StepStarted) + count(recs, statestore.StepCompleted); c != 0 {
					t.Fatalf("%d step events recorded for a refused update, want none", c)
				}
				_, b := call(t, http.MethodGet, strings.TrimSuffix(e.client.BaseURL(), "/")+"/tasks/"+direct.TaskID, nil)
				_ = json.Unmarshal(b, &tk)
				if tk.Status == "COMPLETED" {
					t.Fatal("the refused update reached Conductor")
				}
				return
			}
			if resp.StatusCode/100 != 2 {
				t.Fatalf("update of a running run's task the gate never handed out: %d %s", resp.StatusCode, body)
			}
			var order []string
			for _, r := range recs {
				if r.StepID == "x0" {
					order = append(order, r.EventType)
				}
			}
			if got := strings.Join(order, " "); got != "StepStarted StepCompleted" {
				t.Fatalf("x0's events %q, want StepStarted StepCompleted", got)
			}
			_, b := call(t, http.MethodGet, strings.TrimSuffix(e.client.BaseURL(), "/")+"/tasks/"+direct.TaskID, nil)
			if err := json.Unmarshal(b, &tk); err != nil {
				t.Fatal(err)
			}
			if tk.Status != "COMPLETED" || tk.OutputData["by"] != "direct" {
				t.Fatalf("the task in Conductor: %s %v, want COMPLETED with the worker's output", tk.Status, tk.OutputData)
			}
		})
	}
}

// TestProxy_BadUpdateIsRefused: an update whose body is not a task result
// (not JSON, not an object, empty, a status Conductor has no such value
// of) is answered 400 PROXY_BAD_UPDATE, which the SDKs do not retry, not
// relayed for Conductor to answer 500: nothing is recorded or forwarded,
// and the worker's real update afterwards is.
func TestProxy_BadUpdateIsRefused(t *testing.T) {
	e := newEnv(t)
	runID, wfID := e.start(t, 1, 60)
	got := e.pollOne(t)
	for _, body := range []string{`{"taskId":`, `[1,2]`, ``, `"COMPLETED"`,
		`{"taskId":"` + got.TaskID + `","workflowInstanceId":"` + wfID + `","status":"BOGUS"}`,
		`{"taskId":"` + got.TaskID + `","workflowInstanceId":"` + wfID + `"}`,
		// No task or no workflow named: Conductor's validation answers 500.
		`{"taskId":"","workflowInstanceId":"","status":"COMPLETED"}`, `{"status":"COMPLETED"}`,
		`{"taskId":"` + got.TaskID + `","workflowInstanceId":"","status":"COMPLETED"}`,
		`{"taskId":"","workflowInstanceId":"` + wfID + `","status":"COMPLETED"}`,
		// Well-formed objects whose fields Conductor reads otherwise than
		// the proxy (Jackson takes an enum's ordinal, a number in a
		// string): for a task of a run of the log, refused too, not
		// forwarded unrecorded.
		`{"taskId":"` + got.TaskID + `","workflowInstanceId":"` + wfID + `","status":3}`,
		`{"taskId":"` + got.TaskID + `","workflowInstanceId":"` + wfID + `","status":"COMPLETED","callbackAfterSeconds":"10"}`} {
		resp, b := postAs(t, e.url+"/tasks", "application/json", body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), proxy.CodeBadUpdate) {
			t.Fatalf("update %q: %d %s, want 400 %s", body, resp.StatusCode, b, proxy.CodeBadUpdate)
		}
	}
	// By reference name, the body is the task's output: a JSON object,
	// which Conductor requires.
	for _, u := range []struct{ status, body string }{{"COMPLETED", ``}, {"COMPLETED", `[1]`}, {"COMPLETED", `{"a":`}, {"FAILED", `"x"`}} {
		resp, b := postAs(t, e.url+"/tasks/"+wfID+"/s_x0/"+u.status, "application/json", u.body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), proxy.CodeBadUpdate) {
			t.Fatalf("update by reference name %s %q: %d %s, want 400 %s", u.status, u.body, resp.StatusCode, b, proxy.CodeBadUpdate)
		}
	}
	if c := count(e.events(t, runID), statestore.StepCompleted) + count(e.events(t, runID), statestore.StepFailed); c != 0 {
		t.Fatalf("%d outcomes recorded for bad updates", c)
	}
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": got.TaskID, "workflowInstanceId": wfID, "status": "COMPLETED"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the real update: %d %s", resp.StatusCode, body)
	}
	if c := count(e.events(t, runID), statestore.StepCompleted); c != 1 {
		t.Fatalf("after the real update: %d StepCompleted, want 1", c)
	}
}

// TestProxy_UpdateOfAnotherMediaTypeIsRefused: Conductor takes a task
// update's body only as JSON (any other Content-Type, or none, it answers
// 500 and changes nothing), so the proxy refuses such an update of any
// form (POST /tasks, update-v2, by reference name) with 415
// PROXY_UNSUPPORTED_MEDIA_TYPE before it records anything: recorded, the
// outcome would stand for the worker's real update that follows.
func TestProxy_UpdateOfAnotherMediaTypeIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	runID, wfID := e.start(t, 1, 60)
	got := e.pollOne(t)
	result := `{"taskId":"` + got.TaskID + `","workflowInstanceId":"` + wfID + `","status":"FAILED_WITH_TERMINAL_ERROR","reasonForIncompletion":"x"}`
	for _, u := range []struct{ path, body string }{
		{"/tasks", result}, {"/tasks/update-v2", result}, {"/tasks/" + wfID + "/s_x0/FAILED_WITH_TERMINAL_ERROR", `{"a":1}`},
	} {
		for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "", "application/jsonp"} {
			resp, b := postAs(t, e.url+u.path, ct, u.body)
			if resp.StatusCode != http.StatusUnsupportedMediaType || !strings.Contains(string(b), proxy.CodeUnsupportedMediaType) {
				t.Fatalf("%s as %q: %d %s, want 415 %s", u.path, ct, resp.StatusCode, b, proxy.CodeUnsupportedMediaType)
			}
		}
	}
	recs := e.events(t, runID)
	if c := count(recs, statestore.StepCompleted) + count(recs, statestore.StepFailed); c != 0 {
		t.Fatalf("%d outcomes recorded for updates Conductor would not take", c)
	}
	if tk, err := e.client.Task(ctx, got.TaskID); err != nil || tk.Status != "IN_PROGRESS" {
		t.Fatalf("the task after the refused updates: %v %v, want IN_PROGRESS", tk.Status, err)
	}
	resp, _ := postAs(t, e.url+"/tasks", "application/json; charset=UTF-8",
		`{"taskId":"`+got.TaskID+`","workflowInstanceId":"`+wfID+`","status":"COMPLETED","outputData":{"good":1}}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the worker's real update: %d", resp.StatusCode)
	}
	if c := count(e.events(t, runID), statestore.StepCompleted); c != 1 {
		t.Fatalf("after the real update: %d StepCompleted, want 1", c)
	}
	waitFor(t, "the workflow to complete", 60*time.Second, func() bool {
		wf, err := e.client.Workflow(ctx, wfID, false)
		return err == nil && wf.Status == "COMPLETED"
	})
}

// TestProxy_UpdateNamingAnotherWorkflowIsRefused: an update of an external
// step's task whose workflowInstanceId is not the task's (Conductor answers
// such an update 200 and changes nothing) is refused with
// PROXY_WORKFLOW_MISMATCH: nothing is recorded or forwarded, and the
// worker's later real update is recorded and reaches Conductor as sent.
func TestProxy_UpdateNamingAnotherWorkflowIsRefused(t *testing.T) {
	e := newEnv(t)
	runID, wfID := e.start(t, 1, 60)
	_, otherWF := e.start(t, 1, 60)
	got := e.pollOne(t)
	if got.WorkflowInstanceID != wfID {
		// The other run's task came first: the test's point is the same.
		runID, wfID = "", got.WorkflowInstanceID
	}
	wrong := otherWF
	if wfID == otherWF {
		wrong = strings.Repeat("0", 8) + otherWF[8:]
	}
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": got.TaskID, "workflowInstanceId": wrong,
		"status": "COMPLETED", "outputData": map[string]any{"forged": true}})
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), proxy.CodeWorkflowMismatch) {
		t.Fatalf("update naming another workflow: %d %s, want 400 %s", resp.StatusCode, body, proxy.CodeWorkflowMismatch)
	}
	if runID != "" {
		if c := count(e.events(t, runID), statestore.StepCompleted); c != 0 {
			t.Fatalf("the refused update was recorded: %d StepCompleted", c)
		}
	}
	resp, body = call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": got.TaskID, "workflowInstanceId": wfID,
		"status": "FAILED_WITH_TERMINAL_ERROR", "reasonForIncompletion": "real failure"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the real update: %d %s", resp.StatusCode, body)
	}
	waitFor(t, "Conductor to take the real update", 10*time.Second, func() bool {
		_, b := call(t, http.MethodGet, strings.TrimSuffix(e.client.BaseURL(), "/")+"/tasks/"+got.TaskID, nil)
		var tk task
		_ = json.Unmarshal(b, &tk)
		return tk.Status == "FAILED_WITH_TERMINAL_ERROR"
	})
}

// TestProxy_InProgressWithCallbackFinishesInTheDrain: an outside worker
// that reports its task IN_PROGRESS with callbackAfterSeconds (the SDKs'
// way to check on a long job: Conductor gives the task back to a poll
// after the callback) gets it back while the run is paused, since a pause
// stops new tasks, not this one; it then reports its outcome, and the
// drain has nothing left to wait for. Before, the gate handed it back at
// every poll of the pause, and the drain waited out its deadline for a
// step nobody could report.
func TestProxy_InProgressWithCallbackFinishesInTheDrain(t *testing.T) {
	e := newEnv(t)
	runID, wfID := e.start(t, 1, 60)
	got := e.pollOne(t)
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": got.TaskID, "workflowInstanceId": wfID,
		"status": "IN_PROGRESS", "callbackAfterSeconds": 1, "outputData": map[string]any{"progress": 1}, "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("IN_PROGRESS update: %d %s", resp.StatusCode, body)
	}
	e.control(t, runID, statestore.RunPaused, 1)
	var again task
	waitFor(t, "the task in progress back from a poll during the pause", 15*time.Second, func() bool {
		for _, tk := range e.pollBatch(t, 1) {
			again = tk
			return true
		}
		return false
	})
	if again.TaskID != got.TaskID {
		t.Fatalf("polled task %s during the pause, want the one in progress, %s", again.TaskID, got.TaskID)
	}
	resp, body = call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": got.TaskID, "workflowInstanceId": wfID,
		"status": "COMPLETED", "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("COMPLETED update: %d %s", resp.StatusCode, body)
	}
	recs := e.events(t, runID)
	if n, m := count(recs, statestore.StepStarted), count(recs, statestore.RunStepTryStarted); n != 1 || m != 0 {
		t.Fatalf("%d StepStarted and %d RunStepTryStarted, want the one start", n, m)
	}
	snap, err := e.store.ProjectSnapshot(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	if st := snap.Step("x0"); st == nil || st.Status != statestore.StepStatusSuccess || len(snap.InFlight()) != 0 {
		t.Fatalf("step %+v, %d in flight: want x0 SUCCESS and nothing for the drain to wait for", st, len(snap.InFlight()))
	}
}

// An outside worker's task in progress (IN_PROGRESS with a callback, its
// progress in the task's output, as long-running SDK workers keep it) that
// comes back while the run's state cannot be read is handed back as it
// was: Conductor keeps only the last update's output, and a hand-back
// without it made the worker start over.
func TestProxy_HandBackKeepsTheWorkersProgress(t *testing.T) {
	var fail atomic.Bool
	e := newEnvOpts(t, envOpts{reads: func(r taskworkers.SnapshotReader) taskworkers.SnapshotReader {
		return failingReads{SnapshotReader: r, on: &fail}
	}})
	_, wfID := e.start(t, 1, 60)
	got := e.pollOne(t)
	resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": got.TaskID, "workflowInstanceId": wfID,
		"status": "IN_PROGRESS", "callbackAfterSeconds": 1, "outputData": map[string]any{"progress": 7}, "workerId": "sdk-worker"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("IN_PROGRESS update: %d %s", resp.StatusCode, body)
	}
	fail.Store(true)
	// The task comes back after its callback; the gate cannot read the
	// run and hands it back.
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if tasks := e.pollBatch(t, 1); len(tasks) != 0 {
			t.Fatalf("polled %+v while the run's state could not be read, want it handed back", tasks)
		}
	}
	fail.Store(false)
	var again task
	waitFor(t, "the task in progress back from a poll", 15*time.Second, func() bool {
		for _, tk := range e.pollBatch(t, 1) {
			again = tk
			return true
		}
		return false
	})
	if again.TaskID != got.TaskID || fmt.Sprint(again.OutputData["progress"]) != "7" {
		t.Fatalf("task %s with output %v, want %s with the worker's progress (7)", again.TaskID, again.OutputData, got.TaskID)
	}
}

// TestProxy_AnAnswerItsWorkerNeverGotIsHandedBack: a worker's poll
// through the proxy that it gave up on (it hung up) before Conductor's
// answer, which carried an external step's task, came back: the task is
// handed back, so that the next poll gets it within seconds, not at its
// response timeout (an hour here), and no StepStarted is recorded for
// the answer nobody got. Conductor's answers to polls reach the proxy a
// second late here (a slow network); the worker waits 300 ms.
func TestProxy_AnAnswerItsWorkerNeverGotIsHandedBack(t *testing.T) {
	slow := &slowPolls{}
	e := newEnvOpts(t, envOpts{transport: slow})
	runID, _ := e.start(t, 1, 3600)
	slow.delay.Store(int64(time.Second))
	q := url.Values{"workerid": {"sdk-worker"}, "count": {"1"}, "timeout": {"100"}, "domain": {e.domain}}
	c := &http.Client{Timeout: 300 * time.Millisecond}
	if res, err := c.Get(e.url + "/tasks/poll/batch/" + e.tt + "?" + q.Encode()); err == nil {
		res.Body.Close()
		t.Fatal("the poll was answered within 300 ms, before Conductor's answer came")
	}
	slow.delay.Store(0)
	var got []task
	waitFor(t, "the task again through the proxy", 30*time.Second, func() bool {
		got = e.pollBatch(t, 1)
		return len(got) > 0
	})
	if starts := count(e.events(t, runID), statestore.StepStarted); starts != 1 {
		t.Fatalf("%d StepStarted, want 1 (the second poll's)", starts)
	}
}

// slowPolls carries the proxy's requests to Conductor, holding the
// answers to polls for delay (nanoseconds) once it is set.
type slowPolls struct{ delay atomic.Int64 }

func (s *slowPolls) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := http.DefaultTransport.RoundTrip(r)
	if d := s.delay.Load(); d > 0 && strings.Contains(r.URL.Path, "/tasks/poll/") {
		time.Sleep(time.Duration(d))
	}
	return res, err
}
