package drain_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// memSchedule is a ResumeSchedule in memory, shared by a test's
// controllers (adapter.Runs keeps it in the run index).
type memSchedule struct {
	mu sync.Mutex
	m  map[string]drain.ScheduledResume
}

func (x *memSchedule) ScheduleResume(_ context.Context, e drain.ScheduledResume) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.m[e.RunID] = e
	return nil
}

func (x *memSchedule) EndResume(_ context.Context, runID string, cycle int64) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if e, ok := x.m[runID]; ok && e.Cycle <= cycle {
		delete(x.m, runID)
	}
	return nil
}

func (x *memSchedule) ScheduledResumes(context.Context) ([]drain.ScheduledResume, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []drain.ScheduledResume
	for _, e := range x.m {
		out = append(out, e)
	}
	return out, nil
}

func (x *memSchedule) len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.m)
}

// clock is a settable Now.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) set(t time.Time)     { c.ns.Store(t.UnixNano()) }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }
func newClock(t time.Time) *clock    { c := &clock{}; c.set(t); return c }

// scheduledRun is a running run whose RunStarted names its workflow wf1.
func scheduledRun(t *testing.T) (*memstore.Store, *engine) {
	t.Helper()
	mem := memstore.New(statestore.ProjectorOptions{})
	started := storetest.WithPayload(storetest.Event("r", statestore.RunStarted, ""),
		map[string]any{"engineRunRef": statestore.ConductorRunRef("plan", "wf1"), "engineType": "conductor"})
	if _, err := mem.Append(context.Background(), started); err != nil {
		t.Fatal(err)
	}
	return mem, &engine{}
}

