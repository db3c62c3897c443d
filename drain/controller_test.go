package drain_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// emitter appends straight to the store (the registry protocol is tested
// in package registry).
type emitter struct{ s statestore.Store }

func (e emitter) Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	if w.EventID == "" {
		w.EventID = uuid.NewString()
	}
	return e.s.Append(ctx, w)
}

func (e emitter) EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	if w.EventID == "" {
		w.EventID = uuid.NewString()
	}
	return e.s.AppendIf(ctx, w, lastSeq)
}

// EmitBatch appends each run's events with the store's AppendBatch.
func (e emitter) EmitBatch(ctx context.Context, runs []statestore.RunBatch) []statestore.BatchResult {
	for _, b := range runs {
		for _, w := range b.Events {
			if w.EventID == "" {
				w.EventID = uuid.NewString()
			}
		}
	}
	return e.s.(statestore.BatchAppender).AppendBatch(ctx, runs)
}

// engine records Conductor calls (the real Conductor is in the end-to-end tests).
type engine struct {
	mu    sync.Mutex
	calls []string
	err   error
}

func (e *engine) call(c string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, c)
	return e.err
}
func (e *engine) Pause(_ context.Context, wf string) error  { return e.call("pause " + wf) }
func (e *engine) Resume(_ context.Context, wf string) error { return e.call("resume " + wf) }
func (e *engine) Terminate(_ context.Context, wf, _ string) error {
	return e.call("terminate " + wf)
}

func setup(t *testing.T, steps ...string) (*memstore.Store, *engine) {
	t.Helper()
	mem := memstore.New(statestore.ProjectorOptions{})
	ctx := context.Background()
	// The controller finds the run's Conductor workflow (wf1) in the
	// engineRunRef of its RunStarted.
	mem.Append(ctx, storetest.WithPayload(storetest.Event("r", statestore.RunStarted, ""),
		map[string]any{"engineRunRef": statestore.ConductorRunRef("plan", "wf1"), "engineType": "conductor"}))
	for _, s := range steps {
		mem.Append(ctx, storetest.Event("r", statestore.StepStarted, s))
	}
	return mem, &engine{}
}

func newController(t *testing.T, mem *memstore.Store, eng *engine, reg prometheus.Registerer, now func() time.Time) *drain.Controller {
	opts := drain.Options{ActiveRuns: func(context.Context) ([]string, error) { return []string{"r"}, nil }, Logger: zaptest.NewLogger(t), Now: now}
	if reg != nil {
		opts.Metrics = drain.NewMetrics(reg)
	}
	return drain.New(mem, emitter{mem}, eng, opts)
}

