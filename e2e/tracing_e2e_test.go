package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
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
	"github.com/conductor-sidecar/sidecar/tracing"
	"github.com/conductor-sidecar/sidecar/tracing/tracingtest"
)

// tracedRun is what a run of tracingPlan left behind outside the sidecar.
type tracedRun struct {
	runID string
	// commandTP is the TRACEPARENT the command step saw, httpTP the
	// traceparent header the http step's server saw, inputTC the
	// _trace_context of the workflow's input on Conductor.
	commandTP, httpTP string
	inputTC           map[string]any
}

// runTracingPlan runs a plan of a command step (which writes its
// TRACEPARENT to a file and runs for a while) and an http step after it
// (to a server that records its traceparent header) on p; it pauses the
// run while the command runs, with pauseHeader on the request, waits for
// the drain, resumes it, and waits for COMPLETED.
func runTracingPlan(t *testing.T, p *proc, pauseHeader http.Header) tracedRun {
	t.Helper()
	var (
		mu     sync.Mutex
		httpTP = "(no request)"
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		httpTP = r.Header.Get("traceparent")
		mu.Unlock()
	}))
	defer srv.Close()
	tpFile := filepath.Join(t.TempDir(), "traceparent")
	pl := &plan.Plan{PlanID: uniq("e2e-trace"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "cmd", Executor: plan.ExecutorSpec{Type: plan.ExecutorCommand,
			Argv: []string{"sh", "-c", `printf '%s' "$TRACEPARENT" > "$1"; sleep 2`, "sh", tpFile}}},
		{StepID: "call", DependsOn: []string{"cmd"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorHTTP, Method: http.MethodGet, URL: srv.URL + "/hook"}},
	}}
	started := submit(t, p, pl, uniq("req"))
	sidecartest.WaitFor(t, "cmd to start", time.Minute, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "cmd", 0) >= 0
	})
	post(t, p, "/v1/runs/"+url.PathEscape(started.RunID)+"/pause", `{"reason":"maintenance"}`, pauseHeader)
	sidecartest.WaitFor(t, "the drain to complete", time.Minute, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.RunDrainCompleted, "", 0) >= 0
	})
	post(t, p, "/v1/runs/"+url.PathEscape(started.RunID)+"/resume", `{}`, nil)
	if v := waitTerminal(t, p, started.RunID, 2*time.Minute); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s, want COMPLETED", v.Status)
	}
	b, err := os.ReadFile(tpFile)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return tracedRun{runID: started.RunID, commandTP: string(b), httpTP: httpTP, inputTC: workflowTraceContext(t, p, started.RunID)}
}

// post sends a control request with header and fails t unless it
// succeeds.
func post(t *testing.T, p *proc, path, body string, header http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+p.addr+path, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e bytes.Buffer
		_, _ = e.ReadFrom(resp.Body)
		t.Fatalf("POST %s: %d %s", path, resp.StatusCode, e.String())
	}
}

