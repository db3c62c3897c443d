package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.uber.org/zap/zaptest"
	"go.yaml.in/yaml/v3"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// openAPIDoc is docs/openapi.yaml, parsed.
type openAPIDoc struct {
	raw  map[string]any
	path string // absolute path of the file
}

func loadOpenAPI(t *testing.T) *openAPIDoc {
	t.Helper()
	path, err := filepath.Abs("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	return &openAPIDoc{raw: raw, path: path}
}

// operations are the document's "METHOD /path" with their operation.
func (d *openAPIDoc) operations() map[string]map[string]any {
	out := map[string]map[string]any{}
	for path, ops := range d.raw["paths"].(map[string]any) {
		for method, op := range ops.(map[string]any) {
			out[strings.ToUpper(method)+" "+path] = op.(map[string]any)
		}
	}
	return out
}

// response is the documented response of op for status (following a
// $ref to components.responses), or nil.
func (d *openAPIDoc) response(op map[string]any, status string) map[string]any {
	r, ok := op["responses"].(map[string]any)[status].(map[string]any)
	if !ok {
		return nil
	}
	if ref, ok := r["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/components/responses/")
		r = d.raw["components"].(map[string]any)["responses"].(map[string]any)[name].(map[string]any)
	}
	return r
}

// TestOpenAPI_RoutesBothWays: every route the server serves is in
// docs/openapi.yaml, and every documented route is served.
func TestOpenAPI_RoutesBothWays(t *testing.T) {
	doc := loadOpenAPI(t)
	var documented []string
	for k := range doc.operations() {
		documented = append(documented, k)
	}
	sort.Strings(documented)
	e := newContractEnv(t)
	served := e.api.Routes()
	if !slices.Equal(served, documented) {
		t.Fatalf("served routes and docs/openapi.yaml differ:\nserved:     %v\ndocumented: %v", served, documented)
	}
}

// scriptedControl answers control calls with what the case sets.
type scriptedControl struct {
	mu    sync.Mutex
	err   error
	delay time.Duration
	calls atomic.Int64 // actions that reached the control
}

func (c *scriptedControl) act() (*drain.State, error) {
	c.calls.Add(1)
	c.mu.Lock()
	err, delay := c.err, c.delay
	c.mu.Unlock()
	time.Sleep(delay)
	return &drain.State{}, err
}

func (c *scriptedControl) set(err error, delay time.Duration) {
	c.mu.Lock()
	c.err, c.delay = err, delay
	c.mu.Unlock()
}

func (c *scriptedControl) Pause(context.Context, string, drain.PauseRequest) (*drain.State, error) {
	return c.act()
}
func (c *scriptedControl) Resume(context.Context, string, drain.ResumeRequest) (*drain.State, error) {
	return c.act()
}
func (c *scriptedControl) Cancel(context.Context, string, string, string) (*drain.State, error) {
	return c.act()
}
func (c *scriptedControl) RetryStep(context.Context, string, string, drain.RetryRequest) (*drain.State, error) {
	return c.act()
}
func (c *scriptedControl) ResumeLater(context.Context, string, time.Time, drain.ResumeRequest) (*drain.State, error) {
	return c.act()
}

// scriptedPlans answers every plan version with a two-step plan, as
// adapter.Runs reads it from Conductor (its e2e test: the console's).
type scriptedPlans struct{}

func (p scriptedPlans) WorkflowSteps(ctx context.Context, _ string) ([]plan.Step, error) {
	return p.PlanSteps(ctx, "", "", "")
}

func (scriptedPlans) PlanSteps(context.Context, string, string, string) ([]plan.Step, error) {
	return []plan.Step{{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}, Retries: plan.RetryPolicy{EngineTries: 1, LogicalAttempts: 1}},
		{StepID: "b", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep}, DependsOn: []string{"a"}, Retries: plan.RetryPolicy{EngineTries: 1, LogicalAttempts: 1}}}, nil
}

// scriptedStarter answers starts with what the case sets: Conductor's
// refusals and outages, which the e2e tests meet on the real server.
type scriptedStarter struct {
	mu      sync.Mutex
	created bool
	queued  bool
	err     error
}

func (s *scriptedStarter) Start(context.Context, httpapi.StartRequest) (*httpapi.Started, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	if s.queued {
		return &httpapi.Started{RunID: "run-1", Status: "QUEUED", Position: 3}, nil
	}
	return &httpapi.Started{RunID: "run-1", WorkflowID: "wf", EngineRunRef: "conductor://w/wf", Created: s.created}, nil
}

