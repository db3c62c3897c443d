package drain_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestMonitor_StoreDown: while the store does not answer, the monitor
// backs off between scans and logs a bounded number of lines (before, one
// warning per run every 250 ms); a second Open is refused.
func TestMonitor_StoreDown(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.Start(t)
	store, err := natsstore.Open(ctx, js, natsstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	js.Conn().Close() // the store is down from here on
	var scans atomic.Int64
	core, logs := observer.New(zapcore.WarnLevel)
	c := drain.New(store, nil, &engine{}, drain.Options{
		Interval: 5 * time.Millisecond,
		ActiveRuns: func(context.Context) ([]string, error) {
			scans.Add(1)
			return []string{"r1", "r2", "r3", "r4", "r5"}, nil
		},
		Logger: zap.New(core),
	})
	if err := c.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Open(ctx); !errors.Is(err, drain.ErrAlreadyOpen) {
		t.Fatalf("second Open: %v, want ErrAlreadyOpen", err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Without backoff: about 300 scans of 5 runs and as many warnings.
	if n := scans.Load(); n > 30 {
		t.Errorf("%d scans in 1.5 s with the store down and a 5 ms interval, want a backoff", n)
	}
	if n := logs.Len(); n > 2 {
		t.Errorf("%d warnings in 1.5 s with the store down, want at most one a minute: %v", n, logs.All())
	}
	t.Logf("%d scans, %d warnings", scans.Load(), logs.Len())
}

// countingReader counts the snapshot reads of each run.
type countingReader struct {
	*memstore.Store
	mu    sync.Mutex
	reads map[string]int
}

func (c *countingReader) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	c.mu.Lock()
	c.reads[runID]++
	c.mu.Unlock()
	return c.Store.ProjectSnapshot(ctx, runID)
}

func (c *countingReader) count(runID string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads[runID]
}

// TestMonitor_CostFollowsDrains: between its full passes the monitor reads
// only the runs whose drain is open, not every active run (when it read
// them all, an idle sidecar spent 35% of a core per 1,000 active runs, most
// of it here).
func TestMonitor_CostFollowsDrains(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	var ids []string
	for i := range 200 {
		id := fmt.Sprintf("idle-%03d", i)
		ids = append(ids, id)
		if _, err := mem.Append(ctx, storetest.Event(id, statestore.RunStarted, "")); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []*statestore.RunEventWrite{
		storetest.Event("draining", statestore.RunStarted, ""),
		storetest.Event("draining", statestore.StepStarted, "a"),
	} {
		if _, err := mem.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	ids = append(ids, "draining")
	reader := &countingReader{Store: mem, reads: map[string]int{}}
	c := drain.New(reader, emitter{mem}, &engine{}, drain.Options{
		ActiveRuns: func(context.Context) ([]string, error) { return ids, nil },
		Interval:   10 * time.Millisecond, FullScanInterval: time.Hour, Logger: zaptest.NewLogger(t),
	})
	if err := c.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(ctx) })
	if _, err := c.Pause(ctx, "draining", drain.PauseRequest{TimeoutSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	before := reader.count("idle-000")
	time.Sleep(300 * time.Millisecond) // about 30 ticks
	if n := reader.count("idle-000") - before; n != 0 {
		t.Fatalf("an idle run was read %d times in 30 ticks; only draining runs are checked between full passes", n)
	}
	if n := reader.count("draining"); n < 10 {
		t.Fatalf("the draining run was read %d times in 30 ticks", n)
	}
	if w := c.Watched(); w != 1 {
		t.Fatalf("watching %d runs, want 1", w)
	}
	// The drain ends: the run is no longer watched.
	if _, err := mem.Append(ctx, storetest.Event("draining", statestore.StepCompleted, "a")); err != nil {
		t.Fatal(err)
	}
	c.Nudge("draining")
	deadline := time.Now().Add(5 * time.Second)
	for c.Watched() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the drained run is still watched")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// memIndex is a drain index in memory, shared by the controllers of a test
// (adapter.Runs keeps it in the run index; TestRuns_DrainIndex covers that
// one on a real JetStream KV).
type memIndex struct {
	mu    sync.Mutex
	marks map[string]int64
}

func (x *memIndex) MarkDraining(_ context.Context, runID string, cycle int64) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.marks[runID] = cycle
	return nil
}

func (x *memIndex) EndDraining(_ context.Context, runID string, cycle int64) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.marks[runID] <= cycle {
		delete(x.marks, runID)
	}
	return nil
}

func (x *memIndex) DrainingRunIDs(context.Context) ([]string, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var ids []string
	for id := range x.marks {
		ids = append(ids, id)
	}
	return ids, nil
}

func (x *memIndex) len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.marks)
}

// TestMonitor_FindsAnotherReplicasDrainThroughTheIndex: a drain paused on
// one replica is ended by another whose full pass is an hour away: the
// pause marks the run in the drain index, the other replica's monitor reads
// the index, watches the run, records RunDrainCompleted and removes the
// mark (the monitor reads only the runs that drain).
func TestMonitor_FindsAnotherReplicasDrainThroughTheIndex(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a")
	index := &memIndex{marks: map[string]int64{}}
	newReplica := func() *drain.Controller {
		return drain.New(mem, emitter{mem}, eng, drain.Options{
			ActiveRuns: func(context.Context) ([]string, error) { return []string{"r"}, nil },
			Drains:     index, Interval: 10 * time.Millisecond, IndexInterval: 20 * time.Millisecond,
			FullScanInterval: time.Hour, Logger: zaptest.NewLogger(t),
		})
	}
	pausing, other := newReplica(), newReplica()
	if err := other.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close(ctx) })
	if _, err := pausing.Pause(ctx, "r", drain.PauseRequest{TimeoutSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	if index.len() != 1 {
		t.Fatalf("the pause left %d marks in the drain index, want 1", index.len())
	}
	// The step ends on a third process: no nudge reaches either monitor.
	if _, err := mem.Append(ctx, storetest.Event("r", statestore.StepCompleted, "a")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		snap, err := mem.ProjectSnapshot(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		if snap.Pause.DrainEndedAt != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other replica did not end the drain; it never read the drain index")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for index.len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the drain ended but its mark stays in the drain index")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if w := other.Watched(); w != 0 {
		t.Fatalf("the other replica still watches %d runs", w)
	}
}

// TestPause_NothingInFlightEndsTheDrainAtOnce: a pause of a run with no
// step in flight records RunDrainCompleted in the same call, and leaves
// nothing for the monitor (before, pausing 50,000 runs left every drain to
// the monitor's one goroutine, which ended them long after
// their 250 ms).
func TestPause_NothingInFlightEndsTheDrainAtOnce(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t)
	index := &memIndex{marks: map[string]int64{}}
	c := drain.New(mem, emitter{mem}, eng, drain.Options{
		ActiveRuns: func(context.Context) ([]string, error) { return []string{"r"}, nil },
		Drains:     index, Logger: zaptest.NewLogger(t),
	}) // never opened: no monitor runs
	st, err := c.Pause(ctx, "r", drain.PauseRequest{})
	if err != nil {
		t.Fatal(err)
	}
	events, err := mem.Fetch(ctx, "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if last := events[len(events)-1]; last.EventType != statestore.RunDrainCompleted || last.LogicalAttemptID != 1 {
		t.Fatalf("last event %s (attempt %d), want RunDrainCompleted of cycle 1", last.EventType, last.LogicalAttemptID)
	}
	if st.Drain == nil || st.Drain.EndedAt == "" || st.Drain.Draining {
		t.Fatalf("the answer shows the drain open: %+v", st.Drain)
	}
	if index.len() != 0 || c.Watched() != 0 {
		t.Fatalf("%d marks in the drain index, %d runs watched: want none", index.len(), c.Watched())
	}
	// With a step in flight the drain stays open, for the monitor.
	mem2, eng2 := setup(t, "a")
	c2 := drain.New(mem2, emitter{mem2}, eng2, drain.Options{
		ActiveRuns: func(context.Context) ([]string, error) { return []string{"r"}, nil },
		Drains:     index, Logger: zaptest.NewLogger(t),
	})
	if st, err := c2.Pause(ctx, "r", drain.PauseRequest{}); err != nil || st.Drain.EndedAt != "" || !st.Drain.Draining {
		t.Fatalf("pause with a step in flight: %+v %v", st.Drain, err)
	}
	if index.len() != 1 || c2.Watched() != 1 {
		t.Fatalf("%d marks, %d watched: want the open drain in both", index.len(), c2.Watched())
	}
}

// resumeAfterRead is the monitor's view of the log (memstore, the real
// store's double), with an operator's resume of pause cycle 1 landing
// right after the first read of run that shows it PAUSED: between the
// monitor's decision that the drain ended and its append.
type resumeAfterRead struct {
	*memstore.Store
	t    *testing.T
	run  string
	once sync.Once
}

func (r *resumeAfterRead) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := r.Store.ProjectSnapshot(ctx, runID)
	if err != nil || runID != r.run || snap.Status != statestore.RunStatusPaused {
		return snap, err
	}
	r.once.Do(func() {
		if _, err := r.Store.Append(ctx, storetest.Event(runID, statestore.RunResumed, "")); err != nil {
			r.t.Errorf("the operator's resume: %v", err)
		}
	})
	return snap, nil
}