func TestController_PauseDrainResume(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a", "b")
	c := newController(t, mem, eng, nil, nil)
	st, err := c.Pause(ctx, "r", drain.PauseRequest{Reason: "maint", TimeoutSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != "PAUSED" || st.Substatus != "DRAINING" || st.Drain.Cycle != 1 || len(st.Drain.InFlightStepIDs) != 2 || st.Drain.TimeoutSeconds != 60 {
		t.Fatalf("after pause: %+v %+v", st, st.Drain)
	}
	// Pausing again changes nothing in the log, and pauses Conductor again.
	before, _ := mem.Fetch(ctx, "r", 0, 0)
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
	after, _ := mem.Fetch(ctx, "r", 0, 0)
	if len(after) != len(before) || len(eng.calls) != 2 {
		t.Fatalf("a second pause wrote %d events, engine calls %v", len(after)-len(before), eng.calls)
	}
	// A second pause with another timeout says it is not applied (it was
	// silently ignored before).
	again, err := c.Pause(ctx, "r", drain.PauseRequest{TimeoutSeconds: 600})
	if err != nil || !strings.Contains(again.Notice, "already paused") || !strings.Contains(again.Notice, "stays 60s") || again.Drain.TimeoutSeconds != 60 {
		t.Fatalf("second pause with another timeout: %+v %v", again, err)
	}
	// The monitor ends the drain when the last step finishes.
	mem.Append(ctx, storetest.Event("r", statestore.StepCompleted, "a"))
	if s := c.Check(ctx, "r"); s.Substatus != "DRAINING" {
		t.Fatalf("one step still running: substatus %q", s.Substatus)
	}
	mem.Append(ctx, storetest.Event("r", statestore.StepCompleted, "b"))
	c.Check(ctx, "r")
	snap, _ := mem.ProjectSnapshot(ctx, "r")
	if snap.Pause.DrainEndedAt == "" || snap.Pause.DrainTimedOut || snap.Inconsistent {
		t.Fatalf("drain not completed: %+v", snap.Pause)
	}
	if _, err := c.Resume(ctx, "r", drain.ResumeRequest{}); err != nil {
		t.Fatal(err)
	}
	// A second pause opens cycle 2.
	st, err = c.Pause(ctx, "r", drain.PauseRequest{})
	if err != nil || st.Drain.Cycle != 2 || st.Substatus != "" || st.Drain.TimeoutSeconds != 300 {
		t.Fatalf("second pause: %+v %+v %v", st, st.Drain, err)
	}
	if _, err := c.Resume(ctx, "r", drain.ResumeRequest{}); err != nil {
		t.Fatal(err)
	}
	snap, _ = mem.ProjectSnapshot(ctx, "r")
	if snap.Status != "RUNNING" || snap.Inconsistent {
		t.Fatalf("after two cycles: %s inconsistent %v", snap.Status, snap.Inconsistent)
	}
}

func TestController_InvalidActionsWriteNothing(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t)
	c := newController(t, mem, eng, nil, nil)
	if _, err := c.Resume(ctx, "r", drain.ResumeRequest{}); !errors.Is(err, statestore.ErrInvalidTransition) {
		t.Fatalf("resume a running run: %v", err)
	}
	if _, err := c.Pause(ctx, "nope", drain.PauseRequest{}); !errors.Is(err, drain.ErrRunNotFound) {
		t.Fatalf("unknown run: %v", err)
	}
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{TimeoutSeconds: -1}); !errors.Is(err, statestore.ErrSchemaValidation) {
		t.Fatalf("negative timeout: %v", err)
	}
	mem.Append(ctx, storetest.Event("r", statestore.RunCompleted, ""))
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{}); !errors.Is(err, statestore.ErrInvalidTransition) {
		t.Fatalf("pause a completed run: %v", err)
	}
	if _, err := c.Cancel(ctx, "r", "", ""); !errors.Is(err, statestore.ErrInvalidTransition) {
		t.Fatalf("cancel a completed run: %v", err)
	}
	recs, _ := mem.Fetch(ctx, "r", 0, 0)
	if len(recs) != 2 || len(eng.calls) != 0 {
		t.Fatalf("refused actions wrote %d events and called %v", len(recs)-2, eng.calls)
	}
}

func TestController_TimeoutOnceAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a")
	now := time.Now()
	clock := func() time.Time { return now }
	reg1, reg2 := prometheus.NewRegistry(), prometheus.NewRegistry()
	// Both replicas' warnings land in warns (a drain timeout logs a warning).
	warnCore, warns := observer.New(zapcore.WarnLevel)
	replica := func(reg prometheus.Registerer) *drain.Controller {
		return drain.New(mem, emitter{mem}, eng, drain.Options{Logger: zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), warnCore)),
			Metrics: drain.NewMetrics(reg), Now: clock})
	}
	c1 := replica(reg1)
	c2 := replica(reg2) // another replica
	if _, err := c1.Pause(ctx, "r", drain.PauseRequest{TimeoutSeconds: 10}); err != nil {
		t.Fatal(err)
	}
	c1.Check(ctx, "r")
	if snap, _ := mem.ProjectSnapshot(ctx, "r"); snap.Pause.DrainTimedOut {
		t.Fatal("timed out before the deadline")
	}
	now = now.Add(11 * time.Second)
	var wg sync.WaitGroup
	for _, c := range []*drain.Controller{c1, c2, c1, c2} {
		wg.Add(1)
		go func() { defer wg.Done(); c.Check(ctx, "r") }()
	}
	wg.Wait()
	recs, _ := mem.Fetch(ctx, "r", 0, 0)
	n := 0
	for _, r := range recs {
		if r.EventType == statestore.RunDrainTimedOut {
			n++
		}
	}
	snap, _ := mem.ProjectSnapshot(ctx, "r")
	if n != 1 || !snap.Pause.DrainTimedOut || snap.Substatus != "" || len(snap.InFlight()) != 1 {
		t.Fatalf("%d RunDrainTimedOut, pause %+v", n, snap.Pause)
	}
	// Whichever replica's append persisted counts it: one alert between them.
	var total float64
	for _, reg := range []*prometheus.Registry{reg1, reg2} {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "sidecar_drain_timeouts_total" {
				total += mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
	}
	if total != 1 {
		t.Fatalf("the replicas counted %v timeouts between them, want 1", total)
	}
	// One warning between them, naming the code, the run and the step
	// still running.
	timedOut := warns.FilterField(zap.String("code", statestore.PauseDrainTimeoutCode))
	if timedOut.Len() != 1 {
		t.Fatalf("%d PAUSE_DRAIN_TIMEOUT warnings between the replicas, want 1 (all warnings: %v)", timedOut.Len(), warns.All())
	}
	fields := timedOut.All()[0].ContextMap()
	if fields["runId"] != "r" || fmt.Sprint(fields["inFlightStepIds"]) != "[a]" {
		t.Fatalf("the warning's fields %v, want runId r and inFlightStepIds [a]", fields)
	}
}

