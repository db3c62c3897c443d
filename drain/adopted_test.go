package drain_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// conductorTasks stands for the adopter: the runs named adopted-* are
// adopted workflows' runs, whose system task "http" Conductor scheduled
// before their pause reached it. SyncEngineTasks records it, as the
// adopter's read of the workflow does, once Conductor's pause was asked.
type conductorTasks struct {
	mem    *memstore.Store
	eng    *bulkEngine
	mu     sync.Mutex
	synced []string
	nudged []string
}

func (a *conductorTasks) Adopts(runID, _ string) bool { return strings.HasPrefix(runID, "adopted-") }

func (a *conductorTasks) SyncEngineTasks(ctx context.Context, runID string) error {
	a.eng.bmu.Lock()
	asked := strings.Contains(strings.Join(a.eng.bulk, " "), "wf-"+runID)
	a.eng.bmu.Unlock()
	a.mu.Lock()
	a.synced = append(a.synced, runID)
	a.mu.Unlock()
	if !asked {
		return nil // read before Conductor's pause: what it shows may still change
	}
	_, err := a.mem.Append(ctx, storetest.Event(runID, statestore.StepStarted, "http"))
	return err
}

func (a *conductorTasks) Resumed(runID string) {
	a.mu.Lock()
	a.nudged = append(a.nudged, runID)
	a.mu.Unlock()
}

