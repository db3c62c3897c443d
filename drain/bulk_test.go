package drain_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// bulkEngine is engine with Conductor's bulk calls, which it records
// apart; refuse names the workflows a bulk call refuses, with the error.
type bulkEngine struct {
	engine
	bmu    sync.Mutex
	bulk   []string
	refuse map[string]error
	// terminated, when set, is called with each workflow a bulk terminate
	// terminated.
	terminated func(wf string)
}

func (e *bulkEngine) many(op string, ids []string) map[string]error {
	e.bmu.Lock()
	defer e.bmu.Unlock()
	sorted := append([]string(nil), ids...)
	sort.Strings(sorted)
	e.bulk = append(e.bulk, op+" "+strings.Join(sorted, ","))
	errs := map[string]error{}
	for _, id := range ids {
		if err := e.refuse[id]; err != nil {
			errs[id] = err
		}
	}
	return errs
}

func (e *bulkEngine) PauseMany(_ context.Context, ids []string) map[string]error {
	return e.many("pause", ids)
}
func (e *bulkEngine) ResumeMany(_ context.Context, ids []string) map[string]error {
	return e.many("resume", ids)
}
func (e *bulkEngine) TerminateMany(_ context.Context, ids []string, _ string) map[string]error {
	errs := e.many("terminate", ids)
	for _, id := range ids {
		if errs[id] == nil && e.terminated != nil {
			e.terminated(id)
		}
	}
	return errs
}

// startRun appends run's RunStarted (workflow wf-<run>) and a StepStarted
// for each step.
func startRun(t *testing.T, mem *memstore.Store, run string, steps ...string) {
	t.Helper()
	ctx := context.Background()
	if _, err := mem.Append(ctx, storetest.WithPayload(storetest.Event(run, statestore.RunStarted, ""),
		map[string]any{"engineRunRef": statestore.ConductorRunRef("plan", "wf-"+run), "engineType": "conductor"})); err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if _, err := mem.Append(ctx, storetest.Event(run, statestore.StepStarted, s)); err != nil {
			t.Fatal(err)
		}
	}
}

