package tracing_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/tracing"
	"github.com/conductor-sidecar/sidecar/tracing/tracingtest"
)

func TestConfigFromEnv(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want tracing.Config
		bad  bool
	}{
		{"NoneSet", nil, tracing.Config{}, false},
		{"Endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, tracing.Config{On: true, Protocol: tracing.ProtocolHTTP, Endpoint: "http://c:4318"}, false},
		{"TracesEndpointGRPC", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, tracing.Config{On: true, Protocol: tracing.ProtocolGRPC, Endpoint: "http://c:4317"}, false},
		{"TracesProtocolWins", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, tracing.Config{On: true, Protocol: tracing.ProtocolHTTP, Endpoint: "http://c"}, false},
		{"SDKDisabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_SDK_DISABLED": "true"}, tracing.Config{}, false},
		{"ExporterNone", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_EXPORTER": "none"}, tracing.Config{}, false},
		{"ErrUnknownProtocol", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, tracing.Config{}, true},
		{"ErrUnknownExporter", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_EXPORTER": "zipkin"}, tracing.Config{}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := tracing.ConfigFromEnv(func(k string) string { return c.env[k] })
			if c.bad {
				if !errors.Is(err, tracing.ErrConfigInvalid) || !errors.Is(err, errcode.Invalid) {
					t.Fatalf("got err %v, want TRACING_CONFIG_INVALID", err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

// TestTracer_SpansReachACollector: with OTEL_* pointing at a real
// collector, over each protocol, a run's spans (run, step attempt, pause
// cycle, control requests) arrive in the run's trace, with the caller's
// trace honoured and linked.
func TestTracer_SpansReachACollector(t *testing.T) {
	col := tracingtest.Start(t)
	for _, proto := range []string{tracing.ProtocolHTTP, tracing.ProtocolGRPC} {
		t.Run(proto, func(t *testing.T) {
			ep := col.HTTP
			if proto == tracing.ProtocolGRPC {
				ep = col.GRPC
			}
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", ep)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", proto)
			t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
			t.Setenv("OTEL_SERVICE_NAME", "sidecar-test")
			cfg, err := tracing.ConfigFromEnv(func(k string) string { return getenv(k) })
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			tr, err := tracing.New(ctx, cfg, zaptest.NewLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			js, _ := natstest.Start(t)
			store, err := natsstore.Open(ctx, js, natsstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			rs := tracing.NewRunSpans(tr, store, tracing.RunSpansOptions{Poll: 20 * time.Millisecond, Logger: zaptest.NewLogger(t)})
			if err := rs.Open(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = rs.Close(ctx) })

			runID := "run-" + proto
			ref := statestore.RunRef{RunID: runID, TenantID: "t", ProjectID: "p", EnvironmentID: "e", PlanID: "plan", PlanVersion: "1"}
			appendEv := func(eventType, stepID string, attempt int64, payload any) {
				t.Helper()
				ev, err := statestore.NewEvent(ref, eventType, stepID, 1, attempt, payload)
				if err != nil {
					t.Fatal(err)
				}
				ev.EventID = uuid.NewString()
				if _, err := store.Append(ctx, ev); err != nil {
					t.Fatal(err)
				}
			}
			appendEv(statestore.RunStarted, "", 1, map[string]any{"engineRunRef": "conductor://w/1", "engineType": "conductor"})

			// A control request from a caller with its own trace.
			caller := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			req := httptest.NewRequest(http.MethodPost, "/v1/runs/"+runID+"/pause", nil)
			req.SetPathValue("runId", runID)
			req.Header.Set("traceparent", caller)
			_, q := tr.BeginRequest(req, "/v1/runs/{runId}/pause")
			q.End(http.StatusOK, "")
			// One without: a child of the run's span.
			req2 := httptest.NewRequest(http.MethodPost, "/v1/runs/"+runID+"/resume", nil)
			req2.SetPathValue("runId", runID)
			req2.Header.Set("traceparent", "not a traceparent")
			_, q2 := tr.BeginRequest(req2, "/v1/runs/{runId}/resume")
			q2.End(http.StatusConflict, "INVALID_TRANSITION")
			// One refused before it reached the run (no valid credentials):
			// neither in the run's trace nor in the caller's, which anyone
			// could name.
			req3 := httptest.NewRequest(http.MethodPost, "/v1/runs/"+runID+"/cancel", nil)
			req3.SetPathValue("runId", runID)
			req3.Header.Set("traceparent", "00-1bf7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
			_, q3 := tr.BeginRequest(req3, "/v1/runs/{runId}/cancel")
			q3.End(http.StatusUnauthorized, "UNAUTHENTICATED")
			// A bulk action that acted on the run: a span of it in the
			// run's trace, linked to the request's own.
			req4 := httptest.NewRequest(http.MethodPost, "/v1/runs:pause", nil)
			_, q4 := tr.BeginRequest(req4, "/v1/runs:pause")
			q4.ActedOn([]string{runID})
			q4.End(http.StatusOK, "")

			step := tr.StartStep(tracing.Step{RunID: runID, StepID: "a", Executor: "command", TaskID: "task-1", LogicalAttempt: 1, EngineAttempt: 2}, time.Now())
			if tp := step.Traceparent(); len(tp) != 55 || tp[3:35] != tracing.RunTraceID(runID).String() {
				t.Fatalf("step traceparent %q is not in the run's trace %s", tp, tracing.RunTraceID(runID))
			}
			appendEv(statestore.StepStarted, "a", 1, nil)
			appendEv(statestore.RunPaused, "", 1, map[string]any{"reason": "maintenance", "requestedBy": "alice"})
			time.Sleep(20 * time.Millisecond)
			appendEv(statestore.StepCompleted, "a", 1, map[string]any{})
			step.End(tracing.OutcomeCompleted, "")
			appendEv(statestore.RunDrainCompleted, "", 1, map[string]any{"waitedSeconds": 0})
			appendEv(statestore.RunResumed, "", 1, map[string]any{"requestedBy": "alice"})
			appendEv(statestore.RunCompleted, "", 1, map[string]any{})

			traceID := tracing.RunTraceID(runID).String()
			runSpanID := tracing.RunContext(runID).SpanID().String()
			want := map[string]bool{"run plan": false, "step a": false, "pause": false, "POST /v1/runs/{runId}/pause": false, "POST /v1/runs/{runId}/resume": false,
				"POST /v1/runs:pause": false}
			// The follower makes the run span once it read RunCompleted;
			// Close then exports what is buffered.
			time.Sleep(500 * time.Millisecond)
			_ = rs.Close(ctx)
			if err := tr.Close(ctx); err != nil {
				t.Fatal(err)
			}
			refused := "POST /v1/runs/{runId}/cancel"
			spans := col.WaitSpans(t, 10*time.Second, func(all []tracingtest.Span) bool {
				n := 0
				for _, s := range all {
					if s.Attributes[tracing.AttrRunID] == runID || (s.Name == refused && s.Attributes[tracing.AttrHTTPStatusCode] == int64(401)) {
						n++
					}
				}
				return n >= len(want)+1
			})
			for _, s := range spans {
				if s.Name == refused && s.Attributes[tracing.AttrHTTPStatusCode] == int64(401) {
					if s.TraceID == traceID || s.TraceID == "1bf7651916cd43dd8448eb211c80319c" || s.ParentSpanID != "" || len(s.Links) != 0 || s.Attributes[tracing.AttrRunID] != nil {
						t.Errorf("refused request span %+v: want a root of its own, no run, no caller, no link", s)
					}
				}
			}
			for _, s := range spans {
				if s.Attributes[tracing.AttrRunID] != runID {
					continue
				}
				if _, ok := want[s.Name]; !ok {
					t.Errorf("unexpected span %q", s.Name)
					continue
				}
				want[s.Name] = true
				if s.Service != "sidecar-test" {
					t.Errorf("span %s: service %q, want sidecar-test (OTEL_SERVICE_NAME)", s.Name, s.Service)
				}
				switch s.Name {
				case "run plan":
					if s.TraceID != traceID || s.SpanID != runSpanID || s.ParentSpanID != "" || s.Attributes[tracing.AttrRunStatus] != statestore.RunCompleted {
						t.Errorf("run span %+v: want trace %s, id %s, no parent, status RunCompleted", s, traceID, runSpanID)
					}
				case "step a":
					if s.TraceID != traceID || s.ParentSpanID != runSpanID || s.Attributes[tracing.AttrEngineAttempt] != int64(2) ||
						s.Attributes[tracing.AttrLogicalAttempt] != int64(1) || s.Attributes[tracing.AttrOutcome] != tracing.OutcomeCompleted ||
						s.Attributes[tracing.AttrExecutor] != "command" {
						t.Errorf("step span %+v: want a child of the run span with attempts 1/2, outcome completed", s)
					}
				case "pause":
					if s.TraceID != traceID || s.ParentSpanID != runSpanID || s.Attributes[tracing.AttrDrainTimedOut] != false ||
						s.Attributes[tracing.AttrDrainEnded] != true || s.Attributes[tracing.AttrPauseReason] != "maintenance" {
						t.Errorf("pause span %+v: want a child of the run span, drain ended, not timed out", s)
					}
					if d, _ := s.Attributes[tracing.AttrDrainSeconds].(float64); d < 0.02 {
						t.Errorf("pause span drain seconds %v, want >= 0.02", s.Attributes[tracing.AttrDrainSeconds])
					}
				case "POST /v1/runs/{runId}/pause":
					if s.TraceID != "0af7651916cd43dd8448eb211c80319c" || s.ParentSpanID != "b7ad6b7169203331" ||
						len(s.Links) != 1 || s.Links[0].TraceID != traceID || s.Links[0].SpanID != runSpanID {
						t.Errorf("pause request span %+v: want a child of the caller's span, linked to the run's", s)
					}
				case "POST /v1/runs:pause":
					if s.TraceID != traceID || s.ParentSpanID != runSpanID || len(s.Links) != 1 || s.Links[0].TraceID == traceID {
						t.Errorf("bulk pause's span in the run's trace %+v: want a child of the run span, linked to the request's span", s)
					}
				case "POST /v1/runs/{runId}/resume":
					if s.TraceID != traceID || s.ParentSpanID != runSpanID || s.Attributes[tracing.AttrErrorCode] != "INVALID_TRANSITION" ||
						s.Attributes[tracing.AttrHTTPStatusCode] != int64(409) {
						t.Errorf("resume request span %+v: want a child of the run span (bad traceparent ignored), 409 INVALID_TRANSITION", s)
					}
				}
			}
			for name, seen := range want {
				if !seen {
					t.Errorf("no span %q", name)
				}
			}
		})
	}
}

// TestTracer_Off: without a configuration no Tracer is built, and every
// method of the nil Tracer is a no-op.
func TestTracer_Off(t *testing.T) {
	tr, err := tracing.New(context.Background(), tracing.Config{}, zaptest.NewLogger(t))
	if err != nil || tr != nil {
		t.Fatalf("got %v, %v; want nil, nil", tr, err)
	}
	s := tr.StartStep(tracing.Step{RunID: "r", StepID: "a"}, time.Now())
	if s.Traceparent() != "" {
		t.Fatal("traceparent while off")
	}
	s.End(tracing.OutcomeCompleted, "")
	r, q := tr.BeginRequest(httptest.NewRequest(http.MethodPost, "/v1/runs", nil), "/v1/runs")
	q.SetRunID("r")
	q.End(200, "")
	if tracing.RequestFrom(r.Context()) != nil || tr.WorkflowTraceContext("r") != nil || tr.Close(context.Background()) != nil {
		t.Fatal("off tracer did something")
	}
	if tracing.NewRunSpans(tr, nil, tracing.RunSpansOptions{}) != nil {
		t.Fatal("run spans while off")
	}
}

func getenv(k string) string { return lookupEnv(k) }
