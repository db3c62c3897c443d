// Package tracing is the sidecar's OpenTelemetry traces: a span per run
// (from RunStarted to its terminal event), per step attempt, per pause
// cycle and per control request, all in the run's trace.
//
// A run's trace id is derived from its runId (RunTraceID), so every
// replica, every restart and every worker finds the same trace without
// storing anything: the run span's id is derived too, and step attempt
// spans are its children wherever they run. The trace context goes on as
// W3C traceparent to http steps (header), command steps (env TRACEPARENT)
// and Conductor (the workflow input's _trace_context). A control request
// that carries a traceparent is a span of the caller's trace, linked to
// the run's.
//
// A Tracer is passed in, never global: its provider is built from the
// OTEL_* environment (ConfigFromEnv, New) and exports over OTLP (HTTP or
// gRPC). A nil *Tracer is tracing off: every method is a no-op that costs
// a nil check.
package tracing

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// ScopeName is the instrumentation scope of the sidecar's spans.
const ScopeName = "github.com/conductor-sidecar/sidecar"

// Tracer makes the sidecar's spans and exports them. Nil is off.
type Tracer struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	log    *zap.Logger
}

// New returns the Tracer cfg asks for: nil when cfg is off (no exporter,
// no goroutine), else one exporting over OTLP with cfg.Protocol, set up
// by the exporter's own OTEL_EXPORTER_OTLP_* variables. The exporter
// connects lazily: an unreachable collector costs dropped spans and a
// logged error, never a failed start. Close flushes and stops it.
func New(ctx context.Context, cfg Config, log *zap.Logger) (*Tracer, error) {
	if !cfg.On {
		return nil, nil
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch cfg.Protocol {
	case ProtocolGRPC:
		exp, err = otlptracegrpc.New(ctx)
	case ProtocolHTTP, "":
		exp, err = otlptracehttp.New(ctx)
	default:
		return nil, fmt.Errorf("%w: protocol %q", ErrConfigInvalid, cfg.Protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: OTLP exporter: %w", ErrConfigInvalid, err)
	}
	// host.name tells the replicas apart (a pod's name on Kubernetes).
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", DefaultServiceName)), resource.WithHost(), resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("%w: resource: %w", ErrConfigInvalid, err)
	}
	log.Info("exporting traces over OTLP", zap.String("protocol", cfg.Protocol), zap.String("endpoint", redactEndpoint(cfg.Endpoint)))
	return newTracer(sdktrace.WithBatcher(exp), res, log), nil
}

// newTracer returns a Tracer whose provider sends spans through proc.
func newTracer(proc sdktrace.TracerProviderOption, res *resource.Resource, log *zap.Logger) *Tracer {
	tp := sdktrace.NewTracerProvider(proc, sdktrace.WithResource(res), sdktrace.WithIDGenerator(idGenerator{}))
	return &Tracer{tp: tp, tracer: tp.Tracer(ScopeName), log: log.Named("tracing")}
}

// FlushTimeout bounds how long Close waits for the collector to take the
// spans still buffered.
const FlushTimeout = 2 * time.Second

// Close exports the spans still buffered, within ctx and at most
// FlushTimeout, and stops the exporter. A collector that does not take
// them by then (down, or holding the connection without an answer) costs
// the spans, with one warning, and is no error of the shutdown: what they
// showed is in the run event log, and a stop must not wait on it, nor
// fail for it.
func (t *Tracer) Close(ctx context.Context) error {
	if t == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, FlushTimeout)
	defer cancel()
	if err := t.tp.Shutdown(ctx); err != nil {
		t.log.Warn("tracing: the spans still buffered at shutdown were not exported: the collector did not take them in time", zap.Duration("waited", FlushTimeout), zap.Error(err))
	}
	return nil
}

// RunTraceID is the trace id of runID's trace: the first 16 bytes of the
// SHA-256 of "conductor-sidecar/run", a NUL byte and the runId.
func RunTraceID(runID string) trace.TraceID {
	var id trace.TraceID
	h := sha256.Sum256([]byte("conductor-sidecar/run\x00" + runID))
	copy(id[:], h[:16])
	if !id.IsValid() {
		id[15] = 1
	}
	return id
}

// runSpanID is the span id of runID's run span: the SHA-256's next 8 bytes.
func runSpanID(runID string) trace.SpanID {
	h := sha256.Sum256([]byte("conductor-sidecar/run\x00" + runID))
	return spanID(h[16:24])
}

// pauseSpanID is the span id of runID's pause cycle: one per cycle.
func pauseSpanID(runID string, cycle int64) trace.SpanID {
	h := sha256.Sum256([]byte("conductor-sidecar/pause\x00" + runID + "\x00" + strconv.FormatInt(cycle, 10)))
	return spanID(h[:8])
}

func spanID(b []byte) trace.SpanID {
	var id trace.SpanID
	copy(id[:], b)
	if !id.IsValid() {
		id[7] = 1
	}
	return id
}

// RunContext is the span context of runID's run span, as a sampled
// remote parent: the parent of its step attempt spans, pause cycle spans
// and control requests, and what Conductor and the steps are given.
func RunContext(runID string) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: RunTraceID(runID), SpanID: runSpanID(runID), TraceFlags: trace.FlagsSampled, Remote: true,
	})
}

// Traceparent is sc as a W3C traceparent header value ("" when sc is
// not valid).
func Traceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c["traceparent"]
}

// WorkflowTraceContext is the value of the _trace_context variable of
// runID's workflow input: the run span's W3C trace context
// ({"traceparent": "00-<trace id>-<span id>-01"}), the shape of
// Conductor's trace context proposal. Nil when t is off.
func (t *Tracer) WorkflowTraceContext(runID string) map[string]any {
	if t == nil {
		return nil
	}
	return map[string]any{"traceparent": Traceparent(RunContext(runID))}
}

// forcedIDs, in a span's start context, are the ids idGenerator gives it.
type forcedIDs struct {
	trace trace.TraceID
	span  trace.SpanID
}

type forcedKey struct{}

// withIDs makes the root span started with ctx take ids.
func withIDs(ctx context.Context, traceID trace.TraceID, spanID trace.SpanID) context.Context {
	return context.WithValue(ctx, forcedKey{}, forcedIDs{trace: traceID, span: spanID})
}

// idGenerator gives random ids, except to a span started with withIDs:
// the run and pause cycle spans, whose ids are derived.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if f, ok := ctx.Value(forcedKey{}).(forcedIDs); ok {
		return f.trace, f.span
	}
	var tid trace.TraceID
	binary.NativeEndian.PutUint64(tid[:8], rand.Uint64())
	binary.NativeEndian.PutUint64(tid[8:], rand.Uint64())
	return tid, randomSpanID()
}

func (idGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if f, ok := ctx.Value(forcedKey{}).(forcedIDs); ok {
		return f.span
	}
	return randomSpanID()
}

func randomSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		binary.NativeEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}

// redactEndpoint is endpoint with the password of any user info masked.
func redactEndpoint(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.User == nil {
		return endpoint
	}
	return u.Redacted()
}