func eventTypes(t *testing.T, mem *memstore.Store, run string) string {
	t.Helper()
	recs, err := mem.Fetch(context.Background(), run, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, r := range recs {
		types = append(types, r.EventType)
	}
	return strings.Join(types, " ")
}

// TestController_PauseMany: a bulk pause records each run's pause as a
// single pause does (RunPaused fenced, a drain with nothing in flight
// ended at once, one with a step in flight watched and ended when the step
// finishes), pauses the workflows in Conductor with one bulk call, and
// answers each run as Pause would: an ended run INVALID_TRANSITION, an
// unknown one RUN_NOT_FOUND, a workflow Conductor refused an EngineError
// with the run paused in the log. Resume and cancel do the same.
func TestController_PauseMany(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	startRun(t, mem, "busy", "a")
	startRun(t, mem, "idle")
	startRun(t, mem, "paused")
	startRun(t, mem, "refused")
	startRun(t, mem, "done")
	mem.Append(ctx, storetest.Event("done", statestore.RunCompleted, ""))
	eng := &bulkEngine{refuse: map[string]error{"wf-refused": &adapter.Error{Code: adapter.CodeEngineUnavailable, Op: "pause"}}}
	// The monitor watches the drains the pauses leave open (no full pass:
	// only what the pause itself watches is found).
	c := drain.New(mem, emitter{mem}, eng, drain.Options{ActiveRuns: func(context.Context) ([]string, error) { return nil, nil },
		Interval: 10 * time.Millisecond, FullScanInterval: time.Hour, Logger: zaptest.NewLogger(t)})
	if err := c.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	if _, err := c.Pause(ctx, "paused", drain.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
	eng.calls = nil

	runs := []string{"busy", "idle", "paused", "refused", "done", "nope"}
	out := c.PauseMany(ctx, runs, drain.PauseRequest{Reason: "incident", RequestedBy: "ops"})
	if len(out) != len(runs) {
		t.Fatalf("%d outcomes for %d runs", len(out), len(runs))
	}
	got := map[string]drain.Outcome{}
	for i, o := range out {
		if o.RunID != runs[i] {
			t.Fatalf("outcome %d is run %s, want %s", i, o.RunID, runs[i])
		}
		got[o.RunID] = o
	}
	if o := got["busy"]; o.Err != nil || o.State.Status != "PAUSED" || o.State.Substatus != "DRAINING" || o.State.AlreadyPaused {
		t.Errorf("busy: %+v %v, want PAUSED DRAINING", o.State, o.Err)
	}
	if o := got["idle"]; o.Err != nil || o.State.Status != "PAUSED" || o.State.Substatus != "" {
		t.Errorf("idle: %+v %v, want PAUSED, drain ended", o.State, o.Err)
	}
	if o := got["paused"]; o.Err != nil || !strings.Contains(o.State.Notice, "already paused") || !o.State.AlreadyPaused {
		t.Errorf("paused: %+v %v, want the notice that it was paused already", o.State, o.Err)
	}
	var ee *drain.EngineError
	if o := got["refused"]; !errors.As(o.Err, &ee) || ee.State.Status != "PAUSED" {
		t.Errorf("refused: %v, want an EngineError with the run PAUSED", o.Err)
	}
	if o := got["done"]; !errors.Is(o.Err, statestore.ErrInvalidTransition) {
		t.Errorf("done: %v, want INVALID_TRANSITION", o.Err)
	}
	if o := got["nope"]; !errors.Is(o.Err, drain.ErrRunNotFound) {
		t.Errorf("nope: %v, want RUN_NOT_FOUND", o.Err)
	}
	if want := []string{"pause wf-busy,wf-idle,wf-paused,wf-refused"}; fmt.Sprint(eng.bulk) != fmt.Sprint(want) || len(eng.calls) != 0 {
		t.Fatalf("Conductor calls: bulk %v single %v, want bulk %v and no single call", eng.bulk, eng.calls, want)
	}
	for run, want := range map[string]string{
		"busy":    "RunStarted StepStarted RunPaused",
		"idle":    "RunStarted RunPaused RunDrainCompleted",
		"paused":  "RunStarted RunPaused RunDrainCompleted",
		"refused": "RunStarted RunPaused RunDrainCompleted",
		"done":    "RunStarted RunCompleted",
	} {
		if got := eventTypes(t, mem, run); got != want {
			t.Errorf("%s: events %s, want %s", run, got, want)
		}
	}
	// The busy run's drain is watched: the monitor ends it when its step
	// finishes.
	mem.Append(ctx, storetest.Event("busy", statestore.StepCompleted, "a"))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s, _ := mem.ProjectSnapshot(ctx, "busy")
		if s.Substatus == "" && s.Pause.DrainEndedAt != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("busy 5 s after its step: substatus %q, drain not ended", s.Substatus)
		}
	}

	eng.bulk = nil
	res := c.ResumeMany(ctx, []string{"busy", "idle", "done"}, drain.ResumeRequest{Reason: "over"})
	if res[0].Err != nil || res[0].State.Status != "RUNNING" || res[1].Err != nil || !errors.Is(res[2].Err, statestore.ErrInvalidTransition) {
		t.Fatalf("resume: %+v", res)
	}
	if want := []string{"resume wf-busy,wf-idle"}; fmt.Sprint(eng.bulk) != fmt.Sprint(want) || len(eng.calls) != 0 {
		t.Fatalf("Conductor calls: bulk %v single %v, want bulk %v", eng.bulk, eng.calls, want)
	}

	eng.bulk = nil
	can := c.CancelMany(ctx, []string{"busy", "paused", "done"}, "bad batch", "ops")
	if can[0].Err != nil || can[0].State.Status != "CANCELLED" || can[1].Err != nil || can[1].State.Status != "CANCELLED" ||
		!errors.Is(can[2].Err, statestore.ErrInvalidTransition) {
		t.Fatalf("cancel: %+v", can)
	}
	if want := []string{"terminate wf-busy,wf-paused"}; fmt.Sprint(eng.bulk) != fmt.Sprint(want) || len(eng.calls) != 0 {
		t.Fatalf("Conductor calls: bulk %v single %v, want bulk %v", eng.bulk, eng.calls, want)
	}
	if got, want := eventTypes(t, mem, "busy"), "RunStarted StepStarted RunPaused StepCompleted RunDrainCompleted RunResumed RunCancelRequested RunCancelled"; got != want {
		t.Errorf("busy: events %s, want %s", got, want)
	}
}