// TestMonitor_ResumeBeforeDrainEnd: a resume that lands after the monitor
// decided that a pause's drain ended (completed: no step in flight; timed
// out: the deadline passed) and before its append gets no
// RunDrainCompleted or RunDrainTimedOut after it, which are valid from
// PAUSED only: the drain's end is appended on the state it was decided on,
// and decided again when the run moved on.
func TestMonitor_ResumeBeforeDrainEnd(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []*statestore.RunEventWrite
		later  time.Duration // how long after the pause the monitor looks
	}{
		{"RunDrainCompleted", []*statestore.RunEventWrite{
			storetest.Event("r", statestore.RunStarted, ""), storetest.Event("r", statestore.RunPaused, ""),
		}, 0},
		{"RunDrainTimedOut", []*statestore.RunEventWrite{
			storetest.Event("r", statestore.RunStarted, ""), storetest.Event("r", statestore.StepStarted, "a"),
			storetest.Event("r", statestore.RunPaused, ""),
		}, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			mem := memstore.New(statestore.ProjectorOptions{})
			for _, w := range tc.events {
				if _, err := mem.Append(ctx, w); err != nil {
					t.Fatal(err)
				}
			}
			reader := &resumeAfterRead{Store: mem, t: t, run: "r"}
			c := drain.New(reader, emitter{mem}, &engine{}, drain.Options{
				DefaultTimeout: time.Minute, Logger: zaptest.NewLogger(t),
				Now: func() time.Time { return time.Now().Add(tc.later) },
			})
			snap := c.Check(ctx, "r")
			recs, err := mem.Fetch(ctx, "r", 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, alerts := statestore.Reduce(nil, recs); len(alerts) != 0 {
				t.Fatalf("the monitor appended an event the projector flags: %s", alerts[0].Reason)
			}
			if n := len(recs); recs[n-1].EventType != statestore.RunResumed {
				t.Fatalf("last event %s, want the resume (nothing after it)", recs[n-1].EventType)
			}
			if snap == nil || snap.Status != statestore.RunStatusRunning {
				status := "no state"
				if snap != nil {
					status = snap.Status
				}
				t.Fatalf("Check returned %s, want the run's state after the resume (RUNNING)", status)
			}
		})
	}
}
