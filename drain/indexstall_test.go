package drain_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// stallingIndex is a drain index (real KV) whose listing, once stalled,
// answers nothing until its caller gives up: a listing of a bucket whose
// NATS leader just died. A fake of that moment: a cluster's election
// cannot be timed by a test.
type stallingIndex struct {
	*drain.Keys
	stalled atomic.Bool
}

func (s *stallingIndex) DrainingRunIDs(ctx context.Context) ([]string, error) {
	if s.stalled.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Keys.DrainingRunIDs(ctx)
}

// TestMonitor_DrainEndsWhileTheIndexListingStalls: the drain monitor's
// read of the drain index (a KV listing, bounded by ListTimeout, 30 s)
// does not hold up its checks of the runs it watches: a drain whose last
// step ends (with no nudge: another replica's step) ends at the next
// check while the listing hangs. Before, the checks waited for the
// listing, and a failed listing skipped them.
func TestMonitor_DrainEndsWhileTheIndexListingStalls(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a")
	keys, _ := openKeys(t)
	index := &stallingIndex{Keys: keys}
	c := drain.New(mem, emitter{mem}, eng, drain.Options{
		ActiveRuns: func(context.Context) ([]string, error) { return []string{"r"}, nil },
		Drains:     index, Interval: 50 * time.Millisecond, IndexInterval: 100 * time.Millisecond, Logger: zaptest.NewLogger(t),
	})
	if err := c.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	if st, err := c.Pause(ctx, "r", drain.PauseRequest{TimeoutSeconds: 600}); err != nil || st.Substatus != "DRAINING" {
		t.Fatalf("pause: %+v %v", st, err)
	}
	index.stalled.Store(true)
	time.Sleep(300 * time.Millisecond) // the monitor is in a listing that hangs
	mem.Append(ctx, storetest.Event("r", statestore.StepCompleted, "a"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		snap, _ := mem.ProjectSnapshot(ctx, "r")
		if snap.Pause != nil && snap.Pause.DrainEndedAt != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the drain did not end within 10 s of its last step's end (checks every 50 ms) while the index listing hangs")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
