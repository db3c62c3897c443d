package drain

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

type countedReads struct {
	*memstore.Store
	n atomic.Int64
}

func (c *countedReads) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	c.n.Add(1)
	return c.Store.ProjectSnapshot(ctx, runID)
}

// TestFullPass_SpreadAtItsRate: the full pass over the active runs reads
// them a share per tick, at most FullScanRate a second, and sets the
// runs-by-status gauges once it has read them all (a pass that read 10,000
// runs at once every 30 s was once the drain monitor's idle cost).
func TestFullPass_SpreadAtItsRate(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	var ids []string
	for i := range 1000 {
		id := fmt.Sprintf("run-%04d", i)
		ids = append(ids, id)
		if _, err := mem.Append(ctx, storetest.Event(id, statestore.RunStarted, "")); err != nil {
			t.Fatal(err)
		}
	}
	reads := &countedReads{Store: mem}
	c := New(reads, nil, nil, Options{
		ActiveRuns: func(context.Context) ([]string, error) { return ids, nil },
		Interval:   250 * time.Millisecond, FullScanInterval: 30 * time.Second, FullScanRate: 20,
	})
	// 1,000 runs at 20 a second: a pass of 50 s, 200 ticks, 5 runs a tick.
	var p fullPass
	ticks := 0
	for {
		before := reads.n.Load()
		if !c.passStep(ctx, &p) {
			t.Fatal("the pass failed")
		}
		ticks++
		if n := reads.n.Load() - before; n > 5 {
			t.Fatalf("tick %d read %d runs, want at most 5 (20 a second at 4 ticks a second)", ticks, n)
		}
		if p.counts == nil {
			break
		}
	}
	if ticks != 200 || reads.n.Load() != 1000 {
		t.Fatalf("the pass took %d ticks and read %d runs, want 200 and 1000", ticks, reads.n.Load())
	}
	if until := time.Until(p.due); until < 49*time.Second || until > 50*time.Second {
		t.Fatalf("the next pass is due in %v, want 50 s after this one began", until)
	}
	if !c.passStep(ctx, &p) || reads.n.Load() != 1000 {
		t.Fatal("a pass began before it was due")
	}
}

// TestFullPass_ReplicasShareTheRate: a replica owning a fifth of the runs
// passes over its share in the period one replica would take over all of
// them (FullScanRate is the deployment's), so that the replicas together
// read no faster than one.
func TestFullPass_ReplicasShareTheRate(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	var ids []string
	fifth := ownsFunc(func(id string) bool { return id[len(id)-1] == '0' || id[len(id)-1] == '5' })
	for i := range 1000 {
		id := fmt.Sprintf("run-%04d", i)
		ids = append(ids, id)
		if _, err := mem.Append(ctx, storetest.Event(id, statestore.RunStarted, "")); err != nil {
			t.Fatal(err)
		}
	}
	reads := &countedReads{Store: mem}
	c := New(reads, nil, nil, Options{
		ActiveRuns: func(context.Context) ([]string, error) { return ids, nil },
		Owner:      fifth, Interval: 250 * time.Millisecond, FullScanInterval: 30 * time.Second, FullScanRate: 20,
	})
	// 1,000 runs at 20 a second between the replicas: a pass of 50 s,
	// 200 ticks; this replica's 200 runs, one a tick.
	var p fullPass
	ticks := 0
	for {
		if !c.passStep(ctx, &p) {
			t.Fatal("the pass failed")
		}
		ticks++
		if p.counts == nil {
			break
		}
	}
	if ticks != 200 || reads.n.Load() != 200 {
		t.Fatalf("the pass took %d ticks and read %d runs, want 200 and 200 (its share, over the deployment's period)", ticks, reads.n.Load())
	}
}

type ownsFunc func(string) bool

func (f ownsFunc) Owns(id string) bool { return f(id) }