// syncingLister is a run list that has not read NATS yet (a replica just
// started): the window is a few milliseconds, too short to hit on cue.
type syncingLister struct{ httpapi.RunLister }

func (syncingLister) List(runlist.Filter, int, string) (*runlist.Page, error) {
	return nil, runlist.ErrSyncing
}

type contractEnv struct {
	api                       *httpapi.Server
	srv, down, syncing, unrdy *httptest.Server
	// busy has its admin ("root") at its bound of writing requests.
	busy    *httptest.Server
	control *scriptedControl
	starter *scriptedStarter
}

// newContractEnv serves the API on a real log, run list and reply store
// (embedded NATS) with authentication; down is the same on a NATS server
// that has stopped; syncing has a list not read yet; unrdy is not ready.
func newContractEnv(t *testing.T) *contractEnv {
	t.Helper()
	ctx := context.Background()
	// Requests to the stopped server time out after 500 ms, not 5 s.
	// The bus's one sink is a webhook that refuses every event: each is
	// dead-lettered at once, and a replay fails.
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadRequest) }))
	t.Cleanup(refuse.Close)
	open := func() (*natsstore.Store, *runlist.List, httpapi.Replies, *eventbus.Bus, *natsstore.Embedded) {
		nsrv := natstestServer(t)
		js := natstest.Connect(t, nsrv, jetstream.WithDefaultTimeout(500*time.Millisecond))
		store, list := openListedLog(t, js)
		replies, err := httpapi.OpenKVReplies(ctx, js, httpapi.KVRepliesOptions{})
		if err != nil {
			t.Fatal(err)
		}
		hook, err := eventbus.NewWebhookSink(eventbus.WebhookSinkConfig{Name: "hook", URL: refuse.URL, Secret: []byte("contract-test-secret")})
		if err != nil {
			t.Fatal(err)
		}
		bus, err := eventbus.Open(ctx, js, eventbus.Options{Log: store, Sinks: []eventbus.Sink{hook}, Timeout: 500 * time.Millisecond, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = bus.Close(context.Background()) })
		return store, list, replies, bus, nsrv
	}
	creds, err := httpapi.LoadCredentials(writeTokens(t, t.TempDir(), tokensYAML(
		principal("root", "tok-admin", "admin", ""),
		principal("v", "tok-viewer", "viewer", ""),
		principal("s", "tok-sub", "submitter", ""),
		// Scoped to a tenant no run of the log belongs to.
		principal("ops-b", "tok-ops-b", "operator, viewer", "tenantId: tenant_b"),
		// Scoped to the tenant of the log's runs (storetest.Event's).
		principal("v-acme", "tok-v-acme", "viewer", "tenantId: tenant_acme"),
	)))
	if err != nil {
		t.Fatal(err)
	}
	store, list, replies, bus, _ := open()
	w := storetest.Event("run-1", statestore.RunStarted, "")
	storetest.WithPayload(w, map[string]any{"labels": map[string]string{"team": "data"}})
	paused := storetest.Event("run-2", statestore.RunStarted, "")
	storetest.WithPayload(paused, map[string]any{"labels": map[string]string{"team": "data"}})
	for _, w := range []*statestore.RunEventWrite{w, storetest.Event("run-1", statestore.StepStarted, "a"),
		paused, storetest.Event("run-2", statestore.RunPaused, "")} {
		if _, err := store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := list.WaitIndexed(wctx); err != nil {
		t.Fatal(err)
	}
	if err := waitDeadLetters(ctx, bus, 4); err != nil {
		t.Fatal(err)
	}
	e := &contractEnv{control: &scriptedControl{}, starter: &scriptedStarter{}}
	opts := httpapi.Options{Log: store, List: list, Bus: bus, Control: e.control, Starter: e.starter, Replies: replies, Auth: creds, Plans: scriptedPlans{},
		Gatherer: prometheus.NewRegistry(), Logger: zaptest.NewLogger(t)}
	e.api = httpapi.NewServer(opts)
	serve := func(o httpapi.Options) *httptest.Server {
		s := httptest.NewServer(httpapi.NewServer(o).Handler())
		t.Cleanup(s.Close)
		return s
	}
	e.srv = httptest.NewServer(e.api.Handler())
	t.Cleanup(e.srv.Close)
	syncing := opts
	syncing.List = syncingLister{list}
	e.syncing = serve(syncing)
	unrdy := opts
	unrdy.Ready = func(context.Context) error { return fmt.Errorf("conductor: connection refused") }
	unrdy.Live = func() error { return fmt.Errorf("the connection to NATS was closed for good") }
	e.unrdy = serve(unrdy)
	busy := opts
	busy.MaxRequestsPerPrincipal = 1
	busyAPI := httpapi.NewServer(busy)
	busyAPI.HoldWritingRequests("root", 1)
	e.busy = httptest.NewServer(busyAPI.Handler())
	t.Cleanup(e.busy.Close)

	dstore, dlist, dreplies, dbus, dsrv := open()
	down := opts
	down.Log, down.List, down.Replies, down.Bus = dstore, dlist, dreplies, dbus
	e.down = serve(down)
	dsrv.Shutdown()
	return e
}

