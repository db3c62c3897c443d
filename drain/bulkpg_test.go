package drain_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestBulk_OnPostgresWritesPerBatch: a bulk pause of runs with nothing in
// flight, then a bulk resume, on PostgreSQL with the registry in the same
// database, record every run's RunPaused, RunDrainCompleted and RunResumed
// in a handful of write transactions per batch of runs, not a few per run:
// the transaction ids the database handed out while the bulk calls ran
// (each write transaction takes one) stay below one per ten runs. A bulk
// cancel batches RunCancelRequested; RunCancelled, after Conductor's
// terminate, takes two per run.
func TestBulk_OnPostgresWritesPerBatch(t *testing.T) {
	const runs = 200
	ctx := context.Background()
	url := pgtest.URL(t)
	store, err := pgstore.Open(ctx, url, pgstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	reg, err := registry.OpenPostgres(ctx, store.Pool(), registry.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, runs)
	for i := range ids {
		ids[i] = "bulk-" + strconv.Itoa(i)
		if _, err := store.Append(ctx, storetest.WithPayload(storetest.Event(ids[i], statestore.RunStarted, ""),
			map[string]any{"engineRunRef": statestore.ConductorRunRef("plan", "wf-"+ids[i]), "engineType": "conductor"})); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	xid := func() int64 {
		var v int64
		if err := conn.QueryRow(ctx, "SELECT txid_current()").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	c := drain.New(store, registry.NewEmitter(reg, store), &bulkEngine{}, drain.Options{Logger: zaptest.NewLogger(t)})
	for _, step := range []struct {
		name, want string
		do         func() []drain.Outcome
		most       int64 // write transactions
	}{
		{"pause", "RunStarted RunPaused RunDrainCompleted", func() []drain.Outcome {
			return c.PauseMany(ctx, ids, drain.PauseRequest{Reason: "incident"})
		}, runs / 10},
		{"resume", "RunStarted RunPaused RunDrainCompleted RunResumed", func() []drain.Outcome {
			return c.ResumeMany(ctx, ids, drain.ResumeRequest{Reason: "over"})
		}, runs / 10},
		// RunCancelRequested in batches; each RunCancelled after
		// Conductor's terminate the single way (its registry entry and
		// its append).
		{"cancel", "RunStarted RunPaused RunDrainCompleted RunResumed RunCancelRequested RunCancelled", func() []drain.Outcome {
			return c.CancelMany(ctx, ids, "over", "ops")
		}, 2*runs + runs/10},
	} {
		before := xid()
		for _, o := range step.do() {
			if o.Err != nil {
				t.Fatalf("%s %s: %v", step.name, o.RunID, o.Err)
			}
		}
		used := xid() - before - 1
		for _, id := range ids {
			recs, err := store.Fetch(ctx, id, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			for i, r := range recs {
				if i > 0 {
					got += " "
				}
				got += r.EventType
			}
			if got != step.want {
				t.Fatalf("%s %s: log %s, want %s", step.name, id, got, step.want)
			}
		}
		t.Logf("%s of %d runs: %d write transactions", step.name, runs, used)
		if used > step.most {
			t.Errorf("%s of %d runs took %d write transactions, want at most %d", step.name, runs, used, step.most)
		}
	}
}