// TestController_AdoptedRunDrainsForConductorsTasks: a pause of an adopted
// run with nothing in flight in the log does not end its drain until the
// tasks Conductor runs itself are read once Conductor's pause took effect
// (they are in flight then), single and bulk; a plan run's drain ends at
// once as before. A resume that reached Conductor asks for the adopted
// run to be read back.
func TestController_AdoptedRunDrainsForConductorsTasks(t *testing.T) {
	ctx := context.Background()
	for _, bulk := range []bool{false, true} {
		name := map[bool]string{false: "single", true: "bulk"}[bulk]
		t.Run(name, func(t *testing.T) {
			mem := memstore.New(statestore.ProjectorOptions{})
			startRun(t, mem, "adopted-1")
			startRun(t, mem, "plan-1")
			eng := &bulkEngine{}
			adopted := &conductorTasks{mem: mem, eng: eng}
			c := drain.New(mem, emitter{mem}, eng, drain.Options{ActiveRuns: func(context.Context) ([]string, error) { return nil, nil },
				Interval: 10 * time.Millisecond, FullScanInterval: time.Hour, Adopted: adopted, Logger: zaptest.NewLogger(t)})
			if err := c.Open(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			states := map[string]*drain.State{}
			if bulk {
				for _, o := range c.PauseMany(ctx, []string{"adopted-1", "plan-1"}, drain.PauseRequest{Reason: "incident"}) {
					if o.Err != nil {
						t.Fatalf("%s: %v", o.RunID, o.Err)
					}
					states[o.RunID] = o.State
				}
			} else {
				for _, id := range []string{"adopted-1", "plan-1"} {
					eng.bulk = append(eng.bulk, "pause wf-"+id) // the single pause's call, as the fake's bulk log keeps it
					st, err := c.Pause(ctx, id, drain.PauseRequest{Reason: "incident"})
					if err != nil {
						t.Fatalf("%s: %v", id, err)
					}
					states[id] = st
				}
			}
			if st := states["adopted-1"]; st.Substatus != "DRAINING" || st.Drain == nil || strings.Join(st.Drain.InFlightStepIDs, ",") != "http" {
				t.Errorf("adopted run: %s/%s drain %+v, want PAUSED/DRAINING with http (Conductor's task) in flight", st.Status, st.Substatus, st.Drain)
			}
			if st := states["plan-1"]; st.Substatus != "" || st.Status != statestore.RunStatusPaused {
				t.Errorf("plan run: %s/%s, want PAUSED, drain ended", st.Status, st.Substatus)
			}
			snap, _ := mem.ProjectSnapshot(ctx, "adopted-1")
			if snap.Pause == nil || snap.Pause.DrainEndedAt != "" {
				t.Fatalf("adopted run's drain ended with Conductor's task in flight: %+v", snap.Pause)
			}
			adopted.mu.Lock()
			synced := strings.Join(adopted.synced, ",")
			adopted.mu.Unlock()
			if synced != "adopted-1" {
				t.Errorf("tasks read for %q, want adopted-1 only", synced)
			}
			if _, err := c.Resume(ctx, "adopted-1", drain.ResumeRequest{}); err != nil {
				t.Fatal(err)
			}
			adopted.mu.Lock()
			defer adopted.mu.Unlock()
			if strings.Join(adopted.nudged, ",") != "adopted-1" {
				t.Errorf("read back after the resume: %v, want adopted-1", adopted.nudged)
			}
		})
	}
}

// heldSync is conductorTasks whose first read of the workflow (the
// pause's) waits for release (Conductor slow to answer), meanwhile the
// monitor runs; a read made meanwhile is noted in early.
type heldSync struct {
	*conductorTasks
	entered, release chan struct{}
	mu               sync.Mutex
	calls            int
	early            bool
}

func (h *heldSync) SyncEngineTasks(ctx context.Context, runID string) error {
	h.mu.Lock()
	h.calls++
	first := h.calls == 1
	if !first {
		select {
		case <-h.release:
		default:
			h.early = true
		}
	}
	h.mu.Unlock()
	if first {
		close(h.entered)
		<-h.release
	}
	return h.conductorTasks.SyncEngineTasks(ctx, runID)
}

// TestController_AdoptedDrainEndsOnlyAfterConductorsTasksAreRead: the
// monitor never ends an adopted run's drain on the log alone. While the
// pause's own read of the workflow is under way the run is not watched
// (a monitor that ran meanwhile ended the drain before that read recorded
// Conductor's running HTTP task); and a drain the monitor finds by itself
// (a pause made in Conductor, recorded by the follower) is ended only
// after a read of the workflow.
func TestController_AdoptedDrainEndsOnlyAfterConductorsTasksAreRead(t *testing.T) {
	ctx := context.Background()
	t.Run("PauseReadUnderWay", func(t *testing.T) {
		mem := memstore.New(statestore.ProjectorOptions{})
		startRun(t, mem, "adopted-1")
		eng := &bulkEngine{bulk: []string{"pause wf-adopted-1"}}
		held := &heldSync{conductorTasks: &conductorTasks{mem: mem, eng: eng}, entered: make(chan struct{}), release: make(chan struct{})}
		c := drain.New(mem, emitter{mem}, eng, drain.Options{ActiveRuns: func(context.Context) ([]string, error) { return nil, nil },
			Interval: 5 * time.Millisecond, FullScanInterval: time.Hour, Adopted: held, Logger: zaptest.NewLogger(t)})
		if err := c.Open(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		done := make(chan *drain.State, 1)
		go func() {
			st, _ := c.Pause(ctx, "adopted-1", drain.PauseRequest{Reason: "incident"})
			done <- st
		}()
		<-held.entered
		time.Sleep(100 * time.Millisecond) // twenty monitor intervals
		close(held.release)
		st := <-done
		snap, _ := mem.ProjectSnapshot(ctx, "adopted-1")
		if snap.Pause == nil || snap.Pause.DrainEndedAt != "" || st.Substatus != "DRAINING" {
			t.Fatalf("drain %+v, answer %s/%s: the drain ended while the pause's read of Conductor's tasks was under way", snap.Pause, st.Status, st.Substatus)
		}
		held.mu.Lock()
		defer held.mu.Unlock()
		if held.early {
			t.Fatal("the monitor checked the drain while the pause's read of Conductor's tasks was under way")
		}
	})
	t.Run("FoundByTheMonitor", func(t *testing.T) {
		mem := memstore.New(statestore.ProjectorOptions{})
		startRun(t, mem, "adopted-1")
		eng := &bulkEngine{bulk: []string{"pause wf-adopted-1"}} // paused in Conductor
		adopted := &conductorTasks{mem: mem, eng: eng}
		c := drain.New(mem, emitter{mem}, eng, drain.Options{Adopted: adopted, Logger: zaptest.NewLogger(t)})
		timeout := int64(300)
		if _, err := mem.Append(ctx, storetest.WithPayload(storetest.Event("adopted-1", statestore.RunPaused, ""),
			statestore.RunPausedPayload{RequestedBy: statestore.RequestedByConductor, DrainTimeoutSeconds: &timeout})); err != nil {
			t.Fatal(err)
		}
		snap := c.Check(ctx, "adopted-1")
		if snap == nil || snap.Pause == nil || snap.Pause.DrainEndedAt != "" || len(snap.InFlight()) != 1 {
			t.Fatalf("after the monitor's check: %+v; want the drain open with Conductor's http task in flight", snap)
		}
	})
}

// failingSync stands for Conductor failing every read of an adopted run's
// tasks (down, or the workflow gone): it counts the reads.
type failingSync struct {
	mu    sync.Mutex
	reads int
}

func (f *failingSync) Adopts(runID, _ string) bool { return strings.HasPrefix(runID, "adopted-") }
func (f *failingSync) Resumed(string)              {}
func (f *failingSync) SyncEngineTasks(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return errors.New("connection refused")
}

// TestController_AdoptedReadFailingIsBounded: while the reads of a
// draining adopted run's tasks fail, the monitor, whose passes over the
// store keep working, logs the failure once a minute (a pass that read
// the store did not reset that bound: ~4 lines a second before) and reads
// Conductor with a backoff, not at every tick.
func TestController_AdoptedReadFailingIsBounded(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	startRun(t, mem, "adopted-1")
	timeout := int64(300)
	if _, err := mem.Append(ctx, storetest.WithPayload(storetest.Event("adopted-1", statestore.RunPaused, ""),
		statestore.RunPausedPayload{RequestedBy: statestore.RequestedByConductor, DrainTimeoutSeconds: &timeout})); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	sync := &failingSync{}
	c := drain.New(mem, emitter{mem}, &bulkEngine{}, drain.Options{ActiveRuns: func(context.Context) ([]string, error) { return []string{"adopted-1"}, nil },
		Interval: 5 * time.Millisecond, FullScanInterval: 20 * time.Millisecond, Adopted: sync, Logger: zap.New(core)})
	if err := c.Open(ctx); err != nil {
		t.Fatal(err)
	}
	// The first read failed; the monitor then ticks on for a second (200
	// ticks) against the failing reads.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		sync.mu.Lock()
		n := sync.reads
		sync.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the monitor never read the adopted run's tasks")
		}
	}
	time.Sleep(time.Second)
	_ = c.Close(ctx)
	warned, recovered := 0, 0
	for _, e := range logs.All() {
		switch {
		case strings.HasPrefix(e.Message, "could not read an adopted run's tasks"):
			warned++
		case strings.HasPrefix(e.Message, "the drain monitor reads the store again"):
			recovered++
		}
	}
	sync.mu.Lock()
	reads := sync.reads
	sync.mu.Unlock()
	if warned != 1 || recovered != 0 || reads > 5 {
		t.Fatalf("in 1 s of failing reads: %d warnings, %d recoveries logged, %d reads of Conductor; want 1, 0 and a few", warned, recovered, reads)
	}
	snap, _ := mem.ProjectSnapshot(ctx, "adopted-1")
	if snap.Pause == nil || snap.Pause.DrainEndedAt != "" {
		t.Fatalf("the drain ended without a read of Conductor's tasks: %+v", snap.Pause)
	}
}
