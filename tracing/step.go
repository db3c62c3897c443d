package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of the sidecar's spans.
const (
	AttrRunID           = "sidecar.run_id"
	AttrBulkRuns        = "sidecar.bulk.runs"
	AttrStepID          = "sidecar.step_id"
	AttrLogicalAttempt  = "sidecar.step.logical_attempt"
	AttrEngineAttempt   = "sidecar.step.engine_attempt"
	AttrExecutor        = "sidecar.step.executor"
	AttrOutcome         = "sidecar.step.outcome"
	AttrErrorCode       = "sidecar.error_code"
	AttrRunStatus       = "sidecar.run.status"
	AttrPlanID          = "sidecar.plan_id"
	AttrPlanVersion     = "sidecar.plan_version"
	AttrPauseCycle      = "sidecar.pause.cycle"
	AttrDrainSeconds    = "sidecar.drain.seconds"
	AttrDrainTimedOut   = "sidecar.drain.timed_out"
	AttrDrainEnded      = "sidecar.drain.ended"
	AttrPauseReason     = "sidecar.pause.reason"
	AttrRequestedBy     = "sidecar.requested_by"
	AttrHTTPMethod      = "http.request.method"
	AttrHTTPRoute       = "http.route"
	AttrHTTPStatusCode  = "http.response.status_code"
	AttrConductorTaskID = "sidecar.conductor.task_id"
)

// The outcomes of a step attempt span (AttrOutcome).
const (
	// OutcomeCompleted: StepCompleted recorded.
	OutcomeCompleted = "completed"
	// OutcomeFailed: StepFailed recorded (the logical attempt failed).
	OutcomeFailed = "failed"
	// OutcomeRetried: the engine try failed and Conductor retries it.
	OutcomeRetried = "retried"
	// OutcomeHeld: StepFailed recorded and the run paused (onStepFailure
	// pause).
	OutcomeHeld = "held"
	// OutcomeHandedBack: the try ended without an outcome (shutdown, an
	// executor that could not run); another try runs the attempt.
	OutcomeHandedBack = "handed_back"
	// OutcomeKept: the outcome waits for the state store and is recorded
	// when Conductor offers the task again.
	OutcomeKept = "kept"
	// OutcomeRefused: another worker recorded the attempt's outcome first.
	OutcomeRefused = "refused"
)

// StepSpan is one step attempt's span, a child of the run span. Nil is
// off.
type StepSpan struct {
	span trace.Span
}

// Step describes a step attempt for StartStep.
type Step struct {
	RunID, StepID, Executor, TaskID string
	LogicalAttempt, EngineAttempt   int64
}

// StartStep starts the span of a step attempt (named "step <stepId>"),
// a child of the run's span, beginning at began. Nil when t is off.
func (t *Tracer) StartStep(s Step, began time.Time) *StepSpan {
	if t == nil {
		return nil
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), RunContext(s.RunID))
	_, span := t.tracer.Start(ctx, "step "+s.StepID, trace.WithTimestamp(began), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String(AttrRunID, s.RunID), attribute.String(AttrStepID, s.StepID),
			attribute.String(AttrExecutor, s.Executor), attribute.String(AttrConductorTaskID, s.TaskID),
			attribute.Int64(AttrLogicalAttempt, s.LogicalAttempt), attribute.Int64(AttrEngineAttempt, s.EngineAttempt),
		))
	return &StepSpan{span: span}
}

// Traceparent is the span's W3C traceparent: what the step's command
// (TRACEPARENT) and http request (traceparent header) are given. "" when
// off.
func (s *StepSpan) Traceparent() string {
	if s == nil {
		return ""
	}
	return Traceparent(s.span.SpanContext())
}

// End ends the span with the attempt's outcome (Outcome*) and, for a
// failure, its error code, which marks the span as an error.
func (s *StepSpan) End(outcome, errorCode string) {
	if s == nil {
		return
	}
	s.span.SetAttributes(attribute.String(AttrOutcome, outcome))
	if errorCode != "" {
		s.span.SetAttributes(attribute.String(AttrErrorCode, errorCode))
	}
	if outcome == OutcomeFailed || outcome == OutcomeHeld || outcome == OutcomeRetried {
		s.span.SetStatus(codes.Error, errorCode)
	}
	s.span.End()
}
