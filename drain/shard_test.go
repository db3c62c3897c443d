package drain_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// owns is an Owner that owns the runs of its set (membership.Members is
// the real one; here the split must be known in advance).
type owns map[string]bool

func (o owns) Owns(runID string) bool { return o[runID] }

// TestMonitor_ReplicasDivideTheDrains: two replicas whose Owners split six
// draining runs read only their own runs from the drain index and in
// their full passes, end their own drains, and count only their own in
// the drain gauges (so that a sum over replicas counts each drain once);
// a drain a replica started itself is watched there too, whoever owns it
// (before, every replica read every active run).
func TestMonitor_ReplicasDivideTheDrains(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	ids := make([]string, 6)
	even, odd := owns{}, owns{}
	for i := range ids {
		ids[i] = fmt.Sprintf("r%d", i)
		for _, w := range []*statestore.RunEventWrite{
			storetest.Event(ids[i], statestore.RunStarted, ""),
			storetest.Event(ids[i], statestore.StepStarted, "a"),
		} {
			if _, err := mem.Append(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		if i%2 == 0 {
			even[ids[i]] = true
		} else {
			odd[ids[i]] = true
		}
	}
	index := &memIndex{marks: map[string]int64{}}
	type replica struct {
		c      *drain.Controller
		reader *countingReader
		reg    *prometheus.Registry
	}
	newReplica := func(o owns) replica {
		r := replica{reader: &countingReader{Store: mem, reads: map[string]int{}}, reg: prometheus.NewRegistry()}
		r.c = drain.New(r.reader, emitter{mem}, &engine{}, drain.Options{
			ActiveRuns: func(context.Context) ([]string, error) { return ids, nil },
			Drains:     index, Owner: o, Interval: 10 * time.Millisecond, IndexInterval: 20 * time.Millisecond,
			FullScanInterval: 50 * time.Millisecond, Logger: zaptest.NewLogger(t), Metrics: drain.NewMetrics(r.reg),
		})
		return r
	}
	a, b := newReplica(even), newReplica(odd)
	// a pauses r1, b's run: a replica watches the drains it starts,
	// whoever owns them. The other runs are paused on a third replica
	// that does not watch (as if it had died since): they are found
	// through the drain index.
	for _, id := range ids {
		pauser := drain.New(mem, emitter{mem}, &engine{}, drain.Options{Drains: index})
		if id == "r1" {
			pauser = a.c
		}
		if _, err := pauser.Pause(ctx, id, drain.PauseRequest{TimeoutSeconds: 3600}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []replica{a, b} {
		if err := r.c.Open(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.c.Close(ctx) })
	}
	time.Sleep(300 * time.Millisecond) // index reads, full passes, ticks: several of each
	for _, id := range ids {
		if n := a.reader.count(id); odd[id] && id != "r1" && n != 0 {
			t.Errorf("replica a read run %s, not its own, %d times", id, n)
		}
		if n := b.reader.count(id); even[id] && n != 0 {
			t.Errorf("replica b read run %s, not its own, %d times", id, n)
		}
		if owner := map[bool]replica{true: a, false: b}[even[id]]; owner.reader.count(id) < 5 {
			t.Errorf("run %s read %d times by its owner in 300 ms, want it watched", id, owner.reader.count(id))
		}
	}
	if a.c.Watched() != 4 || b.c.Watched() != 3 {
		t.Errorf("watched: a %d, b %d; want 4 (its three and the drain it started) and 3", a.c.Watched(), b.c.Watched())
	}
	for _, r := range []replica{a, b} {
		if n := gaugeValue(t, r.reg, "sidecar_drain_runs_draining"); n != 3 {
			t.Errorf("sidecar_drain_runs_draining = %v on a replica owning 3 drains, want 3", n)
		}
	}
	// The steps end on a third process: each drain is ended (by its owner).
	for _, id := range ids {
		if _, err := mem.Append(ctx, storetest.Event(id, statestore.StepCompleted, "a")); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, id := range ids {
		for {
			snap, err := mem.ProjectSnapshot(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if snap.Pause.DrainEndedAt != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the drain of %s never ended", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// gaugeValue reads the unlabelled gauge name from reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestMonitor_PausedRunsByOrigin: the full pass counts the paused runs by
// where the pause came from (sidecar_runs_paused{origin}), a bounded label
// where the reason is free text (for a dashboard panel of paused runs).
func TestMonitor_PausedRunsByOrigin(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	pauses := map[string]map[string]any{
		"op-1": {"reason": "db maintenance", "requestedBy": "jane"},
		"op-2": {"reason": "something else", "requestedBy": "ops-bot"},
		"held": {"reason": "stepFailed", "stepId": "a", "requestedBy": "sidecar w1"},
		"ui":   {"requestedBy": "conductor"},
		"live": nil,
	}
	var ids []string
	for id, p := range pauses {
		ids = append(ids, id)
		if _, err := mem.Append(ctx, storetest.Event(id, statestore.RunStarted, "")); err != nil {
			t.Fatal(err)
		}
		if p != nil {
			if _, err := mem.Append(ctx, storetest.WithPayload(storetest.Event(id, statestore.RunPaused, ""), p)); err != nil {
				t.Fatal(err)
			}
		}
	}
	reg := prometheus.NewRegistry()
	c := drain.New(mem, emitter{mem}, &engine{}, drain.Options{
		ActiveRuns: func(context.Context) ([]string, error) { return ids, nil }, Metrics: drain.NewMetrics(reg), Logger: zaptest.NewLogger(t),
	})
	c.Scan(ctx)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "sidecar_runs_paused" {
			continue
		}
		for _, m := range f.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	if got["operator"] != 2 || got["step_failed"] != 1 || got["conductor"] != 1 || len(got) != 3 {
		t.Fatalf("sidecar_runs_paused %v, want operator 2, step_failed 1, conductor 1", got)
	}
}
