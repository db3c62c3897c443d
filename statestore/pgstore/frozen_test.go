package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestStore_FrozenServerFailsWithinTheBound: the PostgreSQL host stops
// answering without closing its connections (every process of the cluster
// stopped: a hung host, a partition). Every call of the store fails with
// STORE_UNAVAILABLE within its bound, whatever its caller's deadline: a
// step's deadline can be an hour away, and a call that waits for it holds
// the run's start lock and a pool connection all that time. No statement
// runs longer than the server's statement_timeout, so a call still
// waiting after it (and the store's timeout) waits on a host that stopped
// answering.
func TestStore_FrozenServerFailsWithinTheBound(t *testing.T) {
	cl := pgtest.Own(t)
	const timeout, statementTimeout = 300 * time.Millisecond, time.Second
	s, err := pgstore.Open(context.Background(), cl.URL, pgstore.Options{Logger: zaptest.NewLogger(t), Timeout: timeout, StatementTimeout: statementTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	const runID = "run-frozen"
	ctx := context.Background()
	var last statestore.AppendResult
	for i := range 3 {
		if last, err = s.Append(ctx, storetest.Event(runID, statestore.StepStarted, fmt.Sprintf("s%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	key := storetest.Event(runID, statestore.StepStarted, "s0").IdempotencyKey
	tail, err := s.Follow(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	snaps := pgstore.Snapshots(s)
	rm, err := pgstore.OpenRemover(ctx, cl.URL, pgstore.RemoverOptions{Logger: zaptest.NewLogger(t), Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rm.Close)
	calls := map[string]func(ctx context.Context, name string) error{
		"append": func(ctx context.Context, name string) error {
			_, err := s.Append(ctx, storetest.Event(runID+"-"+name, statestore.StepStarted, "late"))
			return err
		},
		"conditional append": func(ctx context.Context, name string) error {
			_, err := s.AppendIf(ctx, storetest.Event(runID, statestore.StepStarted, "late-if-"+name), last.RunSeq)
			return err
		},
		"batch": func(ctx context.Context, name string) error {
			res := s.AppendBatch(ctx, []statestore.RunBatch{{Events: []*statestore.RunEventWrite{storetest.Event("run-frozen-batch-"+name, statestore.RunStarted, "")}}})
			return res[0].Err
		},
		"fetch":         func(ctx context.Context, _ string) error { _, err := s.Fetch(ctx, runID, 0, 0); return err },
		"lookup":        func(ctx context.Context, _ string) error { _, err := s.Lookup(ctx, runID, key); return err },
		"last sequence": func(ctx context.Context, _ string) error { _, err := s.LastSeq(ctx); return err },
		"follow":        func(ctx context.Context, _ string) error { _, _, err := tail.Next(ctx, 10); return err },
		"check":         func(ctx context.Context, _ string) error { return s.Check(ctx) },
		"remove run":    func(ctx context.Context, _ string) error { return rm.RemoveRun(ctx, runID, uint64(last.RunSeq), 3) },
		"load snapshot": func(ctx context.Context, _ string) error { _, err := snaps.LoadSnapshot(ctx, runID); return err },
	}
	cl.Freeze(t) // thawed when the test ends, after its parallel subtests
	// The bound is timeout + statementTimeout.
	storetest.UnansweredCalls(t, calls, statestore.ErrUnavailable, 30*time.Second)
}