func resumes(t *testing.T, mem *memstore.Store) []statestore.RunEventRecord {
	t.Helper()
	recs, err := mem.Fetch(context.Background(), "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []statestore.RunEventRecord
	for _, r := range recs {
		if r.EventType == statestore.RunResumed {
			out = append(out, r)
		}
	}
	return out
}

func waitResumes(t *testing.T, mem *memstore.Store, n int) []statestore.RunEventRecord {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if got := resumes(t, mem); len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d RunResumed after 5 s, want %d", len(resumes(t, mem)), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSchedule_ResumesOnceWhenDue: a pause with a resume time is resumed
// when it is due, once, by whichever of two replicas gets there (one
// RunResumed, requestedBy "schedule"), and not before.
func TestSchedule_ResumesOnceWhenDue(t *testing.T) {
	ctx := context.Background()
	mem, eng := scheduledRun(t)
	sched := &memSchedule{m: map[string]drain.ScheduledResume{}}
	clk := newClock(time.Now())
	newReplica := func() *drain.Controller {
		return drain.New(mem, emitter{mem}, eng, drain.Options{
			ActiveRuns: func(context.Context) ([]string, error) { return []string{"r"}, nil },
			Schedule:   sched, Interval: 5 * time.Millisecond, IndexInterval: 10 * time.Millisecond, FullScanInterval: time.Hour,
			Now: clk.now, Logger: zaptest.NewLogger(t),
		})
	}
	a, b := newReplica(), newReplica()
	at := clk.now().Add(30 * time.Minute)
	st, err := a.Pause(ctx, "r", drain.PauseRequest{Reason: "night", ResumeAt: at})
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := mem.ProjectSnapshot(ctx, "r")
	if snap.Pause.ResumeAt != at.UTC().Format(time.RFC3339Nano) || sched.len() != 1 || st.Status != "PAUSED" {
		t.Fatalf("pause: resumeAt %q, %d scheduled", snap.Pause.ResumeAt, sched.len())
	}
	for _, c := range []*drain.Controller{a, b} {
		if err := c.Open(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(ctx) })
	}
	time.Sleep(100 * time.Millisecond) // ten schedule reads: not due
	if n := len(resumes(t, mem)); n != 0 {
		t.Fatalf("%d RunResumed before the time", n)
	}
	clk.add(31 * time.Minute)
	got := waitResumes(t, mem, 1)
	time.Sleep(100 * time.Millisecond)
	if got = resumes(t, mem); len(got) != 1 {
		t.Fatalf("%d RunResumed, want 1", len(got))
	}
	var p struct{ RequestedBy string }
	_ = json.Unmarshal(got[0].Payload, &p)
	if p.RequestedBy != drain.RequestedBySchedule {
		t.Fatalf("requestedBy %q, want %q", p.RequestedBy, drain.RequestedBySchedule)
	}
	if sched.len() != 0 {
		t.Fatal("the schedule still holds the resumed pause")
	}
	if n := len(eng.calls); eng.calls[n-1] != "resume wf1" {
		t.Fatalf("engine calls %v, want Conductor resumed", eng.calls)
	}
}

// TestSchedule_CancelledByAManualResumeOrANewPause: a manual resume before
// the time cancels the schedule, and so does a new pause without one (the
// schedule belongs to its cycle); a pause whose entry was never written (a
// process died between RunPaused and the entry) is still resumed when due,
// by the monitor's check of the run; a resume that fell due while no
// sidecar ran is carried out at Open.
func TestSchedule_CancelledByAManualResumeOrANewPause(t *testing.T) {
	ctx := context.Background()
	mem, eng := scheduledRun(t)
	sched := &memSchedule{m: map[string]drain.ScheduledResume{}}
	clk := newClock(time.Now())
	opts := drain.Options{
		ActiveRuns: func(context.Context) ([]string, error) { return []string{"r"}, nil },
		Schedule:   sched, Interval: 5 * time.Millisecond, IndexInterval: 10 * time.Millisecond, FullScanInterval: 20 * time.Millisecond,
		Now: clk.now, Logger: zaptest.NewLogger(t),
	}
	c := drain.New(mem, emitter{mem}, eng, opts)
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{ResumeAt: clk.now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx, "r", drain.ResumeRequest{RequestedBy: "jane"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{}); err != nil { // cycle 2, no schedule
		t.Fatal(err)
	}
	clk.add(2 * time.Hour)
	if err := c.Open(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(resumes(t, mem)); n != 1 || sched.len() != 0 {
		t.Fatalf("%d RunResumed, %d scheduled; want the manual one only and none left", n, sched.len())
	}
	if snap, _ := mem.ProjectSnapshot(ctx, "r"); snap.Status != "PAUSED" || snap.Pause.Cycle != 2 {
		t.Fatalf("status %s cycle %d, want PAUSED in cycle 2", snap.Status, snap.Pause.Cycle)
	}

	// Cycle 3 is paused by a process without the schedule (its entry is
	// lost), due an hour ago when the monitor opens.
	if _, err := c.Resume(ctx, "r", drain.ResumeRequest{}); err != nil {
		t.Fatal(err)
	}
	lost := drain.New(mem, emitter{mem}, eng, drain.Options{Now: clk.now})
	if _, err := lost.Pause(ctx, "r", drain.PauseRequest{ResumeAt: clk.now().Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	again := drain.New(mem, emitter{mem}, eng, opts)
	if err := again.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Close(ctx) })
	waitResumes(t, mem, 3)
	if snap, _ := mem.ProjectSnapshot(ctx, "r"); snap.Status != "RUNNING" || snap.Pause.Cycle != 3 {
		t.Fatalf("status %s cycle %d, want cycle 3 resumed", snap.Status, snap.Pause.Cycle)
	}
}

// TestSchedule_ResumeLater: a staggered bulk resume's entry resumes the
// paused run when due, once, with the bulk request's requestedBy and
// reason, by whichever replica is alive (here one that did not write it);
// a manual resume and a new pause meanwhile cancel it; a run that is not
// paused is refused.
func TestSchedule_ResumeLater(t *testing.T) {
	ctx := context.Background()
	mem, eng := scheduledRun(t)
	sched := &memSchedule{m: map[string]drain.ScheduledResume{}}
	clk := newClock(time.Now())
	opts := drain.Options{
		ActiveRuns: func(context.Context) ([]string, error) { return []string{"r"}, nil },
		Schedule:   sched, Interval: 5 * time.Millisecond, IndexInterval: 10 * time.Millisecond, FullScanInterval: time.Hour,
		Now: clk.now, Logger: zaptest.NewLogger(t),
	}
	writer := drain.New(mem, emitter{mem}, eng, opts)
	if _, err := writer.ResumeLater(ctx, "r", clk.now().Add(time.Minute), drain.ResumeRequest{RequestedBy: "alice"}); !errors.Is(err, statestore.ErrInvalidTransition) {
		t.Fatalf("ResumeLater of a running run: %v, want INVALID_TRANSITION", err)
	}
	if _, err := writer.Pause(ctx, "r", drain.PauseRequest{Reason: "incident"}); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.ResumeLater(ctx, "r", clk.now().Add(time.Minute), drain.ResumeRequest{RequestedBy: "alice", Reason: "dependency back"}); err != nil {
		t.Fatal(err)
	}
	other := drain.New(mem, emitter{mem}, eng, opts)
	if err := other.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close(ctx) })
	time.Sleep(60 * time.Millisecond)
	if n := len(resumes(t, mem)); n != 0 {
		t.Fatalf("%d RunResumed before the time", n)
	}
	clk.add(2 * time.Minute)
	got := waitResumes(t, mem, 1)
	var p struct{ RequestedBy, Reason string }
	_ = json.Unmarshal(got[0].Payload, &p)
	if p.RequestedBy != "alice" || p.Reason != "dependency back" {
		t.Fatalf("RunResumed by %q for %q, want alice's bulk request", p.RequestedBy, p.Reason)
	}
	time.Sleep(60 * time.Millisecond)
	if n := len(resumes(t, mem)); n != 1 || sched.len() != 0 {
		t.Fatalf("%d RunResumed, %d scheduled: want exactly one, none left", n, sched.len())
	}

	// Paused again, a later resume is cancelled by a manual resume and a
	// new pause (cycle 3): nothing more is resumed when it falls due.
	if _, err := writer.Pause(ctx, "r", drain.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.ResumeLater(ctx, "r", clk.now().Add(time.Minute), drain.ResumeRequest{RequestedBy: "alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Resume(ctx, "r", drain.ResumeRequest{RequestedBy: "bob"}); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Pause(ctx, "r", drain.PauseRequest{}); err != nil {
		t.Fatal(err)
	}
	clk.add(2 * time.Minute)
	time.Sleep(100 * time.Millisecond)
	if n := len(resumes(t, mem)); n != 2 || sched.len() != 0 {
		t.Fatalf("%d RunResumed, %d scheduled: want alice's and bob's only, the stale entry dropped", n, sched.len())
	}
	if snap, _ := mem.ProjectSnapshot(ctx, "r"); snap.Status != "PAUSED" || snap.Pause.Cycle != 3 {
		t.Fatalf("status %s cycle %d, want PAUSED in cycle 3", snap.Status, snap.Pause.Cycle)
	}
}

// TestSchedule_StaggeredResumeAtItsTime: a staggered resume that this
// replica queued is carried out at its time, not at the next read of the
// schedule (an hour away here), and not before.
func TestSchedule_StaggeredResumeAtItsTime(t *testing.T) {
	ctx := context.Background()
	mem, eng := scheduledRun(t)
	sched := &memSchedule{m: map[string]drain.ScheduledResume{}}
	c := drain.New(mem, emitter{mem}, eng, drain.Options{
		ActiveRuns: func(context.Context) ([]string, error) { return []string{"r"}, nil },
		Schedule:   sched, IndexInterval: time.Hour, FullScanInterval: time.Hour, Logger: zaptest.NewLogger(t),
	})
	if err := c.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(ctx) })
	if _, err := c.Pause(ctx, "r", drain.PauseRequest{Reason: "incident"}); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(300 * time.Millisecond)
	if _, err := c.ResumeLater(ctx, "r", at, drain.ResumeRequest{RequestedBy: "alice"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for len(resumes(t, mem)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no RunResumed a minute after its time: it waits for the next read of the schedule")
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := resumes(t, mem)
	if when, _ := time.Parse(time.RFC3339Nano, got[0].PersistedAt); when.Before(at) {
		t.Fatalf("resumed at %s, before its time %s", when, at)
	}
	waitFor := time.Now().Add(time.Minute)
	for sched.len() != 0 {
		if time.Now().After(waitFor) {
			t.Fatal("the entry stays in the schedule after its resume")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
