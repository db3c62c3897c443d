package drain_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestMonitor_StoreDown: while the store does not answer, the monitor
// backs off between scans and logs a bounded number of lines (issue #11
// §4: one warning per run every 250 ms); a second Open is refused.
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