func TestController_OpenRaisesAPassedDeadline(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a")
	now := time.Now()
	c := newController(t, mem, eng, nil, func() time.Time { return now })
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{TimeoutSeconds: 5}); err != nil {
		t.Fatal(err)
	}
	// The sidecar was down past the deadline; a new one opens.
	now = now.Add(time.Minute)
	c2 := newController(t, mem, eng, nil, func() time.Time { return now })
	if err := c2.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	if snap, _ := mem.ProjectSnapshot(ctx, "r"); !snap.Pause.DrainTimedOut {
		t.Fatal("the deadline that passed while down was not raised at start")
	}
}

func TestController_CancelWhileDraining(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a")
	interrupted := ""
	c := drain.New(mem, emitter{mem}, eng, drain.Options{Interrupt: func(runID string) []string { interrupted = runID; return []string{"task-1"} }})
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
	st, err := c.Cancel(ctx, "r", "operator", "jane")
	if err != nil || st.Status != "CANCELLED" || interrupted != "r" {
		t.Fatalf("cancel: %+v %v interrupted %q", st, err, interrupted)
	}
	// The step finishing later, and Conductor's completion, do not undo it.
	mem.Append(ctx, storetest.Event("r", statestore.StepCompleted, "a"))
	mem.Append(ctx, storetest.Event("r", statestore.RunCompleted, ""))
	if snap, _ := mem.ProjectSnapshot(ctx, "r"); snap.Status != "CANCELLED" {
		t.Fatalf("cancel must win: %s", snap.Status)
	}
	// Cancelling again answers the state, writes nothing, and says so.
	before, _ := mem.Fetch(ctx, "r", 0, 100)
	if st, err := c.Cancel(ctx, "r", "changed my mind", ""); err != nil || st.Status != "CANCELLED" || !strings.Contains(st.Notice, "already cancelled") {
		t.Fatalf("second cancel: %+v %v, want CANCELLED with a notice that nothing was recorded", st, err)
	}
	if after, _ := mem.Fetch(ctx, "r", 0, 100); len(after) != len(before) {
		t.Fatalf("a second cancel wrote %d events", len(after)-len(before))
	}
}

func TestController_EngineDownIsReportedButRecorded(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a")
	eng.err = errors.New("conductor down")
	c := newController(t, mem, eng, nil, nil)
	st, err := c.Pause(ctx, "r", drain.PauseRequest{})
	var ee *drain.EngineError
	if !errors.As(err, &ee) || st == nil || st.Status != "PAUSED" {
		t.Fatalf("got %+v %v, want the PAUSED state with an EngineError", st, err)
	}
	// The retry converges: Conductor is paused once it answers.
	eng.err = nil
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
}

// conflictErr is how the adapter reports Conductor refusing to resume a
// workflow that already runs.
func conflictErr() error {
	return &adapter.Error{Code: adapter.CodeConflict, Op: "resume", Status: 409, Message: "workflow is not paused", EngineStatus: "RUNNING"}
}

func TestController_RepeatedResumeConverges(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t)
	c := newController(t, mem, eng, nil, nil)
	if _, err := c.Resume(ctx, "r", drain.ResumeRequest{}); !errors.Is(err, statestore.ErrInvalidTransition) {
		t.Fatalf("resume of a run never paused: %v", err)
	}
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
	// The resume is recorded but Conductor is down.
	eng.err = errors.New("connection refused")
	var ee *drain.EngineError
	if _, err := c.Resume(ctx, "r", drain.ResumeRequest{}); !errors.As(err, &ee) {
		t.Fatalf("resume with Conductor down: %v", err)
	}
	recs, _ := mem.Fetch(ctx, "r", 0, 100)
	// The retry re-sends the resume and writes nothing; Conductor saying
	// the workflow already runs is success.
	for _, e := range []error{nil, conflictErr()} {
		eng.err = e
		st, err := c.Resume(ctx, "r", drain.ResumeRequest{})
		if err != nil || st.Status != "RUNNING" {
			t.Fatalf("repeated resume (engine %v): %+v %v", e, st, err)
		}
	}
	again, _ := mem.Fetch(ctx, "r", 0, 100)
	if len(again) != len(recs) {
		t.Fatalf("a repeated resume wrote %d events", len(again)-len(recs))
	}
	if n := len(eng.calls); n != 4 || eng.calls[3] != "resume wf1" {
		t.Fatalf("engine calls %v", eng.calls)
	}
}

