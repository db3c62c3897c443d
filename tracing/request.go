package tracing

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Request is one control request's span, made when the request ends.
// Its parent is the caller's span when the request carries a valid W3C
// traceparent (the span is then linked to the run's trace), else the
// run's span when the request names a run. Nil is off.
type Request struct {
	t      *Tracer
	began  time.Time
	caller trace.SpanContext
	name   string
	method string
	route  string
	runID  string
	// runs are the runs a bulk action acted on (ActedOn).
	runs []string
}

// MaxBulkRunSpans bounds the spans a bulk action adds to the traces of
// the runs it acted on (ActedOn): the first so many runs get one each.
const MaxBulkRunSpans = 1000

// ActedOn names the runs a bulk request acted on: each gets a span of the
// request in its own trace, a child of its run span linked to the
// request's span (at most MaxBulkRunSpans), and the request's span counts
// them (sidecar.bulk.runs).
func (q *Request) ActedOn(runIDs []string) {
	if q != nil {
		q.runs = append(q.runs, runIDs...)
	}
}

type requestKey struct{}

// BeginRequest notes the start of a control request on route (the
// pattern's path) and returns r with the Request in its context, where
// RequestFrom finds it. An invalid traceparent is ignored. Nil when t is
// off.
func (t *Tracer) BeginRequest(r *http.Request, route string) (*http.Request, *Request) {
	if t == nil {
		return r, nil
	}
	q := &Request{t: t, began: time.Now(), method: r.Method, route: route, name: r.Method + " " + route, runID: r.PathValue("runId")}
	q.caller = trace.SpanContextFromContext(propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
	return r.WithContext(context.WithValue(r.Context(), requestKey{}, q)), q
}

// RequestFrom is the Request BeginRequest put in ctx (nil: none).
func RequestFrom(ctx context.Context) *Request {
	q, _ := ctx.Value(requestKey{}).(*Request)
	return q
}

// SetRunID names the run a request acted on when its path does not (a
// start).
func (q *Request) SetRunID(runID string) {
	if q != nil {
		q.runID = runID
	}
}

// End makes the request's span, from BeginRequest to now, with the
// answer's status and error code (a 5xx is an error). A request refused
// for its credentials or its role (401, 403) is a root span of its own,
// naming no run and no caller's trace.
func (q *Request) End(status int, errorCode string) {
	if q == nil {
		return
	}
	opts := []trace.SpanStartOption{trace.WithTimestamp(q.began), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String(AttrHTTPMethod, q.method), attribute.String(AttrHTTPRoute, q.route), attribute.Int(AttrHTTPStatusCode, status))}
	ctx := context.Background()
	if status == http.StatusUnauthorized || status == http.StatusForbidden {
		// Refused before it reached the run: a root of its own, neither
		// in the run's trace nor in a caller's that anyone could name.
		q.caller, q.runID = trace.SpanContext{}, ""
	}
	switch {
	case q.caller.IsValid():
		ctx = trace.ContextWithRemoteSpanContext(ctx, q.caller)
		if q.runID != "" {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: RunContext(q.runID)}))
		}
	case q.runID != "":
		ctx = trace.ContextWithRemoteSpanContext(ctx, RunContext(q.runID))
	default:
		opts = append(opts, trace.WithNewRoot())
	}
	if q.runID != "" {
		opts = append(opts, trace.WithAttributes(attribute.String(AttrRunID, q.runID)))
	}
	if len(q.runs) > 0 {
		opts = append(opts, trace.WithAttributes(attribute.Int(AttrBulkRuns, len(q.runs))))
	}
	_, span := q.t.tracer.Start(ctx, q.name, opts...)
	end(span, status, errorCode)
	// A bulk action in the trace of each run it acted on.
	base := []trace.SpanStartOption{trace.WithTimestamp(q.began), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithLinks(trace.Link{SpanContext: span.SpanContext()}),
		trace.WithAttributes(attribute.String(AttrHTTPMethod, q.method), attribute.String(AttrHTTPRoute, q.route), attribute.Int(AttrHTTPStatusCode, status))}
	for _, runID := range q.runs[:min(len(q.runs), MaxBulkRunSpans)] {
		_, rs := q.t.tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), RunContext(runID)), q.name,
			append(base[:len(base):len(base)], trace.WithAttributes(attribute.String(AttrRunID, runID)))...)
		end(rs, status, errorCode)
	}
}

// end ends a request's span with the answer's error code (a 5xx is an
// error).
func end(span trace.Span, status int, errorCode string) {
	if errorCode != "" {
		span.SetAttributes(attribute.String(AttrErrorCode, errorCode))
	}
	if status >= 500 {
		span.SetStatus(codes.Error, strconv.Itoa(status)+" "+errorCode)
	}
	span.End()
}