// TestController_CancelManyAfterTheWatcher: the run watcher may record a
// cancelled run's RunCancelled (it saw the workflow TERMINATED with the
// cancel requested) before the cancel does: the cancel answers the run
// CANCELLED, as a repeated cancel does, not INVALID_TRANSITION.
func TestController_CancelManyAfterTheWatcher(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	startRun(t, mem, "r1", "a")
	startRun(t, mem, "r2")
	eng := &bulkEngine{}
	eng.terminated = func(wf string) {
		if wf == "wf-r1" { // the watcher's RunCancelled
			if _, err := mem.Append(ctx, storetest.Event("r1", statestore.RunCancelled, "")); err != nil {
				t.Error(err)
			}
		}
	}
	c := drain.New(mem, emitter{mem}, eng, drain.Options{ActiveRuns: func(context.Context) ([]string, error) { return nil, nil }})
	for i, o := range c.CancelMany(ctx, []string{"r1", "r2"}, "bad batch", "ops") {
		if o.Err != nil || o.State == nil || o.State.Status != "CANCELLED" {
			t.Errorf("run %d %s: %+v %v, want CANCELLED", i, o.RunID, o.State, o.Err)
		}
	}
	if got, want := eventTypes(t, mem, "r1"), "RunStarted StepStarted RunCancelRequested RunCancelled"; got != want {
		t.Errorf("r1: events %s, want %s", got, want)
	}
}

// landsAfter is the write path with another writer's event landing in
// the log right after a RunPaused is appended, before anything else of the
// pause: the run moves on between RunPaused and the end of its empty drain.
type landsAfter struct {
	emitter
	mu      sync.Mutex
	pending map[string]*statestore.RunEventWrite // by runId
}

func (l *landsAfter) EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	res, err := l.emitter.EmitIf(ctx, w, lastSeq)
	if err != nil || !res.Persisted || w.EventType != statestore.RunPaused {
		return res, err
	}
	l.mu.Lock()
	ev := l.pending[w.RunID]
	delete(l.pending, w.RunID)
	l.mu.Unlock()
	if ev != nil {
		if _, err := l.s.Append(ctx, ev); err != nil {
			return res, err
		}
	}
	return res, err
}

// EmitBatch appends each run's events one by one through EmitIf, as a
// store that is not atomic per run does (natsstore): the other writer's
// event lands between a run's RunPaused and its drain's end.
func (l *landsAfter) EmitBatch(ctx context.Context, runs []statestore.RunBatch) []statestore.BatchResult {
	out := make([]statestore.BatchResult, len(runs))
	for i, b := range runs {
		last := b.LastSeq
		for _, w := range b.Events {
			res, err := l.EmitIf(ctx, w, last)
			if err != nil {
				out[i].Err = err
				break
			}
			out[i].Results = append(out[i].Results, res)
			last = res.RunSeq
		}
	}
	return out
}