// TestController_ResumeOfAWorkflowConductorNeverPaused: the log says
// PAUSED, but Conductor's workflow runs (its pause call was lost: a held
// failure paused the run while Conductor restarted). The resume is
// recorded, and Conductor answering that the workflow is not paused is
// success: the run and the workflow agree again. Finding of TestE2E_Chaos
// (the resume answered 409 ENGINE_CONFLICT and the run stayed apart).
func TestController_ResumeOfAWorkflowConductorNeverPaused(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t)
	c := newController(t, mem, eng, nil, nil)
	eng.err = errors.New("connection refused") // Conductor restarting
	var ee *drain.EngineError
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{}); !errors.As(err, &ee) {
		t.Fatalf("pause with Conductor down: %v", err)
	}
	eng.err = conflictErr() // back, with the workflow RUNNING
	st, err := c.Resume(ctx, "r", drain.ResumeRequest{})
	if err != nil || st.Status != statestore.RunStatusRunning {
		t.Fatalf("resume: %+v, %v; want RUNNING", st, err)
	}
}

func TestController_RetryStep(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a", "b")
	c := newController(t, mem, eng, nil, nil)
	held := storetest.WithPayload(storetest.Event("r", statestore.StepFailed, "a"),
		map[string]any{"error": map[string]any{"code": "EXIT_CODE", "message": "exit 1"}, "onStepFailure": "pause"})
	if _, err := mem.Append(ctx, held); err != nil {
		t.Fatal(err)
	}
	// Not paused yet: refused.
	if _, err := c.RetryStep(ctx, "r", "a", drain.RetryRequest{}); !errors.Is(err, statestore.ErrInvalidTransition) {
		t.Fatalf("retry in a running run: %v", err)
	}
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{Reason: "stepFailed", StepID: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx, "r", drain.ResumeRequest{}); !errors.Is(err, statestore.ErrInvalidTransition) {
		t.Fatalf("resume with a held step: %v", err)
	}
	if _, err := c.RetryStep(ctx, "r", "b", drain.RetryRequest{}); !errors.Is(err, statestore.ErrInvalidTransition) {
		t.Fatalf("retry of a running step: %v", err)
	}
	if _, err := c.RetryStep(ctx, "r", "zz", drain.RetryRequest{}); !errors.Is(err, drain.ErrStepNotFound) {
		t.Fatalf("retry of an unknown step: %v", err)
	}
	for range 2 { // the second is idempotent
		if _, err := c.RetryStep(ctx, "r", "a", drain.RetryRequest{RequestedBy: "jane"}); err != nil {
			t.Fatal(err)
		}
	}
	snap, _ := mem.ProjectSnapshot(ctx, "r")
	if st := snap.Step("a"); st.LogicalAttemptID != 2 || !st.RetryRequested || snap.StepRetries != 1 {
		t.Fatalf("after retry: %+v retries %d", st, snap.StepRetries)
	}
	if _, err := c.Resume(ctx, "r", drain.ResumeRequest{}); err != nil {
		t.Fatalf("resume after the retry: %v", err)
	}
	// The run ended before the retry ran (its workflow failed, was lost):
	// a repeat of the retry is refused, not answered as requested.
	if _, err := mem.Append(ctx, storetest.WithPayload(storetest.Event("r", statestore.RunFailed, ""),
		map[string]any{"error": map[string]any{"code": "WORKFLOW_NOT_FOUND", "message": "gone"}})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RetryStep(ctx, "r", "a", drain.RetryRequest{}); !errors.Is(err, statestore.ErrInvalidTransition) {
		t.Fatalf("retry repeated after the run FAILED: %v, want INVALID_TRANSITION", err)
	}
}

// Two replicas retry two held steps at once: both retry requests land,
// numbered 1 and 2, whatever the interleaving.
func TestController_ConcurrentRetriesOfTwoSteps(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a", "b")
	for _, s := range []string{"a", "b"} {
		mem.Append(ctx, storetest.WithPayload(storetest.Event("r", statestore.StepFailed, s),
			map[string]any{"error": map[string]any{"code": "X", "message": "y"}, "onStepFailure": "pause"}))
	}
	c1 := newController(t, mem, eng, nil, nil)
	c2 := newController(t, mem, eng, nil, nil)
	if _, err := c1.Pause(ctx, "r", drain.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, c := range []*drain.Controller{c1, c2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.RetryStep(ctx, "r", []string{"a", "b"}[i], drain.RetryRequest{})
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	snap, _ := mem.ProjectSnapshot(ctx, "r")
	if snap.StepRetries != 2 || !snap.Step("a").RetryRequested || !snap.Step("b").RetryRequested {
		t.Fatalf("retries %d, a %+v, b %+v", snap.StepRetries, snap.Step("a"), snap.Step("b"))
	}
}

// RESUME while DRAINING ends the drain: the run is RUNNING, the drain is
// recorded as ended by the resume (outcome resumed), and the monitor
// appends no RunDrainCompleted when the steps finish later.
func TestController_ResumeWhileDrainingEndsTheDrain(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a")
	reg := prometheus.NewRegistry()
	c := newController(t, mem, eng, reg, nil)
	if st, err := c.Pause(ctx, "r", drain.PauseRequest{}); err != nil || st.Substatus != "DRAINING" {
		t.Fatalf("pause: %+v %v", st, err)
	}
	st, err := c.Resume(ctx, "r", drain.ResumeRequest{})
	if err != nil || st.Status != "RUNNING" || st.Substatus != "" || st.Drain != nil {
		t.Fatalf("resume while draining: %+v %v", st, err)
	}
	mem.Append(ctx, storetest.Event("r", statestore.StepCompleted, "a"))
	c.Check(ctx, "r")
	recs, _ := mem.Fetch(ctx, "r", 0, 0)
	for _, r := range recs {
		if r.EventType == statestore.RunDrainCompleted || r.EventType == statestore.RunDrainTimedOut {
			t.Fatalf("%s after the resume ended the drain", r.EventType)
		}
	}
	snap, _ := mem.ProjectSnapshot(ctx, "r")
	if snap.Pause.DrainEndedAt == "" || snap.Pause.ResumedAt == "" {
		t.Fatalf("pause state after resume: %+v", snap.Pause)
	}
	if n := histogramCount(t, reg, "sidecar_drain_duration_seconds", "resumed"); n != 1 {
		t.Fatalf("drains ended by a resume counted %d, want 1", n)
	}
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name, outcome string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	t.Fatalf("no %s{outcome=%q}", name, outcome)
	return 0
}

// TestPause_DecidesAgainWhenTheRunMovesOn: RunPaused is appended on the
// runSeq the pause was decided on (the fence); when a StepStarted lands
// between the pause's read and its append, the pause is recorded after it
// and counts the step in flight.
func TestPause_DecidesAgainWhenTheRunMovesOn(t *testing.T) {
	mem, eng := setup(t)
	em := &landsFirst{emitter: emitter{mem}, pending: storetest.Event("r", statestore.StepStarted, "late")}
	c := drain.New(mem, em, eng, drain.Options{Logger: zaptest.NewLogger(t)})
	st, err := c.Pause(context.Background(), "r", drain.PauseRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := mem.Fetch(context.Background(), "r", 0, 0)
	if got := types(recs); got != "RunStarted StepStarted RunPaused" {
		t.Fatalf("log %s", got)
	}
	if st.Status != statestore.RunStatusPaused || st.Substatus != statestore.SubstatusDraining || st.Drain == nil || strings.Join(st.Drain.InFlightStepIDs, ",") != "late" {
		t.Fatalf("state %s/%s drain %+v, want PAUSED/DRAINING with [late] in flight", st.Status, st.Substatus, st.Drain)
	}
}

func types(recs []statestore.RunEventRecord) string {
	s := make([]string, len(recs))
	for i, r := range recs {
		s[i] = r.EventType
	}
	return strings.Join(s, " ")
}

// TestPause_RacesAPauseOnFailure: an operator's pause and the pause of a
// step that failed under onStepFailure "pause" race. Exactly
// one RunPaused is recorded, both calls answer PAUSED, the failed step is
// held either way, and the log raises no alert.
func TestPause_RacesAPauseOnFailure(t *testing.T) {
	for i := range 50 {
		mem, eng := setup(t, "a")
		ctx := context.Background()
		c := drain.New(mem, emitter{mem}, eng, drain.Options{Logger: zaptest.NewLogger(t)})
		failed := storetest.WithPayload(storetest.Event("r", statestore.StepFailed, "a"),
			map[string]any{"error": map[string]any{"code": "COMMAND_FAILED", "message": "exit 1", "retryable": false}, "onStepFailure": "pause"})
		var wg sync.WaitGroup
		errs := make([]error, 2)
		states := make([]*drain.State, 2)
		wg.Add(2)
		go func() {
			defer wg.Done()
			states[0], errs[0] = c.Pause(ctx, "r", drain.PauseRequest{Reason: "operator", RequestedBy: "ops"})
		}()
		go func() {
			defer wg.Done()
			if _, err := mem.Append(ctx, failed); err != nil {
				errs[1] = err
				return
			}
			states[1], errs[1] = c.Pause(ctx, "r", drain.PauseRequest{Reason: "stepFailed", StepID: "a", RequestedBy: "sidecar"})
		}()
		wg.Wait()
		for j, err := range errs {
			if err != nil {
				t.Fatalf("round %d, pause %d: %v", i, j, err)
			}
			if states[j].Status != statestore.RunStatusPaused {
				t.Fatalf("round %d, pause %d: status %s", i, j, states[j].Status)
			}
		}
		recs, _ := mem.Fetch(ctx, "r", 0, 0)
		snap, alerts := statestore.Reduce(nil, recs)
		if n := strings.Count(types(recs), statestore.RunPaused); n != 1 || len(alerts) != 0 {
			t.Fatalf("round %d: log %s: %d RunPaused, %d alerts; want 1 and 0", i, types(recs), n, len(alerts))
		}
		if held := snap.HeldSteps(); len(held) != 1 {
			t.Fatalf("round %d: held steps %v, want [a]", i, held)
		}
	}
}

// TestController_CancelQueued: a run QUEUED by admission control has no
// workflow: its cancel is recorded in the log alone (RunCancelRequested,
// RunCancelled) and Conductor is not called.
func TestController_CancelQueued(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	mem.Append(ctx, storetest.Event("q", statestore.RunQueued, ""))
	eng := &engine{}
	c := newController(t, mem, eng, nil, nil)
	st, err := c.Cancel(ctx, "q", "not needed", "ops")
	if err != nil || st.Status != statestore.RunStatusCancelled {
		t.Fatalf("cancel a queued run: %+v %v, want CANCELLED", st, err)
	}
	recs, _ := mem.Fetch(ctx, "q", 0, 0)
	var types []string
	for _, r := range recs {
		types = append(types, r.EventType)
	}
	if got := strings.Join(types, " "); got != "RunQueued RunCancelRequested RunCancelled" || len(eng.calls) != 0 {
		t.Fatalf("log %s, engine calls %v; want the cancel in the log and no Conductor call", got, eng.calls)
	}
	if _, alerts := statestore.Reduce(nil, recs); len(alerts) != 0 {
		t.Fatalf("the cancel raised %v", alerts)
	}
}

// landsFirst is the write path with one event of another writer landing
// in the log right before the pause's RunPaused reaches the store: after
// the pause read the run, before its append. It keys on the write, not
// on how often the run is read.
type landsFirst struct {
	emitter
	mu      sync.Mutex
	pending *statestore.RunEventWrite
}

func (l *landsFirst) land(ctx context.Context, w *statestore.RunEventWrite) error {
	l.mu.Lock()
	ev := l.pending
	if w.EventType == statestore.RunPaused {
		l.pending = nil
	} else {
		ev = nil
	}
	l.mu.Unlock()
	if ev == nil {
		return nil
	}
	_, err := l.s.Append(ctx, ev)
	return err
}

func (l *landsFirst) Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	if err := l.land(ctx, w); err != nil {
		return statestore.AppendResult{}, err
	}
	return l.emitter.Emit(ctx, w)
}

func (l *landsFirst) EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	if err := l.land(ctx, w); err != nil {
		return statestore.AppendResult{}, err
	}
	return l.emitter.EmitIf(ctx, w, lastSeq)
}

// TestPause_FenceRefusesAfterATerminalEvent: a terminal event lands
// between the pause's read of a RUNNING run and its RunPaused. The pause
// decides again on the run as it now is: INVALID_TRANSITION, no RunPaused
// after the terminal event, no alert, Conductor not called.
func TestPause_FenceRefusesAfterATerminalEvent(t *testing.T) {
	for _, terminal := range []string{statestore.RunCompleted, statestore.RunFailed, statestore.RunCancelled} {
		t.Run(terminal, func(t *testing.T) {
			mem, eng := setup(t)
			ctx := context.Background()
			em := &landsFirst{emitter: emitter{mem}, pending: storetest.Event("r", terminal, "")}
			c := drain.New(mem, em, eng, drain.Options{Logger: zaptest.NewLogger(t)})
			_, err := c.Pause(ctx, "r", drain.PauseRequest{Reason: "operator"})
			if !errors.Is(err, statestore.ErrInvalidTransition) {
				t.Fatalf("pause: %v; want INVALID_TRANSITION (the run ended before the pause was recorded)", err)
			}
			recs, _ := mem.Fetch(ctx, "r", 0, 0)
			_, alerts := statestore.Reduce(nil, recs)
			if got, want := types(recs), "RunStarted "+terminal; got != want || len(alerts) != 0 {
				t.Fatalf("log %s with %d alerts; want %s and none", got, len(alerts), want)
			}
			if len(eng.calls) != 0 {
				t.Fatalf("Conductor calls %v; want none", eng.calls)
			}
		})
	}
}

// landAfterFirstRead is the controller's view of the log (memstore), with
// another writer's event landing right after the first read of run "r":
// between the action's decision and its append.
type landAfterFirstRead struct {
	*memstore.Store
	t    *testing.T
	ev   *statestore.RunEventWrite
	once sync.Once
}

func (l *landAfterFirstRead) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := l.Store.ProjectSnapshot(ctx, runID)
	if err != nil || runID != "r" {
		return snap, err
	}
	l.once.Do(func() {
		if _, err := l.Store.Append(ctx, l.ev); err != nil {
			l.t.Errorf("append %s: %v", l.ev.EventType, err)
		}
	})
	return snap, nil
}

// TestController_ActionsDecideAgainWhenTheRunMovesOn: an operator's
// action whose event another writer's event made invalid between the
// action's read and its append (the run ended, or a cancel was
// requested) is answered INVALID_TRANSITION on the run's new state and
// appends nothing: the action's event is appended on the state it was
// decided on (statestore.Fenced) and decided again when the run moved on.
func TestController_ActionsDecideAgainWhenTheRunMovesOn(t *testing.T) {
	ctx := context.Background()
	held := storetest.WithPayload(storetest.Event("r", statestore.StepFailed, "a"),
		map[string]any{"error": map[string]any{"code": "EXIT_CODE", "message": "exit 1"}, "onStepFailure": "pause"})
	for _, tc := range []struct {
		name   string
		before []*statestore.RunEventWrite // after RunStarted and StepStarted a
		lands  *statestore.RunEventWrite
		act    func(c *drain.Controller) error
	}{
		{"Resume/RunFailedLands", []*statestore.RunEventWrite{storetest.Event("r", statestore.RunPaused, "")},
			storetest.Event("r", statestore.RunFailed, ""),
			func(c *drain.Controller) error { _, err := c.Resume(ctx, "r", drain.ResumeRequest{}); return err }},
		{"Cancel/RunCompletedLands", nil,
			storetest.Event("r", statestore.RunCompleted, ""),
			func(c *drain.Controller) error { _, err := c.Cancel(ctx, "r", "operator", "jane"); return err }},
		{"RetryStep/CancelRequestedLands", []*statestore.RunEventWrite{held, storetest.Event("r", statestore.RunPaused, "")},
			storetest.Event("r", statestore.RunCancelRequested, ""),
			func(c *drain.Controller) error {
				_, err := c.RetryStep(ctx, "r", "a", drain.RetryRequest{})
				return err
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, eng := setup(t, "a")
			for _, w := range tc.before {
				w := *w
				w.EventID = uuid.NewString()
				if _, err := mem.Append(ctx, &w); err != nil {
					t.Fatal(err)
				}
			}
			lands := *tc.lands
			lands.EventID = uuid.NewString()
			reader := &landAfterFirstRead{Store: mem, t: t, ev: &lands}
			c := drain.New(reader, emitter{mem}, eng, drain.Options{Logger: zaptest.NewLogger(t)})
			if err := tc.act(c); !errors.Is(err, statestore.ErrInvalidTransition) {
				t.Errorf("got %v, want INVALID_TRANSITION on the run's new state", err)
			}
			recs, err := mem.Fetch(ctx, "r", 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, alerts := statestore.Reduce(nil, recs); len(alerts) != 0 {
				t.Fatalf("the action appended an event the projector flags: %s", alerts[0].Reason)
			}
			if last := recs[len(recs)-1].EventType; last != tc.lands.EventType {
				t.Fatalf("last event %s, want %s (nothing after it)", last, tc.lands.EventType)
			}
		})
	}
}

// followEngine is the engine fake of the controller's tests with the
// workflow status the Follower reads.
type followEngine struct {
	*engine
	status string
}

func (e followEngine) WorkflowStatus(context.Context, string) (string, error) { return e.status, nil }

// ledger is an engine ledger holding one note.
type ledger struct {
	paused bool
	cycle  int64
}

func (l *ledger) NoteEngine(_ context.Context, _ string, paused bool, cycle int64) error {
	l.paused, l.cycle = paused, cycle
	return nil
}

func (l *ledger) EngineState(context.Context, string) (bool, int64, error) {
	return l.paused, l.cycle, nil
}

// landAfterRead is landAfterFirstRead at the nth read of run "r".
type landAfterRead struct {
	*memstore.Store
	t     *testing.T
	ev    *statestore.RunEventWrite
	n     int
	reads int
}

func (l *landAfterRead) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := l.Store.ProjectSnapshot(ctx, runID)
	if err != nil || runID != "r" {
		return snap, err
	}
	if l.reads++; l.reads == l.n {
		if _, err := l.Store.Append(ctx, l.ev); err != nil {
			l.t.Errorf("append %s: %v", l.ev.EventType, err)
		}
	}
	return snap, nil
}

// TestFollower_ResumeInConductorRacesTheEnd: the Follower records a resume
// made in Conductor (RunResumed, requestedBy conductor) on the state it
// decided on; a run that ended between that read and the append (its
// RunFailed landed) gets no RunResumed after its end.
func TestFollower_ResumeInConductorRacesTheEnd(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t)
	paused := storetest.Event("r", statestore.RunPaused, "")
	if _, err := mem.Append(ctx, paused); err != nil {
		t.Fatal(err)
	}
	failed := storetest.Event("r", statestore.RunFailed, "")
	// The Follower reads the run, then the ledger and Conductor, then the
	// run again, and decides on that second read.
	reader := &landAfterRead{Store: mem, t: t, ev: failed, n: 2}
	f := drain.NewFollower(reader, emitter{mem}, followEngine{eng, drain.EngineRunning}, &ledger{paused: true, cycle: 1}, drain.FollowerOptions{Logger: zaptest.NewLogger(t)})
	if _, err := f.Saw(ctx, "r", "wf1", drain.EngineRunning); err != nil {
		t.Fatal(err)
	}
	recs, err := mem.Fetch(ctx, "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, alerts := statestore.Reduce(nil, recs); len(alerts) != 0 {
		t.Fatalf("the Follower appended an event the projector flags: %s", alerts[0].Reason)
	}
	if last := recs[len(recs)-1].EventType; last != statestore.RunFailed {
		t.Fatalf("last event %s, want RunFailed (nothing after it)", last)
	}
}