// workflowTraceContext is the _trace_context of the run's workflow input
// on Conductor (nil: none).
func workflowTraceContext(t *testing.T, p *proc, runID string) map[string]any {
	t.Helper()
	evs := allEvents(t, p, runID)
	i := eventIndex(evs, statestore.RunStarted, "", 0)
	if i < 0 {
		t.Fatalf("no RunStarted: %v", types(evs))
	}
	var started statestore.RunStartedPayload
	if err := json.Unmarshal(evs[i].Payload, &started); err != nil {
		t.Fatal(err)
	}
	workflowID := started.EngineRunRef[strings.LastIndexByte(started.EngineRunRef, '/')+1:]
	resp, err := http.Get(conductortest.URL(t) + "/workflow/" + url.PathEscape(workflowID) + "?includeTasks=false")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var wf struct {
		Input map[string]any `json:"input"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&wf); err != nil {
		t.Fatalf("workflow %s on Conductor: %d %v", workflowID, resp.StatusCode, err)
	}
	tc, _ := wf.Input["_trace_context"].(map[string]any)
	return tc
}

// environ is this process's environment without OTEL_* variables, plus
// extra and the http steps' permission to reach the test's own server.
func environ(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") && !strings.HasPrefix(kv, "SIDECAR_HTTP_ALLOW=") {
			env = append(env, kv)
		}
	}
	return append(append(env, "SIDECAR_HTTP_ALLOW=127.0.0.1/32"), extra...)
}

// TestE2E_Tracing runs the sidecar binary with OTEL_EXPORTER_OTLP_ENDPOINT
// set to a real OpenTelemetry Collector (both protocols), runs a plan
// with a command step and an http step, pauses it through the API with a
// caller's W3C traceparent and resumes it, and reads the spans back from
// the collector: the run span, both step attempt spans, the pause cycle
// span and the control request spans, all in the run's trace; the steps
// and Conductor got the trace context.
func TestE2E_Tracing(t *testing.T) {
	for _, proto := range []string{tracing.ProtocolHTTP, tracing.ProtocolGRPC} {
		t.Run(strings.ReplaceAll(proto, "/", "_"), func(t *testing.T) {
			col := tracingtest.Start(t)
			endpoint := col.HTTP
			if proto == tracing.ProtocolGRPC {
				endpoint = col.GRPC
			}
			p := newProc(sidecartest.Start(t, sidecartest.Options{Env: environ(
				"OTEL_EXPORTER_OTLP_ENDPOINT="+endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL="+proto,
				"OTEL_SERVICE_NAME=sidecar-e2e", "OTEL_BSP_SCHEDULE_DELAY=100")}))
			const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
			run := runTracingPlan(t, p, http.Header{"Traceparent": {"00-" + callerTrace + "-" + callerSpan + "-01"}})

			traceID := tracing.RunTraceID(run.runID).String()
			runSpanID := tracing.RunContext(run.runID).SpanID().String()
			if want := tracing.Traceparent(tracing.RunContext(run.runID)); run.inputTC["traceparent"] != want {
				t.Errorf("workflow input _trace_context %v, want traceparent %s", run.inputTC, want)
			}

			want := []string{"run", "step cmd", "step call", "pause", "POST /v1/runs", "POST /v1/runs/{runId}/pause", "POST /v1/runs/{runId}/resume"}
			byName := func(spans []tracingtest.Span) map[string]tracingtest.Span {
				m := map[string]tracingtest.Span{}
				for _, s := range spans {
					if s.Attributes[tracing.AttrRunID] != run.runID {
						continue
					}
					name := s.Name
					if strings.HasPrefix(name, "run ") { // "run <planId>"
						name = "run"
					}
					m[name] = s
				}
				return m
			}
			spans := byName(col.WaitSpans(t, 30*time.Second, func(all []tracingtest.Span) bool { return len(byName(all)) >= len(want) }))
			for _, name := range want {
				s, ok := spans[name]
				if !ok {
					t.Errorf("no span %q of the run", name)
					continue
				}
				if s.Service != "sidecar-e2e" {
					t.Errorf("span %q: service %q, want sidecar-e2e (OTEL_SERVICE_NAME)", name, s.Service)
				}
				switch name {
				case "run":
					if s.TraceID != traceID || s.SpanID != runSpanID || s.ParentSpanID != "" || s.Attributes[tracing.AttrRunStatus] != statestore.RunCompleted {
						t.Errorf("run span %+v: want trace %s, id %s, a root, RunCompleted", s, traceID, runSpanID)
					}
				case "step cmd", "step call":
					if s.TraceID != traceID || s.ParentSpanID != runSpanID || s.Attributes[tracing.AttrOutcome] != tracing.OutcomeCompleted ||
						s.Attributes[tracing.AttrLogicalAttempt] != int64(1) || s.Attributes[tracing.AttrEngineAttempt] != int64(1) {
						t.Errorf("step span %+v: want a child of the run span, attempt 1/1, completed", s)
					}
					seen, what := run.commandTP, "the command's TRACEPARENT"
					if name == "step call" {
						seen, what = run.httpTP, "the http step's traceparent header"
					}
					if wantTP := "00-" + traceID + "-" + s.SpanID + "-01"; seen != wantTP {
						t.Errorf("%s %q, want the step attempt span's %s", what, seen, wantTP)
					}
				case "pause":
					if s.TraceID != traceID || s.ParentSpanID != runSpanID || s.Attributes[tracing.AttrDrainEnded] != true ||
						s.Attributes[tracing.AttrDrainTimedOut] != false || s.Attributes[tracing.AttrPauseReason] != "maintenance" {
						t.Errorf("pause span %+v: want a child of the run span, drain ended in time, reason maintenance", s)
					}
					if d, _ := s.Attributes[tracing.AttrDrainSeconds].(float64); d < 0.5 {
						t.Errorf("pause span drain seconds %v: the command ran about 2 s", s.Attributes[tracing.AttrDrainSeconds])
					}
				case "POST /v1/runs/{runId}/pause":
					if s.TraceID != callerTrace || s.ParentSpanID != callerSpan || len(s.Links) != 1 || s.Links[0].TraceID != traceID || s.Links[0].SpanID != runSpanID {
						t.Errorf("pause request span %+v: want a child of the caller's span, linked to the run span", s)
					}
				default: // the start and the resume, without a traceparent
					if code, _ := s.Attributes[tracing.AttrHTTPStatusCode].(int64); s.TraceID != traceID || s.ParentSpanID != runSpanID || code < 200 || code > 299 {
						t.Errorf("request span %+v: want a child of the run span, answered 2xx", s)
					}
				}
			}
		})
	}
}

// TestE2E_TracingOff: without OTEL_* variables, and with
// OTEL_SDK_DISABLED=true beside an endpoint, the sidecar exports nothing
// and gives the steps and Conductor no trace context.
func TestE2E_TracingOff(t *testing.T) {
	col := tracingtest.Start(t)
	for _, c := range []struct {
		name string
		env  []string
	}{
		{"NoVariables", nil},
		{"SDKDisabled", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.HTTP, "OTEL_SDK_DISABLED=true", "OTEL_BSP_SCHEDULE_DELAY=100"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := sidecartest.Start(t, sidecartest.Options{Env: environ(c.env...)})
			run := runTracingPlan(t, newProc(s), nil)
			if run.commandTP != "" || run.httpTP != "" || run.inputTC != nil {
				t.Errorf("trace context while off: TRACEPARENT %q, traceparent header %q, workflow _trace_context %v", run.commandTP, run.httpTP, run.inputTC)
			}
			s.Stop(syscall.SIGTERM) // a Tracer would flush now
			if b, _ := os.ReadFile(s.Log.Name()); bytes.Contains(b, []byte("exporting traces")) {
				t.Errorf("the sidecar says it exports traces:\n%s", b)
			}
		})
	}
	time.Sleep(time.Second) // the collector's file exporter flushes every 50 ms
	if spans := col.Spans(t); len(spans) != 0 {
		t.Fatalf("the collector received %d spans, want none; first %+v", len(spans), spans[0])
	}
}

// TestE2E_TracingCollectorDown: with the collector unreachable the run
// completes as ever, and the exporter's errors reach the sidecar's log,
// rate limited (one line for the whole run).
func TestE2E_TracingCollectorDown(t *testing.T) {
	dead := sidecartest.FreeAddr(t) // nobody listens there
	s := sidecartest.Start(t, sidecartest.Options{Env: environ("OTEL_EXPORTER_OTLP_ENDPOINT=http://"+dead,
		"OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_EXPORTER_OTLP_TIMEOUT=500")})
	run := runTracingPlan(t, newProc(s), nil)
	if run.commandTP == "" {
		t.Error("no TRACEPARENT while tracing is on")
	}
	s.Stop(syscall.SIGTERM)
	b, _ := os.ReadFile(s.Log.Name())
	if n := bytes.Count(b, []byte("tracing: OpenTelemetry error")); n != 1 {
		t.Fatalf("the log has %d OpenTelemetry error lines, want 1 (rate limited):\n%s", n, b)
	}
	if !bytes.Contains(b, []byte(dead)) {
		t.Fatalf("the logged error does not name the collector %s:\n%s", dead, b)
	}
}

// TestE2E_TracingOutOfScopeRequest: a principal scoped to another tenant
// is answered RUN_NOT_FOUND for a run it may not see, as if it did not
// exist, and its request's span names no run: it is neither a child of
// the run's span nor linked to it, with or without a traceparent, so
// that nobody can put spans into a run's trace that is not theirs.
func TestE2E_TracingOutOfScopeRequest(t *testing.T) {
	col := tracingtest.Start(t)
	dir := t.TempDir()
	newToken := func(name string, args ...string) (token, entry string) {
		out, err := exec.Command(sidecartest.Binary(t), append([]string{"token", "new", "--name", name, "--roles", "operator,viewer,submitter"}, args...)...).Output()
		if err != nil {
			t.Fatal(err)
		}
		token, entry, _ = strings.Cut(string(out), "\n")
		return token, entry
	}
	acme, acmeEntry := newToken("acme-bot", "--tenant-id", "acme")
	globex, globexEntry := newToken("globex-bot", "--tenant-id", "globex")
	tokens := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokens, []byte("principals:\n"+acmeEntry+globexEntry), 0o600); err != nil {
		t.Fatal(err)
	}
	p := newProc(sidecartest.Start(t, sidecartest.Options{Args: []string{"--tokens-file", tokens}, Env: environ(
		"OTEL_EXPORTER_OTLP_ENDPOINT="+col.HTTP, "OTEL_SERVICE_NAME=sidecar-e2e", "OTEL_BSP_SCHEDULE_DELAY=100")}))
	p.client.Token = acme
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-trace-scope")+`","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"sleep","seconds":30}}]}`)
	started, err := p.client.Start(context.Background(), httpapi.StartRequest{RunRequestID: uniq("req"), TenantID: "acme", ProjectID: "p", EnvironmentID: "e", Plan: pl})
	if err != nil {
		t.Fatal(err)
	}
	const callerTrace, callerSpan = "11111111111111111111111111111111", "2222222222222222"
	for _, h := range []http.Header{nil, {"Traceparent": {"00-" + callerTrace + "-" + callerSpan + "-01"}}} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.addr+"/v1/runs/"+started.RunID+"/resume", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+globex)
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("another tenant's resume: %s, want 404", resp.Status)
		}
	}
	const route = "POST /v1/runs/{runId}/resume"
	spans := col.WaitSpans(t, 30*time.Second, func(all []tracingtest.Span) bool {
		n := 0
		for _, s := range all {
			if s.Name == route {
				n++
			}
		}
		return n >= 2
	})
	traceID := tracing.RunTraceID(started.RunID).String()
	for _, s := range spans {
		if s.Name != route {
			continue
		}
		if s.Attributes[tracing.AttrRunID] != nil || s.TraceID == traceID || len(s.Links) > 0 {
			t.Errorf("another tenant's refused request: span %+v; want it naming no run, outside the run's trace, unlinked", s)
		}
		if s.TraceID == callerTrace && s.ParentSpanID != callerSpan {
			t.Errorf("span %+v in the caller's trace, not a child of the caller's span", s)
		}
	}
}