// TestPauseMany_EmptyDrainEndIsFenced: a bulk pause ends the drain of a
// run with nothing in flight on the run as its RunPaused left it, so a
// change landing in between (a resume, a cancel request, a step's event
// from another replica) is seen: no RunDrainCompleted after a resume, and
// none before a step that joined; an untouched run's drain ends at once.
func TestPauseMany_EmptyDrainEndIsFenced(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	for _, run := range []string{"resumed", "cancelling", "joined", "quiet"} {
		startRun(t, mem, run)
	}
	em := &landsAfter{emitter: emitter{mem}, pending: map[string]*statestore.RunEventWrite{
		"resumed":    storetest.Event("resumed", statestore.RunResumed, ""),
		"cancelling": storetest.Event("cancelling", statestore.RunCancelRequested, ""),
		"joined":     storetest.Event("joined", statestore.StepStarted, "late"),
	}}
	c := drain.New(mem, em, &bulkEngine{}, drain.Options{Logger: zaptest.NewLogger(t)})
	for _, o := range c.PauseMany(ctx, []string{"resumed", "cancelling", "joined", "quiet"}, drain.PauseRequest{Reason: "incident"}) {
		if o.Err != nil {
			t.Fatalf("%s: %v", o.RunID, o.Err)
		}
	}
	for run, want := range map[string]string{
		"resumed":    "RunStarted RunPaused RunResumed",
		"cancelling": "RunStarted RunPaused RunCancelRequested RunDrainCompleted",
		"joined":     "RunStarted RunPaused StepStarted",
		"quiet":      "RunStarted RunPaused RunDrainCompleted",
	} {
		if got := eventTypes(t, mem, run); got != want {
			t.Errorf("%s: log %s, want %s", run, got, want)
		}
		recs, _ := mem.Fetch(ctx, run, 0, 0)
		if _, alerts := statestore.Reduce(nil, recs); len(alerts) != 0 {
			t.Errorf("%s: %d alerts: %+v", run, len(alerts), alerts)
		}
	}
	snap, err := mem.ProjectSnapshot(ctx, "joined")
	if err != nil || snap.Substatus != statestore.SubstatusDraining {
		t.Fatalf("joined: %+v %v; want PAUSED/DRAINING on its late step", snap, err)
	}
}

// pausingEngine is bulkEngine whose bulk pause runs paused first: what
// happens in the log while Conductor pauses the workflows.
type pausingEngine struct {
	bulkEngine
	paused func()
}

func (e *pausingEngine) PauseMany(ctx context.Context, ids []string) map[string]error {
	e.paused()
	return e.bulkEngine.PauseMany(ctx, ids)
}