// laggingReplica answers its next read with a snapshot a replica behind
// the log would give (set stale), then reads the log again.
type laggingReplica struct {
	*memstore.Store
	mu    sync.Mutex
	stale *statestore.RunSnapshot
}

func (l *laggingReplica) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	l.mu.Lock()
	stale := l.stale
	l.stale = nil
	l.mu.Unlock()
	if stale != nil {
		return stale, nil
	}
	return l.Store.ProjectSnapshot(ctx, runID)
}

// TestPause_ThroughAReplicaBehindTheLog: a pause whose replica reads the
// run as it was before a resume (a JetStream replica lagging its leader)
// takes it for a repeat of the pause before, records nothing, and must
// not then bring Conductor to the resumed state and answer as if paused:
// it pauses the run, in the log and in Conductor.
func TestPause_ThroughAReplicaBehindTheLog(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "s1")
	lag := &laggingReplica{Store: mem}
	c := drain.New(lag, emitter{mem}, eng, drain.Options{ActiveRuns: func(context.Context) ([]string, error) { return []string{"r"}, nil }, Logger: zaptest.NewLogger(t)})
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{Reason: "first"}); err != nil {
		t.Fatal(err)
	}
	paused, err := mem.ProjectSnapshot(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx, "r", drain.ResumeRequest{Reason: "back"}); err != nil {
		t.Fatal(err)
	}
	lag.mu.Lock()
	lag.stale = paused // the next pause's replica has not seen the resume
	lag.mu.Unlock()
	st, err := c.Pause(ctx, "r", drain.PauseRequest{Reason: "second"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := mem.ProjectSnapshot(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	eng.mu.Lock()
	last := eng.calls[len(eng.calls)-1]
	eng.mu.Unlock()
	if snap.Status != statestore.RunStatusPaused || snap.Pause.Cycle != 2 || st.Status != statestore.RunStatusPaused || last != "pause wf1" {
		t.Fatalf("after the pause through the lagging replica: log %s (cycle %d), answered %s, Conductor's last call %q; want PAUSED at cycle 2 in all three",
			snap.Status, snap.Pause.Cycle, st.Status, last)
	}
}