// waitDeadLetters waits until bus has n dead letters.
func waitDeadLetters(ctx context.Context, bus *eventbus.Bus, n int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		dls, err := bus.DeadLetters(ctx, "", "", 100, nil)
		if err == nil && len(dls) >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d dead letters (%v), want %d", len(dls), err, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type apiAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (e *contractEnv) do(t *testing.T, srv *httptest.Server, method, path, token, contentType, body, idemKey string) apiAnswer {
	t.Helper()
	var rd *bytes.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if idemKey != "" {
		req.Header.Set(httpapi.IdempotencyKeyHeader, idemKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return apiAnswer{status: resp.StatusCode, header: resp.Header, body: b.Bytes()}
}

// TestOpenAPI_EveryAnswerDocumented drives the server through every
// answer docs/openapi.yaml documents, route by route: each answer must be
// documented for its route and its body must match the documented schema
// (JSON Schema 2020-12, as OpenAPI 3.1 writes it); and every documented
// answer must have been produced.
func TestOpenAPI_EveryAnswerDocumented(t *testing.T) {
	doc := loadOpenAPI(t)
	e := newContractEnv(t)
	c := jsonschema.NewCompiler()
	docURL := "file://" + doc.path
	if err := c.AddResource(docURL, toJSONValue(t, doc.raw)); err != nil {
		t.Fatal(err)
	}
	produced := map[string]bool{}
	check := func(opKey, status string, a apiAnswer, pointer string) {
		t.Helper()
		op := doc.operations()[opKey]
		r := doc.response(op, status)
		if r == nil {
			t.Errorf("%s answered %s, which docs/openapi.yaml does not document: %s", opKey, status, a.body)
			return
		}
		produced[opKey+" "+status] = true
		checkHeaders(t, opKey, status, r, a.header)
		content, _ := r["content"].(map[string]any)
		if _, ok := content["application/json"]; !ok {
			return
		}
		sch, err := c.Compile(docURL + "#" + pointer)
		if err != nil {
			t.Fatalf("compile the schema of %s %s: %v", opKey, status, err)
		}
		var v any
		if err := json.Unmarshal(a.body, &v); err != nil {
			t.Errorf("%s %s: not JSON: %s", opKey, status, a.body)
			return
		}
		if err := sch.Validate(v); err != nil {
			t.Errorf("%s %s: the body does not match the documented schema: %v\n%s", opKey, status, err, a.body)
		}
	}
	run := func(opKey string, srv *httptest.Server, path, token, contentType, body, key string) apiAnswer {
		t.Helper()
		method, _, _ := strings.Cut(opKey, " ")
		a := e.do(t, srv, method, path, token, contentType, body, key)
		status := fmt.Sprint(a.status)
		check(opKey, status, a, schemaPointer(doc, opKey, status))
		return a
	}
	big := `{"reason":"` + strings.Repeat("x", httpapi.MaxBodyBytes) + `"}`
	const js = "application/json"
	planJSON := `{"planId":"p","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`
	startBody := `{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":` + planJSON + `}`

	// Every route: without credentials, and with a token without its role.
	for opKey, op := range doc.operations() {
		method, path, _ := strings.Cut(opKey, " ")
		path = strings.NewReplacer("{runId}", "run-1", "{stepId}", "a").Replace(path)
		role, _ := op["x-role"].(string)
		if role == "" {
			continue
		}
		body, ct := "", ""
		if method == http.MethodPost {
			body, ct = `{"reason":"r"}`, js
		}
		run(opKey, e.srv, path, "", ct, body, "")
		wrong := "tok-viewer"
		if role == "viewer" {
			wrong = "tok-sub"
		}
		run(opKey, e.srv, path, wrong, ct, body, "")
		if method == http.MethodPost {
			run(opKey, e.srv, path, "tok-admin", js, big, "")
			run(opKey, e.srv, path, "tok-admin", "text/plain", body, "")
			// The principal at its bound of writing requests.
			if a := run(opKey, e.busy, path, "tok-admin", ct, body, ""); a.status != http.StatusTooManyRequests {
				t.Errorf("%s with the principal at its bound: %d %s, want 429", opKey, a.status, a.body)
			}
		}
		// A path id longer than statestore.MaxIDBytes: 400, before any
		// store sees it.
		if _, tmpl, _ := strings.Cut(opKey, " "); strings.Contains(tmpl, "{") {
			for _, id := range []string{"{runId}", "{stepId}"} {
				if !strings.Contains(tmpl, id) {
					continue
				}
				p := strings.NewReplacer(id, strings.Repeat("x", 3000), "{runId}", "run-1", "{stepId}", "a").Replace(tmpl)
				if a := run(opKey, e.srv, p, "tok-admin", ct, body, ""); a.status != http.StatusBadRequest {
					t.Errorf("%s with a 3000-byte %s: %d %s, want 400", opKey, id, a.status, a.body)
				}
			}
		}
	}

	// POST /v1/runs
	start := "POST /v1/runs"
	e.starter.created = true
	run(start, e.srv, "/v1/runs", "tok-admin", js, startBody, "")
	e.starter.created = false
	run(start, e.srv, "/v1/runs", "tok-admin", js, startBody, "")
	run(start, e.srv, "/v1/runs", "tok-admin", js, `{"tenantId":"t"}`, "")
	e.starter.queued = true
	run(start, e.srv, "/v1/runs", "tok-admin", js, startBody, "")
	e.starter.queued = false
	for _, err := range []error{
		&admission.Error{Code: admission.CodeRejected, Message: "global limit 2", RetryAfter: 10 * time.Second},
		&adapter.Error{Code: httpapi.CodePlanConflict, Message: "plan p 1 exists with other content"},
		&adapter.Error{Code: adapter.CodeEngineRejected, Message: "conductor said no"},
		&adapter.Error{Code: adapter.CodeEngineUnavailable, Message: "connection refused"},
	} {
		e.starter.err = err
		run(start, e.srv, "/v1/runs", "tok-admin", js, startBody, "")
	}
	e.starter.err = nil

	// GET /v1/runs
	list := "GET /v1/runs"
	run(list, e.srv, "/v1/runs?labelSelector=team%3Ddata&limit=10", "tok-admin", "", "", "")
	run(list, e.srv, "/v1/runs?watch=true&timeoutSeconds=0", "tok-admin", "", "", "")
	run(list, e.srv, "/v1/runs?labelSelector=tier+in+(gold", "tok-admin", "", "", "")
	if a := run(list, e.srv, "/v1/runs?labelSelector=tier+in+("+strings.Repeat("a%2C", 600)+"b)", "tok-admin", "", "", ""); a.status != http.StatusBadRequest || !bytes.Contains(a.body, []byte(runlist.CodeSelectorInvalid)) {
		t.Errorf("a selector over runlist.MaxSelectorBytes: %d %s, want 400 %s", a.status, a.body, runlist.CodeSelectorInvalid)
	}
	if a := run("POST /v1/runs:cancel", e.srv, "/v1/runs:cancel", "tok-admin", js, `{"dryRun":true,"reason":"r","labelSelector":"`+strings.Repeat("k=v,", runlist.MaxSelectorTerms)+`k=v"}`, ""); a.status != http.StatusBadRequest || !bytes.Contains(a.body, []byte(runlist.CodeSelectorInvalid)) {
		t.Errorf("a bulk selector over runlist.MaxSelectorTerms: %d %s, want 400 %s", a.status, a.body, runlist.CodeSelectorInvalid)
	}
	run(list, e.syncing, "/v1/runs", "tok-admin", "", "", "")

	// A run and its events.
	run("GET /v1/runs/{runId}", e.srv, "/v1/runs/run-1", "tok-admin", "", "", "")
	run("GET /v1/runs/{runId}", e.srv, "/v1/runs/nope", "tok-admin", "", "", "")
	run("GET /v1/runs/{runId}", e.down, "/v1/runs/run-1", "tok-admin", "", "", "")
	run("GET /v1/runs/{runId}/plan", e.srv, "/v1/runs/run-1/plan", "tok-admin", "", "", "")
	run("GET /v1/runs/{runId}/plan", e.srv, "/v1/runs/nope/plan", "tok-admin", "", "", "")
	run("GET /v1/runs/{runId}/plan", e.down, "/v1/runs/run-1/plan", "tok-admin", "", "", "")
	events := "GET /v1/runs/{runId}/events"
	run(events, e.srv, "/v1/runs/run-1/events", "tok-admin", "", "", "")
	run(events, e.srv, "/v1/runs/run-1/events?limit=0", "tok-admin", "", "", "")
	run(events, e.srv, "/v1/runs/nope/events", "tok-admin", "", "", "")
	run(events, e.down, "/v1/runs/run-1/events", "tok-admin", "", "", "")

	// The control routes.
	for _, opKey := range []string{"POST /v1/runs/{runId}/pause", "POST /v1/runs/{runId}/resume", "POST /v1/runs/{runId}/cancel", "POST /v1/runs/{runId}/steps/{stepId}/retry"} {
		path := strings.NewReplacer("{runId}", "run-1", "{stepId}", "a").Replace(strings.TrimPrefix(opKey, "POST "))
		e.control.set(nil, 0)
		run(opKey, e.srv, path, "tok-admin", js, `{"reason":"r"}`, "")
		run(opKey, e.srv, path, "tok-admin", js, `{"reason":1}`, "")
		for _, err := range []error{
			drain.ErrRunNotFound,
			&statestore.Error{Code: statestore.CodeInvalidTransition, Message: "run is COMPLETED"},
			&drain.EngineError{Err: &adapter.Error{Code: adapter.CodeEngineUnavailable, Message: "connection refused"}},
		} {
			e.control.set(err, 0)
			run(opKey, e.srv, path, "tok-admin", js, `{"reason":"r"}`, "")
		}
		e.control.set(nil, 0)
		key := "k-" + path
		run(opKey, e.srv, path, "tok-admin", js, `{"reason":"first"}`, key)
		run(opKey, e.srv, path, "tok-admin", js, `{"reason":"second"}`, key)
	}

	// The bulk actions.
	for _, action := range []string{"pause", "resume", "cancel"} {
		opKey, path := "POST /v1/runs:"+action, "/v1/runs:"+action
		e.control.set(nil, 0)
		run(opKey, e.srv, path, "tok-admin", js, `{"labelSelector":"team=data","reason":"r"}`, "")
		run(opKey, e.srv, path, "tok-admin", js, `{"labelSelector":"team=data"}`, "")
		run(opKey, e.down, path, "tok-admin", js, `{"labelSelector":"team=data","reason":"r"}`, "")
		key := "bulk-" + action
		run(opKey, e.srv, path, "tok-admin", js, `{"labelSelector":"team=data","reason":"first"}`, key)
		run(opKey, e.srv, path, "tok-admin", js, `{"labelSelector":"team=data","reason":"second"}`, key)
		// Another principal (scoped to another tenant) sending the key and
		// the body: its own request, never the admin's answer with its runs.
		if a := run(opKey, e.srv, path, "tok-ops-b", js, `{"labelSelector":"team=data","reason":"first"}`, key); a.status != http.StatusOK || bytes.Contains(a.body, []byte("run-1")) {
			t.Errorf("%s: another principal sending the admin's Idempotency-Key: %d %s, want 200 with its own answer", opKey, a.status, a.body)
		}
		// The same key while its first request is being answered.
		e.control.set(nil, time.Second)
		slow := make(chan struct{})
		go func() {
			defer close(slow)
			e.do(t, e.srv, "POST", path, "tok-admin", js, `{"labelSelector":"team=data","reason":"slow"}`, "slow-"+action)
		}()
		time.Sleep(300 * time.Millisecond)
		run(opKey, e.srv, path, "tok-admin", js, `{"labelSelector":"team=data","reason":"slow"}`, "slow-"+action)
		<-slow
		e.control.set(nil, 0)
	}

	// The event bus.
	run("GET /v1/bus", e.srv, "/v1/bus", "tok-viewer", "", "", "")
	run("GET /v1/bus", e.down, "/v1/bus", "tok-viewer", "", "", "")
	dl := "GET /v1/bus/deadletters"
	run(dl, e.srv, "/v1/bus/deadletters?sink=hook&limit=2", "tok-viewer", "", "", "")
	run(dl, e.srv, "/v1/bus/deadletters?limit=0", "tok-viewer", "", "", "")
	run(dl, e.srv, "/v1/bus/deadletters?sink=nope", "tok-viewer", "", "", "")
	run(dl, e.down, "/v1/bus/deadletters", "tok-viewer", "", "", "")
	// Scoped principals: the dead letters of other tenants' runs are
	// neither listed nor replayed, and the bus status is for unscoped ones.
	if a := run(dl, e.srv, "/v1/bus/deadletters", "tok-ops-b", "", "", ""); a.status != http.StatusOK || bytes.Contains(a.body, []byte("run-")) {
		t.Errorf("a viewer scoped to tenant_b listed dead letters of tenant_acme: %d %s", a.status, a.body)
	}
	if a := run("GET /v1/bus", e.srv, "/v1/bus", "tok-ops-b", "", "", ""); a.status != http.StatusForbidden {
		t.Errorf("a scoped viewer read the bus status of every tenant: %d %s", a.status, a.body)
	}
	if a := run(dl, e.srv, "/v1/bus/deadletters", "tok-v-acme", "", "", ""); !bytes.Contains(a.body, []byte("run-1")) {
		t.Errorf("a viewer scoped to tenant_acme does not see its dead letters: %d %s", a.status, a.body)
	}
	replay := "POST /v1/bus/deadletters:replay"
	if a := run(replay, e.srv, "/v1/bus/deadletters:replay", "tok-ops-b", js, `{"sink":"hook"}`, ""); a.status != http.StatusOK || bytes.Contains(a.body, []byte(`"failed"`)) || bytes.Contains(a.body, []byte(`"key"`)) {
		t.Errorf("an operator scoped to tenant_b replayed (or saw) dead letters of tenant_acme: %d %s", a.status, a.body)
	}
	var dls httpapi.DeadLetterList
	_ = json.Unmarshal(e.do(t, e.srv, "GET", "/v1/bus/deadletters", "tok-admin", "", "", "").body, &dls)
	if len(dls.DeadLetters) == 0 {
		t.Fatal("no dead letters to replay")
	}
	if a := run(replay, e.srv, "/v1/bus/deadletters:replay", "tok-ops-b", js, `{"sink":"hook","keys":["`+dls.DeadLetters[0].Key+`"]}`, ""); a.status != http.StatusOK || !bytes.Contains(a.body, []byte(`"not_found"`)) {
		t.Errorf("an operator scoped to tenant_b replaying a dead letter of tenant_acme by its key: %d %s, want not_found", a.status, a.body)
	}
	run(replay, e.srv, "/v1/bus/deadletters:replay", "tok-admin", js, `{"sink":"hook"}`, "")
	run(replay, e.srv, "/v1/bus/deadletters:replay", "tok-admin", js, `{"keys":["x"]}`, "")
	run(replay, e.srv, "/v1/bus/deadletters:replay", "tok-admin", js, `{"sink":"nope"}`, "")
	run(replay, e.down, "/v1/bus/deadletters:replay", "tok-admin", js, `{"sink":"hook"}`, "")

	// Probes and metrics.
	run("GET /healthz", e.srv, "/healthz", "", "", "", "")
	run("GET /readyz", e.srv, "/readyz", "", "", "", "")
	run("GET /readyz", e.unrdy, "/readyz", "", "", "", "")
	run("GET /healthz", e.unrdy, "/healthz", "", "", "", "")
	run("GET /metrics", e.srv, "/metrics", "tok-admin", "", "", "")

	var missing []string
	for opKey, op := range doc.operations() {
		for status := range op["responses"].(map[string]any) {
			if !produced[opKey+" "+status] {
				missing = append(missing, opKey+" "+status)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("documented answers no request produced (%d):\n  %s", len(missing), strings.Join(missing, "\n  "))
	}
}

// schemaPointer is the JSON pointer of the schema of opKey's answer status.
// checkHeaders checks the headers a documented answer marks required:
// present, and a whole number >= its minimum when its schema is an
// integer (Retry-After in seconds).
func checkHeaders(t *testing.T, opKey, status string, r map[string]any, got http.Header) {
	t.Helper()
	hs, _ := r["headers"].(map[string]any)
	for name, h := range hs {
		h, _ := h.(map[string]any)
		if req, _ := h["required"].(bool); !req {
			continue
		}
		v := got.Get(name)
		if v == "" {
			t.Errorf("%s %s: no %s header, which docs/openapi.yaml makes required", opKey, status, name)
			continue
		}
		sch, _ := h["schema"].(map[string]any)
		if sch["type"] != "integer" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		min, _ := strconv.ParseInt(fmt.Sprint(sch["minimum"]), 10, 64)
		if err != nil || n < min {
			t.Errorf("%s %s: %s %q, want an integer >= %v", opKey, status, name, v, sch["minimum"])
		}
	}
}

func schemaPointer(doc *openAPIDoc, opKey, status string) string {
	method, path, _ := strings.Cut(opKey, " ")
	op := doc.operations()[opKey]
	r, _ := op["responses"].(map[string]any)[status].(map[string]any)
	esc := strings.NewReplacer("~", "~0", "/", "~1")
	if ref, ok := r["$ref"].(string); ok {
		return strings.TrimPrefix(ref, "#") + "/content/application~1json/schema"
	}
	return "/paths/" + esc.Replace(path) + "/" + strings.ToLower(method) + "/responses/" + status + "/content/application~1json/schema"
}

// toJSONValue converts a YAML document to the values a JSON decoder gives.
func toJSONValue(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestServer_IDsBoundedWhereTheyEnter: every id the API takes (path
// runId and stepId on every route, the ids of bodies and queries, continue
// tokens, dead-letter keys) longer than statestore.MaxIDBytes, or not
// valid UTF-8, is 400 BAD_REQUEST naming its field, before anything
// reaches a store: the embedded NATS server, which closes a connection for
// a subject near 4 KiB, still answers afterwards.
func TestServer_IDsBoundedWhereTheyEnter(t *testing.T) {
	e := newContractEnv(t)
	long := strings.Repeat("x", 3000)
	edge := strings.Repeat("x", statestore.MaxIDBytes+1)
	const js = "application/json"
	type probe struct{ method, path, token, body string }
	var probes []probe
	for _, route := range e.api.Routes() {
		method, path, _ := strings.Cut(route, " ")
		if !strings.Contains(path, "{") {
			continue
		}
		for _, bad := range []string{long, edge, "%FF%FE", "a%00b"} {
			for _, ids := range [][2]string{{bad, "a"}, {"run-1", bad}} {
				if ids[1] != "a" && !strings.Contains(path, "{stepId}") {
					continue
				}
				p := strings.NewReplacer("{runId}", ids[0], "{stepId}", ids[1]).Replace(path)
				body := ""
				if method == http.MethodPost {
					body = `{"reason":"r"}`
				}
				// A scoped token: its scope check would read the run.
				token := "tok-v-acme"
				if method == http.MethodPost {
					token = "tok-ops-b"
				}
				probes = append(probes, probe{method, p, token, body}, probe{method, p, "tok-admin", body})
			}
		}
	}
	for _, q := range []string{"tenantId", "projectId", "environmentId", "planId", "planVersion", "continue"} {
		probes = append(probes, probe{"GET", "/v1/runs?" + q + "=" + long, "tok-admin", ""})
	}
	for _, q := range []string{"sink", "after"} {
		probes = append(probes, probe{"GET", "/v1/bus/deadletters?" + q + "=" + long, "tok-admin", ""})
	}
	for _, f := range []string{"tenantId", "projectId", "environmentId", "planId", "planVersion", "requestedBy"} {
		for _, action := range []string{"pause", "resume", "cancel"} {
			probes = append(probes, probe{"POST", "/v1/runs:" + action, "tok-admin", `{"all":true,"reason":"r","` + f + `":"` + long + `"}`})
		}
	}
	for _, f := range []string{"tenantId", "projectId", "environmentId", "runRequestId", "requestedBy"} {
		fields := map[string]string{"tenantId": "t", "projectId": "p", "environmentId": "e", "runRequestId": "r", f: long}
		b, _ := json.Marshal(fields)
		probes = append(probes, probe{"POST", "/v1/runs", "tok-admin", strings.TrimSuffix(string(b), "}") + `,"plan":{"planId":"p","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}}`})
	}
	probes = append(probes,
		probe{"POST", "/v1/bus/deadletters:replay", "tok-admin", `{"sink":"hook","keys":["` + long + `"]}`},
		probe{"POST", "/v1/bus/deadletters:replay", "tok-admin", `{"sink":"` + long + `"}`},
		probe{"POST", "/v1/runs/run-1/pause", "tok-admin", `{"requestedBy":"` + long + `"}`},
	)
	for _, p := range probes {
		ct := ""
		if p.body != "" {
			ct = js
		}
		a := e.do(t, e.srv, p.method, p.path, p.token, ct, p.body, "")
		var ans struct{ Code, Field string }
		_ = json.Unmarshal(a.body, &ans)
		want := httpapi.CodeBadRequest
		if strings.Contains(p.path, "continue=") {
			want = runlist.CodeContinueInvalid
		}
		if a.status != http.StatusBadRequest || ans.Code != want || ans.Field == "" {
			t.Errorf("%s %.80s... (%s) %.60s: got %d %s, want 400 %s naming the field", p.method, p.path, p.token, p.body, a.status, a.body, want)
		}
	}
	// Without authentication the requestedBy a caller sends is recorded:
	// bounded as an id too.
	open := newSecEnv(t, nil)
	for _, path := range []string{"/v1/runs/run-t1/pause", "/v1/runs/run-t1/resume", "/v1/runs/run-t1/cancel"} {
		if r := open.do(t, "POST", path, "", js, `{"requestedBy":"`+long+`"}`); r.status != http.StatusBadRequest || r.Code != httpapi.CodeBadRequest {
			t.Errorf("%s with a %d-byte requestedBy: got %d %s, want 400 BAD_REQUEST", path, len(long), r.status, r.body)
		}
	}
	if calls := open.control.taken(); len(calls) != 0 {
		t.Errorf("refused requests reached the control: %v", calls)
	}
	// The store still answers: nothing reached it.
	if a := e.do(t, e.srv, "GET", "/v1/runs/run-1", "tok-admin", "", "", ""); a.status != http.StatusOK {
		t.Fatalf("after the probes, GET /v1/runs/run-1: %d %s", a.status, a.body)
	}
}

// TestServer_ByteBudget: a reason is at most httpapi.MaxReasonBytes and a
// body at most its route's budget; a request over either is refused
// before anything is done (a bulk cancel with a 60 KB reason once cancelled
// 4,990 runs and grew the data dir thirtyfold).
func TestServer_ByteBudget(t *testing.T) {
	e := newContractEnv(t)
	const js = "application/json"
	ok := strings.Repeat("r", httpapi.MaxReasonBytes)
	over := strings.Repeat("r", httpapi.MaxReasonBytes+1)
	routes := []string{"/v1/runs/run-1/pause", "/v1/runs/run-1/resume", "/v1/runs/run-1/cancel", "/v1/runs/run-1/steps/a/retry",
		"/v1/runs:pause", "/v1/runs:resume", "/v1/runs:cancel"}
	for _, path := range routes {
		bulk := strings.Contains(path, ":")
		body := func(reason string) string {
			if bulk {
				return `{"all":true,"dryRun":true,"reason":"` + reason + `"}`
			}
			return `{"reason":"` + reason + `"}`
		}
		before := e.control.calls.Load()
		for _, tc := range []struct {
			name, body string
			status     int
		}{
			{"ReasonOverLimit", body(over), http.StatusBadRequest},
			{"Reason60KB", body(strings.Repeat("r", 60<<10)), http.StatusRequestEntityTooLarge},
			{"Body over budget", `{"reason":"r"}` + strings.Repeat(" ", httpapi.MaxControlBodyBytes), http.StatusRequestEntityTooLarge},
		} {
			a := e.do(t, e.srv, "POST", path, "tok-admin", js, tc.body, "")
			var ans struct{ Code, Field string }
			_ = json.Unmarshal(a.body, &ans)
			if a.status != tc.status || ans.Code != httpapi.CodeBadRequest {
				t.Errorf("%s %s: got %d %.200s, want %d BAD_REQUEST", path, tc.name, a.status, a.body, tc.status)
			}
			if tc.status == http.StatusBadRequest && ans.Field != "reason" {
				t.Errorf("%s %s: field %q, want reason", path, tc.name, ans.Field)
			}
		}
		if n := e.control.calls.Load(); n != before {
			t.Errorf("%s: refused requests reached the control %d times", path, n-before)
		}
		if a := e.do(t, e.srv, "POST", path, "tok-admin", js, body(ok), ""); a.status != http.StatusOK {
			t.Errorf("%s with a reason of exactly %d bytes: %d %.200s, want 200", path, httpapi.MaxReasonBytes, a.status, a.body)
		}
	}
	keys := make([]string, httpapi.MaxDeadLetterLimit+1)
	for i := range keys {
		keys[i] = fmt.Sprintf("hook.%020d.x", i)
	}
	b, _ := json.Marshal(map[string]any{"sink": "hook", "keys": keys})
	if a := e.do(t, e.srv, "POST", "/v1/bus/deadletters:replay", "tok-admin", js, string(b), ""); a.status != http.StatusBadRequest {
		t.Errorf("a replay of %d keys: %d %.200s, want 400", len(keys), a.status, a.body)
	}
}
