package tracing

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Log is the run event log as RunSpans reads it.
type Log interface {
	statestore.Follower
	statestore.Fetcher
}

// Owner tells whether this replica makes the spans of a run
// (membership.Members.Owns; nil: this one makes them all).
type Owner interface {
	Owns(runID string) bool
}

// RunSpans makes the run and pause cycle spans from the log: it follows
// the log from where it was when Open was called and, when a run is
// resumed or ends, reads the run's events and makes the span of the pause
// cycle that ended (RunPaused to RunResumed, with the drain's duration and
// whether it timed out) and, at its terminal event, the run's span
// (RunStarted to RunCompleted, RunFailed or RunCancelled). Span ids are
// derived from the runId (and the pause cycle), so a span made twice (a
// replica taking over mid-batch) has the same identity. Runs that end
// while no replica follows the log get no run span.
type RunSpans struct {
	t     *Tracer
	log   Log
	owner Owner
	zl    *zap.Logger
	poll  time.Duration

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// RunSpansOptions configures NewRunSpans.
type RunSpansOptions struct {
	Owner Owner
	// Poll is how often the log is read when nothing is new (default 1 s).
	Poll   time.Duration
	Logger *zap.Logger
}

// NewRunSpans returns the run span maker of t over log (nil when t is
// off: Open and Close then do nothing).
func NewRunSpans(t *Tracer, log Log, opts RunSpansOptions) *RunSpans {
	if t == nil {
		return nil
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	return &RunSpans{t: t, log: log, owner: opts.Owner, zl: opts.Logger.Named("tracing"), poll: opts.Poll}
}

// Open starts following the log after its last event now.
func (r *RunSpans) Open(ctx context.Context) error {
	if r == nil {
		return nil
	}
	seq, err := r.log.LastSeq(ctx)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.follow(lctx, seq)
	}()
	return nil
}

// Close stops following the log.
func (r *RunSpans) Close(context.Context) error {
	if r == nil || r.cancel == nil {
		return nil
	}
	r.cancel()
	r.wg.Wait()
	return nil
}

func (r *RunSpans) follow(ctx context.Context, cursor uint64) {
	var tail statestore.LogTail
	defer func() {
		if tail != nil {
			tail.Close()
		}
	}()
	wait := r.poll
	for ctx.Err() == nil {
		if tail == nil {
			var err error
			if tail, err = r.log.Follow(ctx, cursor); err != nil {
				r.zl.Warn("tracing: cannot follow the log; retrying", zap.Error(err))
				tail = nil
				wait = min(2*wait, 30*time.Second)
			}
		}
		if tail != nil {
			recs, next, err := tail.Next(ctx, 256)
			switch {
			case err != nil && ctx.Err() == nil:
				r.zl.Warn("tracing: reading the log failed; retrying", zap.Error(err))
				tail.Close()
				tail, wait = nil, min(2*wait, 30*time.Second)
			case err == nil:
				wait = r.poll
				for _, rec := range recs {
					r.onEvent(ctx, rec)
				}
				if next != cursor {
					cursor = next
					continue // more may be waiting
				}
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// onEvent makes the spans that rec closes.
func (r *RunSpans) onEvent(ctx context.Context, rec statestore.RunEventRecord) {
	ends := endsRun(rec.EventType)
	if !ends && rec.EventType != statestore.RunResumed {
		return
	}
	if r.owner != nil && !r.owner.Owns(rec.RunID) {
		return
	}
	events, err := r.fetchRun(ctx, rec.RunID, rec.RunSeq)
	if err != nil {
		r.zl.Warn("tracing: cannot read the run's events; its spans are not made", zap.String("runId", rec.RunID), zap.Error(err))
		return
	}
	run, pauses := spansOf(events)
	for _, p := range pauses {
		if (rec.EventType == statestore.RunResumed && p.cycle == rec.LogicalAttemptID) || (ends && !p.resumed) {
			r.t.pauseSpan(rec.RunID, p)
		}
	}
	if ends && run != nil {
		r.t.runSpan(rec.RunID, *run)
	}
}

// fetchRun reads the run's events up to runSeq through.
func (r *RunSpans) fetchRun(ctx context.Context, runID string, through int64) ([]statestore.RunEventRecord, error) {
	var all []statestore.RunEventRecord
	after := int64(0)
	for {
		recs, err := r.log.Fetch(ctx, runID, after, 1000)
		if err != nil {
			return nil, err
		}
		for _, rec := range recs {
			if rec.RunSeq > through {
				return all, nil
			}
			all = append(all, rec)
		}
		if len(recs) < 1000 {
			return all, nil
		}
		after = recs[len(recs)-1].RunSeq
	}
}

func endsRun(eventType string) bool {
	return eventType == statestore.RunCompleted || eventType == statestore.RunFailed || eventType == statestore.RunCancelled
}

// runSpanData is a run's span as its events tell it.
type runSpanData struct {
	start, end          time.Time
	status, planID, ver string
	ended               bool
}

// pauseSpanData is one pause cycle.
type pauseSpanData struct {
	cycle               int64
	start, end          time.Time
	drainEnd            time.Time
	drainEnded, timeout bool
	resumed             bool
	reason, by          string
}

// spansOf reads a run's events (in runSeq order) into its run span and
// its pause cycles. A cycle not resumed ends at the run's last event.
func spansOf(events []statestore.RunEventRecord) (*runSpanData, []pauseSpanData) {
	if len(events) == 0 {
		return nil, nil
	}
	run := &runSpanData{start: at(events[0].PersistedAt), planID: events[0].PlanID, ver: events[0].PlanVersion}
	var pauses []pauseSpanData
	cycle := func(n int64) *pauseSpanData {
		for i := range pauses {
			if pauses[i].cycle == n {
				return &pauses[i]
			}
		}
		return nil
	}
	var last time.Time
	for _, e := range events {
		when := at(e.PersistedAt)
		last = when
		switch e.EventType {
		case statestore.RunStarted:
			run.start = when
		case statestore.RunPaused:
			if cycle(e.LogicalAttemptID) == nil {
				var p struct{ Reason, RequestedBy string }
				_ = json.Unmarshal(e.Payload, &p)
				pauses = append(pauses, pauseSpanData{cycle: e.LogicalAttemptID, start: when, reason: p.Reason, by: p.RequestedBy})
			}
		case statestore.RunDrainCompleted, statestore.RunDrainTimedOut:
			if p := cycle(e.LogicalAttemptID); p != nil && !p.drainEnded {
				p.drainEnded, p.drainEnd, p.timeout = true, when, e.EventType == statestore.RunDrainTimedOut
			}
		case statestore.RunResumed:
			if p := cycle(e.LogicalAttemptID); p != nil && !p.resumed {
				p.resumed, p.end = true, when
			}
		case statestore.RunCompleted, statestore.RunFailed, statestore.RunCancelled:
			if !run.ended {
				run.ended, run.end, run.status = true, when, e.EventType
			}
		}
	}
	for i := range pauses {
		if !pauses[i].resumed {
			pauses[i].end = last
		}
	}
	if !run.ended {
		run.end = last
	}
	return run, pauses
}

func at(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

// runSpan exports a run's span: a root with the derived ids.
func (t *Tracer) runSpan(runID string, d runSpanData) {
	ctx := withIDs(context.Background(), RunTraceID(runID), runSpanID(runID))
	_, span := t.tracer.Start(ctx, "run "+d.planID, trace.WithNewRoot(), trace.WithTimestamp(d.start), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String(AttrRunID, runID), attribute.String(AttrPlanID, d.planID), attribute.String(AttrPlanVersion, d.ver),
			attribute.String(AttrRunStatus, d.status)))
	if d.status == statestore.RunFailed {
		span.SetStatus(codes.Error, d.status)
	}
	span.End(trace.WithTimestamp(d.end))
}

// pauseSpan exports a pause cycle's span, a child of the run's.
func (t *Tracer) pauseSpan(runID string, p pauseSpanData) {
	parent := trace.ContextWithRemoteSpanContext(context.Background(), RunContext(runID))
	ctx := withIDs(parent, RunTraceID(runID), pauseSpanID(runID, p.cycle))
	attrs := []attribute.KeyValue{attribute.String(AttrRunID, runID), attribute.Int64(AttrPauseCycle, p.cycle),
		attribute.Bool(AttrDrainEnded, p.drainEnded), attribute.Bool(AttrDrainTimedOut, p.timeout)}
	if p.drainEnded {
		attrs = append(attrs, attribute.Float64(AttrDrainSeconds, p.drainEnd.Sub(p.start).Seconds()))
	}
	if p.reason != "" {
		attrs = append(attrs, attribute.String(AttrPauseReason, p.reason))
	}
	if p.by != "" {
		attrs = append(attrs, attribute.String(AttrRequestedBy, p.by))
	}
	_, span := t.tracer.Start(ctx, "pause", trace.WithTimestamp(p.start), trace.WithAttributes(attrs...))
	if p.drainEnded {
		name := "drain completed"
		if p.timeout {
			name = "drain timed out (" + statestore.PauseDrainTimeoutCode + ")"
		}
		span.AddEvent(name, trace.WithTimestamp(p.drainEnd))
	}
	if p.timeout {
		span.SetStatus(codes.Error, statestore.PauseDrainTimeoutCode)
	}
	span.End(trace.WithTimestamp(p.end))
}
