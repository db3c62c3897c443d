package drain_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// downReads is a state store that does not answer while down is set.
type downReads struct {
	drain.SnapshotReader
	down atomic.Bool
}

func (d *downReads) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	if d.down.Load() {
		return nil, errors.New("the state store does not answer (test)")
	}
	return d.SnapshotReader.ProjectSnapshot(ctx, runID)
}

// The monitor's warning about a run it cannot read is logged once a minute
// while the store stays down, however often the run is checked: a pass
// that read nothing (no drain watched) is no sign that the store is back.
// Before, each such pass let the next warning through, and one run's
// checks logged it 6 times in 16 s during a PostgreSQL outage.
func TestMonitor_StoreDownWarnsOnceAMinute(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a")
	reads := &downReads{SnapshotReader: mem}
	core, logs := observer.New(zapcore.InfoLevel)
	c := drain.New(reads, emitter{mem}, eng, drain.Options{
		ActiveRuns: func(context.Context) ([]string, error) { return nil, nil },
		Interval:   20 * time.Millisecond, Logger: zap.New(core),
	})
	if err := c.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	reads.down.Store(true)
	for range 5 {
		c.Check(ctx, "r") // a step of it ended: may its drain end?
		time.Sleep(100 * time.Millisecond)
	}
	n := 0
	for _, e := range logs.All() {
		if strings.HasPrefix(e.Message, "cannot read a run's state") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d warnings about the unreadable run in 5 checks while the store is down, want 1", n)
	}
}
