package tracing_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/tracing"
)

// offHooks is every hook the sidecar calls on its hot paths (a step
// attempt, a control request, a workflow start), with tracing off.
func offHooks(tr *tracing.Tracer, r *http.Request, began time.Time) {
	s := tr.StartStep(tracing.Step{RunID: "run-1", StepID: "a", Executor: "noop", TaskID: "t", LogicalAttempt: 1, EngineAttempt: 1}, began)
	_ = s.Traceparent()
	s.End(tracing.OutcomeCompleted, "")
	r, q := tr.BeginRequest(r, "/v1/runs/{runId}/pause")
	tracing.RequestFrom(r.Context()).SetRunID("run-1")
	q.End(http.StatusOK, "")
	_ = tr.WorkflowTraceContext("run-1")
}

// TestTracer_OffAllocatesNothing: with tracing off (the nil Tracer) the
// hooks allocate nothing.
func TestTracer_OffAllocatesNothing(t *testing.T) {
	var tr *tracing.Tracer
	r := httptest.NewRequest(http.MethodPost, "/v1/runs/run-1/pause", nil)
	began := time.Now()
	if n := testing.AllocsPerRun(1000, func() { offHooks(tr, r, began) }); n != 0 {
		t.Fatalf("the hooks allocate %v times per step while tracing is off, want 0", n)
	}
}

// BenchmarkHooksOff is the cost of the hooks with tracing off: a nil
// check each (allocs 0).
func BenchmarkHooksOff(b *testing.B) {
	var tr *tracing.Tracer
	r := httptest.NewRequest(http.MethodPost, "/v1/runs/run-1/pause", nil)
	began := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		offHooks(tr, r, began)
	}
}
