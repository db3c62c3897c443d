package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// env is an API server over a real embedded JetStream (store, registry, run
// registry) and the real adapter pointed at conductorURL.
type env struct {
	srv   *httptest.Server
	store *natsstore.Store
	js    jetstream.JetStream
}

func newEnv(t *testing.T, conductorURL string) *env {
	t.Helper()
	return newEnvWith(t, conductorURL, natsstore.EmbeddedConfig{})
}

// newEnvWith is newEnv on an embedded server configured by cfg (its
// Permissions, for a test that must break a stream as an admin would).
func newEnvWith(t *testing.T, conductorURL string, cfg natsstore.EmbeddedConfig) *env {
	t.Helper()
	return newEnvLogged(t, conductorURL, cfg, zaptest.NewLogger(t))
}

// newEnvLogged is newEnvWith with the server's logger.
func newEnvLogged(t *testing.T, conductorURL string, cfg natsstore.EmbeddedConfig, logger *zap.Logger) *env {
	t.Helper()
	ctx := context.Background()
	js, _ := natstest.StartIn(t, t.TempDir(), cfg)
	store, err := natsstore.Open(ctx, js, natsstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := registry.Open(ctx, js, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := adapter.NewClient(adapter.ClientOptions{BaseURL: conductorURL})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := adapter.OpenRuns(ctx, js, client, registry.NewEmitter(ids, store), adapter.RunsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	api := httpapi.NewServer(httpapi.Options{Log: store, Starter: &httpapi.RunStarter{Runs: runs}, Gatherer: reg, Registerer: reg, Logger: logger})
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return &env{srv: srv, store: store, js: js}
}

// deadURL is a Conductor URL where nothing listens.
func deadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr + "/api"
}

type answer struct {
	status int
	Code   string `json:"code"`
	Field  string `json:"field"`
	Msg    string `json:"message"`
	Probs  []struct {
		Code, Path, StepID string
	} `json:"problems"`
}

func call(t *testing.T, e *env, method, path, contentType, body string) answer {
	t.Helper()
	req, _ := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a answer
	_ = json.NewDecoder(resp.Body).Decode(&a)
	a.status = resp.StatusCode
	return a
}

const goodPlan = `{"planId":"p1","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`

func startBody(planJSON string, mut func(m map[string]any)) string {
	m := map[string]any{"tenantId": "t", "projectId": "p", "environmentId": "e", "runRequestId": "r1", "plan": json.RawMessage(planJSON)}
	if mut != nil {
		mut(m)
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func TestServer_StartBadInput(t *testing.T) {
	e := newEnv(t, deadURL(t))
	tests := []struct {
		name, contentType, body string
		status                  int
		code, field             string
	}{
		{"malformed JSON", "application/json", `{"tenantId":`, 400, "BAD_REQUEST", ""},
		{"not an object", "application/json", `[1,2]`, 400, "BAD_REQUEST", ""},
		{"unknown field", "application/json", startBody(goodPlan, func(m map[string]any) { m["color"] = "red" }), 400, "BAD_REQUEST", ""},
		{"trailing data", "application/json", startBody(goodPlan, nil) + `{}`, 400, "BAD_REQUEST", ""},
		{"missing tenantId", "application/json", startBody(goodPlan, func(m map[string]any) { delete(m, "tenantId") }), 400, "BAD_REQUEST", "tenantId"},
		{"missing runRequestId", "application/json", startBody(goodPlan, func(m map[string]any) { delete(m, "runRequestId") }), 400, "BAD_REQUEST", "runRequestId"},
		{"pipe in projectId", "application/json", startBody(goodPlan, func(m map[string]any) { m["projectId"] = "a|b" }), 400, "BAD_REQUEST", "projectId"},
		{"missing plan", "application/json", startBody(goodPlan, func(m map[string]any) { delete(m, "plan") }), 400, "BAD_REQUEST", "plan"},
		{"bad label key", "application/json", startBody(goodPlan, func(m map[string]any) { m["labels"] = map[string]any{"team": "data", "-tier": "gold"} }), 400, "BAD_REQUEST", "labels.-tier"},
		{"bad label value", "application/json", startBody(goodPlan, func(m map[string]any) { m["labels"] = map[string]any{"team": "data science"} }), 400, "BAD_REQUEST", "labels.team"},
		{"label not a string", "application/json", startBody(goodPlan, func(m map[string]any) { m["labels"] = map[string]any{"team": 7} }), 400, "BAD_REQUEST", ""},
		{"wrong content type", "text/plain", startBody(goodPlan, nil), 415, "BAD_REQUEST", ""},
		{"body too large", "application/json", `{"tenantId":"` + strings.Repeat("x", httpapi.MaxBodyBytes) + `"}`, 413, "BAD_REQUEST", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := call(t, e, "POST", "/v1/runs", tt.contentType, tt.body)
			if a.status != tt.status || a.Code != tt.code || (tt.field != "" && a.Field != tt.field) {
				t.Fatalf("got %d %s field %q (%s), want %d %s field %q", a.status, a.Code, a.Field, a.Msg, tt.status, tt.code, tt.field)
			}
		})
	}
}

func TestServer_StartInvalidPlanIsLocated(t *testing.T) {
	e := newEnv(t, deadURL(t))
	bad := `{"planId":"p1","planVersion":"1","steps":[
		{"stepId":"a","executor":{"type":"noop"},"dependsOn":["b"]},
		{"stepId":"b","executor":{"type":"noop"},"dependsOn":["a"]},
		{"stepId":"c","executor":{"type":"command"},"dependsOn":["zz"]}]}`
	a := call(t, e, "POST", "/v1/runs", "application/json", startBody(bad, nil))
	if a.status != 400 || a.Code != "PLAN_INVALID" {
		t.Fatalf("got %d %s: %s", a.status, a.Code, a.Msg)
	}
	found := map[string]string{}
	for _, p := range a.Probs {
		found[p.Code] = p.Path + "@" + p.StepID
	}
	for _, want := range []string{"CYCLE", "UNKNOWN_DEPENDENCY", "BAD_EXECUTOR"} {
		if found[want] == "" {
			t.Errorf("problem %s missing: %+v", want, a.Probs)
		}
	}
	if !strings.HasPrefix(found["UNKNOWN_DEPENDENCY"], "steps[2].dependsOn[0]@c") {
		t.Errorf("UNKNOWN_DEPENDENCY located at %q, want steps[2].dependsOn[0] of step c", found["UNKNOWN_DEPENDENCY"])
	}
}

func TestServer_StartEngineUnavailable(t *testing.T) {
	e := newEnv(t, deadURL(t))
	a := call(t, e, "POST", "/v1/runs", "application/json", startBody(goodPlan, nil))
	if a.status != 503 || a.Code != "ENGINE_UNAVAILABLE" {
		t.Fatalf("got %d %s: %s", a.status, a.Code, a.Msg)
	}
	// No half-started run: nothing in the event log, no active run.
	info, err := e.js.Stream(context.Background(), "SIDECAR_EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("%d events written for a start that failed", n)
	}
}

// A dependency away, every request that needs it fails with its code, and
// the log says so once a minute for each code, not once a request: a
// client retrying its calls in a loop wrote a line each.
func TestServer_FailuresOfADependencyAreLoggedBounded(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	e := newEnvLogged(t, deadURL(t), natsstore.EmbeddedConfig{}, zap.New(core))
	for i := range 20 {
		if a := call(t, e, "POST", "/v1/runs", "application/json", startBody(goodPlan, nil)); a.status != 503 || a.Code != "ENGINE_UNAVAILABLE" {
			t.Fatalf("start %d: %d %s, want 503 ENGINE_UNAVAILABLE", i, a.status, a.Code)
		}
	}
	if n := logs.FilterMessageSnippet("request failed").Len(); n != 1 {
		t.Fatalf("%d warnings for 20 requests failing with Conductor away, want 1:\n%v", n, logs.All())
	}
}

func TestServer_RunsAndEvents(t *testing.T) {
	e := newEnv(t, deadURL(t))
	ctx := context.Background()
	for _, w := range []*statestore.RunEventWrite{
		storetest.Event("run/1 ü", statestore.RunStarted, ""),
		storetest.Event("run/1 ü", statestore.StepStarted, "a"),
		storetest.Event("run/1 ü", statestore.StepStarted, "b"),
		storetest.Event("run/1 ü", statestore.StepStarted, "c"),
		storetest.Event("run/1 ü", statestore.RunPaused, ""),
	} {
		if _, err := e.store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	c := httpapi.NewClient(e.srv.URL)
	v, err := c.Run(ctx, "run/1 ü")
	if err != nil {
		t.Fatal(err)
	}
	want := "Workflow paused. Waiting for 3 in-flight tasks to complete."
	if v.Status != "PAUSED" || v.Substatus != "DRAINING" || v.Message != want {
		t.Fatalf("got %s/%s %q, want PAUSED/DRAINING %q", v.Status, v.Substatus, v.Message, want)
	}
	// The view counts the open pause in pausedSeconds (the snapshot does
	// not: it is a function of the log); it grows while the run is paused.
	time.Sleep(50 * time.Millisecond)
	again, err := c.Run(ctx, "run/1 ü")
	if err != nil {
		t.Fatal(err)
	}
	if again.PausedSeconds < 0.05 || again.PausedSeconds <= v.PausedSeconds {
		t.Fatalf("pausedSeconds %v then %v, want it counting the open pause", v.PausedSeconds, again.PausedSeconds)
	}
	page, err := c.Events(ctx, "run/1 ü", 0, 2)
	if err != nil || len(page.Events) != 2 {
		t.Fatalf("events: %v %v", page, err)
	}
	rest, err := c.Events(ctx, "run/1 ü", page.NextAfterSeq, 0)
	if err != nil || len(rest.Events) != 3 || rest.Events[0].RunSeq <= page.NextAfterSeq {
		t.Fatalf("next page: %v %v", rest, err)
	}
	for _, tt := range []struct {
		path   string
		status int
		code   string
	}{
		{"/v1/runs/nope", 404, "RUN_NOT_FOUND"},
		{"/v1/runs/nope/events", 404, "RUN_NOT_FOUND"},
		{"/v1/runs/x/events?afterSeq=abc", 400, "BAD_REQUEST"},
		{"/v1/runs/x/events?limit=0", 400, "BAD_REQUEST"},
		{"/v1/runs/x/events?limit=5000", 400, "BAD_REQUEST"},
		{"/v1/nothing", 404, "NOT_FOUND"},
	} {
		if a := call(t, e, "GET", tt.path, "", ""); a.status != tt.status || a.Code != tt.code {
			t.Errorf("GET %s: got %d %s, want %d %s", tt.path, a.status, a.Code, tt.status, tt.code)
		}
	}
	resp, err := http.Get(e.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(buf.String(), `sidecar_api_requests_total{code="404",route="status"}`) {
		t.Fatalf("/metrics lacks the request counter:\n%.2000s", buf.String())
	}
}

func TestMessage(t *testing.T) {
	mem := memstore.New(statestore.ProjectorOptions{})
	ctx := context.Background()
	for _, w := range []*statestore.RunEventWrite{
		storetest.Event("r", statestore.RunStarted, ""), storetest.Event("r", statestore.StepStarted, "a"), storetest.Event("r", statestore.RunPaused, ""),
	} {
		mem.Append(ctx, w)
	}
	s, _ := mem.ProjectSnapshot(ctx, "r")
	if got := httpapi.Message(s); got != "Workflow paused. Waiting for 1 in-flight task to complete." {
		t.Fatalf("got %q", got)
	}
	// Timed out with the step still running, then the step ended: the
	// message never claims "0 tasks still running".
	timedOut := storetest.Event("r", statestore.RunDrainTimedOut, "")
	mem.Append(ctx, storetest.WithPayload(timedOut, map[string]any{"code": statestore.PauseDrainTimeoutCode, "inFlightStepIds": []string{"a"}, "waitedSeconds": 300}))
	s, _ = mem.ProjectSnapshot(ctx, "r")
	if got := httpapi.Message(s); got != "Workflow paused. Drain timed out (PAUSE_DRAIN_TIMEOUT); 1 task still in flight (started, no outcome recorded)." {
		t.Fatalf("timed out, step running: got %q", got)
	}
	mem.Append(ctx, storetest.Event("r", statestore.StepCompleted, "a"))
	s, _ = mem.ProjectSnapshot(ctx, "r")
	if got := httpapi.Message(s); strings.Contains(got, "0 task") || !strings.Contains(got, "No tasks in flight") {
		t.Fatalf("timed out, step since completed: got %q", got)
	}
	// A run failed by the watcher because Conductor lost its workflow
	// says so.
	failed := storetest.Event("lost", statestore.RunFailed, "")
	mem.Append(ctx, storetest.Event("lost", statestore.RunStarted, ""))
	mem.Append(ctx, storetest.WithPayload(failed, map[string]any{"error": map[string]any{"code": "WORKFLOW_NOT_FOUND", "message": "Conductor no longer knows workflow wf1", "retryable": false}}))
	s, _ = mem.ProjectSnapshot(ctx, "lost")
	if got := httpapi.Message(s); !strings.Contains(got, "WORKFLOW_NOT_FOUND") {
		t.Fatalf("run failed by a lost workflow: got %q", got)
	}
}

// TestServer_StartRegistryUnavailable: a start whose RunStarted cannot be
// registered because the EventIdRegistry does not answer is 503
// STORE_UNAVAILABLE, retryable with the same runRequestId, not 500
// INTERNAL (TestE2E_NATSClusterR3 got 500 while the registry's stream
// elected a leader after a node died). The registry's stream is deleted:
// its writes find no responder, as during an election.
func TestServer_StartRegistryUnavailable(t *testing.T) {
	e := newEnvWith(t, conductortest.URL(t), natsstore.EmbeddedConfig{Permissions: natsstore.AllPermissions})
	if err := e.js.DeleteStream(context.Background(), "KV_"+registry.DefaultBucket); err != nil {
		t.Fatal(err)
	}
	a := call(t, e, "POST", "/v1/runs", "application/json", startBody(goodPlan, func(m map[string]any) {
		m["runRequestId"] = "registry-down-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	}))
	if a.status != 503 || a.Code != statestore.CodeStoreUnavailable {
		t.Fatalf("got %d %s: %s", a.status, a.Code, a.Msg)
	}
}