// TestPauseMany_DrainEndingDuringConductorsPauseIsDetected: a run paused
// with a step in flight whose step finishes while Conductor pauses the
// batch's workflows has its drain ended by the pause's own nudge, not by
// the monitor's next scan (set an hour away here), while the runs whose
// drain the pause ended itself stay as they are.
func TestPauseMany_DrainEndingDuringConductorsPauseIsDetected(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	startRun(t, mem, "busy", "a")
	startRun(t, mem, "idle")
	eng := &pausingEngine{paused: func() {
		if _, err := mem.Append(ctx, storetest.Event("busy", statestore.StepCompleted, "a")); err != nil {
			t.Error(err)
		}
	}}
	c := drain.New(mem, emitter{mem}, eng, drain.Options{Logger: zaptest.NewLogger(t),
		ActiveRuns: func(context.Context) ([]string, error) { return []string{"busy", "idle"}, nil },
		Interval:   time.Hour, IndexInterval: time.Hour, FullScanInterval: time.Hour})
	if err := c.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(ctx) })
	for _, o := range c.PauseMany(ctx, []string{"busy", "idle"}, drain.PauseRequest{Reason: "incident"}) {
		if o.Err != nil {
			t.Fatalf("%s: %v", o.RunID, o.Err)
		}
	}
	want := "RunStarted StepStarted RunPaused StepCompleted RunDrainCompleted"
	deadline := time.Now().Add(2 * time.Minute)
	for got := eventTypes(t, mem, "busy"); got != want; got = eventTypes(t, mem, "busy") {
		if time.Now().After(deadline) {
			t.Fatalf("busy: log %s after 2 min, want %s (the drain's end detected)", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got, want := eventTypes(t, mem, "idle"), "RunStarted RunPaused RunDrainCompleted"; got != want {
		t.Fatalf("idle: log %s, want %s", got, want)
	}
}

// TestCancelMany_AStepEndingDuringTheTerminate: a step's outcome landing
// while Conductor terminates the batch's workflows (between the cancel's
// RunCancelRequested and its RunCancelled) is seen: RunCancelled lands
// after it, once, and the run's answer shows the step's outcome.
func TestCancelMany_AStepEndingDuringTheTerminate(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	startRun(t, mem, "r1", "a")
	startRun(t, mem, "r2")
	eng := &bulkEngine{}
	eng.terminated = func(wf string) {
		if wf == "wf-r1" {
			if _, err := mem.Append(ctx, storetest.Event("r1", statestore.StepCompleted, "a")); err != nil {
				t.Error(err)
			}
		}
	}
	c := drain.New(mem, emitter{mem}, eng, drain.Options{Logger: zaptest.NewLogger(t)})
	out := c.CancelMany(ctx, []string{"r1", "r2"}, "bad batch", "ops")
	for _, o := range out {
		if o.Err != nil || o.State == nil || o.State.Status != statestore.RunStatusCancelled {
			t.Fatalf("%s: %+v %v, want CANCELLED", o.RunID, o.State, o.Err)
		}
	}
	if st := out[0].State.Snapshot.Step("a"); st == nil || st.Status != statestore.StepStatusSuccess {
		t.Fatalf("r1's answer shows step a as %+v, want SUCCESS", st)
	}
	if got, want := eventTypes(t, mem, "r1"), "RunStarted StepStarted RunCancelRequested StepCompleted RunCancelled"; got != want {
		t.Errorf("r1: events %s, want %s", got, want)
	}
	if got, want := eventTypes(t, mem, "r2"), "RunStarted RunCancelRequested RunCancelled"; got != want {
		t.Errorf("r2: events %s, want %s", got, want)
	}
}

// landsBefore is the write path with another writer's event landing in
// the log after a bulk action read a run and before its batch is
// appended.
type landsBefore struct {
	emitter
	pending map[string]*statestore.RunEventWrite // by runId
}

func (l *landsBefore) EmitBatch(ctx context.Context, runs []statestore.RunBatch) []statestore.BatchResult {
	for _, b := range runs {
		if ev := l.pending[b.Events[0].RunID]; ev != nil {
			delete(l.pending, b.Events[0].RunID)
			if _, err := l.s.Append(ctx, ev); err != nil {
				panic(err)
			}
		}
	}
	return l.emitter.EmitBatch(ctx, runs)
}

// TestPauseMany_BatchIsFenced: a run that moved on between a bulk
// pause's read and its batch is refused by the batch and paused the single
// way on its new state: a step that started in between is in flight, so
// the pause drains it (no RunDrainCompleted before it ends), and a run
// another request paused in between is answered as already paused, with
// nothing written twice; the untouched run's pause and drain end land.
func TestPauseMany_BatchIsFenced(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	for _, run := range []string{"joined", "paused", "quiet"} {
		startRun(t, mem, run)
	}
	em := &landsBefore{emitter: emitter{mem}, pending: map[string]*statestore.RunEventWrite{
		"joined": storetest.Event("joined", statestore.StepStarted, "late"),
		"paused": storetest.Event("paused", statestore.RunPaused, ""),
	}}
	c := drain.New(mem, em, &bulkEngine{}, drain.Options{Logger: zaptest.NewLogger(t)})
	out := c.PauseMany(ctx, []string{"joined", "paused", "quiet"}, drain.PauseRequest{Reason: "incident"})
	for _, o := range out {
		if o.Err != nil {
			t.Fatalf("%s: %v", o.RunID, o.Err)
		}
	}
	for run, want := range map[string]string{
		"joined": "RunStarted StepStarted RunPaused",
		"paused": "RunStarted RunPaused",
		"quiet":  "RunStarted RunPaused RunDrainCompleted",
	} {
		if got := eventTypes(t, mem, run); got != want {
			t.Errorf("%s: log %s, want %s", run, got, want)
		}
	}
	if st := out[0].State; st == nil || st.Substatus != statestore.SubstatusDraining {
		t.Errorf("joined: %+v, want PAUSED/DRAINING on its late step", st)
	}
	if st := out[1].State; st == nil || !strings.Contains(st.Notice, "already paused") {
		t.Errorf("paused: %+v, want the already-paused notice", st)
	}
}

// TestPauseMany_OpenDrainIsFoundByAnotherReplica: a bulk pause that
// leaves a drain open (a step in flight) watches it and marks it in the
// drain index, so another replica's monitor finds it and records its end
// when the step finishes; a drain the batch ended is not marked.
func TestPauseMany_OpenDrainIsFoundByAnotherReplica(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	startRun(t, mem, "busy", "a")
	startRun(t, mem, "idle")
	index := &memIndex{marks: map[string]int64{}}
	a := drain.New(mem, emitter{mem}, &bulkEngine{}, drain.Options{Logger: zaptest.NewLogger(t), Drains: index})
	for _, o := range a.PauseMany(ctx, []string{"busy", "idle"}, drain.PauseRequest{Reason: "incident"}) {
		if o.Err != nil {
			t.Fatalf("%s: %v", o.RunID, o.Err)
		}
	}
	if got := a.Watched(); got != 1 {
		t.Errorf("pausing replica watches %d runs, want 1 (busy)", got)
	}
	if ids, _ := index.DrainingRunIDs(ctx); len(ids) != 1 || ids[0] != "busy" {
		t.Fatalf("drain index %v, want [busy]", ids)
	}
	b := drain.New(mem, emitter{mem}, &bulkEngine{}, drain.Options{Logger: zaptest.NewLogger(t), Drains: index,
		ActiveRuns: func(context.Context) ([]string, error) { return nil, nil },
		Interval:   10 * time.Millisecond, IndexInterval: 20 * time.Millisecond, FullScanInterval: time.Hour})
	if err := b.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(ctx) })
	if _, err := mem.Append(ctx, storetest.Event("busy", statestore.StepCompleted, "a")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for eventTypes(t, mem, "busy") != "RunStarted StepStarted RunPaused StepCompleted RunDrainCompleted" {
		if time.Now().After(deadline) {
			t.Fatalf("busy: log %s, want its drain ended by the other replica", eventTypes(t, mem, "busy"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestController_CancelWhoseTerminateConductorDidNotAnswer: a cancel is
// recorded (RunCancelRequested) when Conductor does not answer its
// terminate: single and bulk answer an EngineError with the run's state,
// as a pause or resume that Conductor did not take does (the API: 503
// ENGINE_UNAVAILABLE single, the outcome recorded in bulk), not a bare
// error that the bulk answer reported as INTERNAL. The pause follower
// completes the cancel.
func TestController_CancelWhoseTerminateConductorDidNotAnswer(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	startRun(t, mem, "one", "a")
	startRun(t, mem, "many", "a")
	unavailable := &adapter.Error{Code: adapter.CodeEngineUnavailable, Op: "terminate"}
	eng := &bulkEngine{refuse: map[string]error{"wf-one": unavailable, "wf-many": unavailable}}
	c := drain.New(mem, emitter{mem}, eng, drain.Options{Logger: zaptest.NewLogger(t)})
	check := func(how string, st *drain.State, err error) {
		t.Helper()
		var ee *drain.EngineError
		if !errors.As(err, &ee) || !errors.Is(err, unavailable) || ee.State == nil || ee.State.Snapshot == nil || !ee.State.Snapshot.CancelRequested {
			t.Fatalf("%s cancel, Conductor not answering: %+v %v; want an EngineError with the run's state, its cancel recorded", how, st, err)
		}
	}
	eng.err = unavailable // the single terminate's answer
	st, err := c.Cancel(ctx, "one", "stop", "ops")
	check("single", st, err)
	for _, o := range c.CancelMany(ctx, []string{"many"}, "stop", "ops") {
		check("bulk", o.State, o.Err)
	}
}
