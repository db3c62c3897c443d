package pgstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func openDurable(t *testing.T, url string, reg *prometheus.Registry) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), url, pgstore.Options{DurableSnapshots: true,
		Metrics: statestore.NewMetrics(reg), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestProjector_DurableSnapshots: Execution Semantics Contract v1.1 §1 on
// PostgreSQL. A restarted store loads the run's snapshot from run_snapshots
// and reduces only the records after its watermark, getting what a full
// replay gives.
func TestProjector_DurableSnapshots(t *testing.T) {
	url := pgtest.URL(t)
	storetest.DurableSnapshots(t, func(t *testing.T, reg *prometheus.Registry) statestore.Store {
		return openDurable(t, url, reg)
	})
}

// TestProjector_SnapshotTheLogContradicts: a persisted snapshot taken at
// a record the log does not hold (the log restored from an older dump
// than the snapshots) is discarded, the run rebuilt from the log and
// marked STALE.
func TestProjector_SnapshotTheLogContradicts(t *testing.T) {
	ctx := context.Background()
	now := openDurable(t, pgtest.URL(t), prometheus.NewRegistry())
	storetest.AppendSteps(t, now, "run-restored", 0, 40)
	if _, err := now.ProjectSnapshot(ctx, "run-restored"); err != nil {
		t.Fatal(err)
	}
	var body string
	var chain []byte
	if err := now.Pool().QueryRow(ctx, "SELECT body, chain_hash FROM run_snapshots WHERE run_id = 'run-restored'").Scan(&body, &chain); err != nil {
		t.Fatal(err)
	}
	// The "restore": a log holding the run's first five steps only, under
	// the newer snapshot.
	url := pgtest.URL(t)
	backup := openDurable(t, url, prometheus.NewRegistry())
	storetest.AppendSteps(t, backup, "run-restored", 0, 5)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "INSERT INTO run_snapshots (run_id, body, chain_hash) VALUES ('run-restored', $1, $2)", body, chain); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	restarted := openDurable(t, url, reg)
	snap, err := restarted.ProjectSnapshot(ctx, "run-restored")
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Steps) != 5 || snap.EventCount != 11 || !snap.Stale {
		t.Fatalf("snapshot of the restored log: %d steps, %d events, stale %v; want the log's 5 and 11, stale", len(snap.Steps), snap.EventCount, snap.Stale)
	}
	if n := storetest.Counter(t, reg, "sidecar_projector_durable_snapshots_total", "discarded"); n != 1 {
		t.Fatalf("%v discarded, want 1", n)
	}
}

// TestSnapshots_ChainAtTheWatermark: a snapshot is saved with the chain
// hash of the record at its watermark, not of the run's latest record
// (records appended while it was projected), so that its check passes;
// the check fails for a watermark the saved hash is not at.
func TestSnapshots_ChainAtTheWatermark(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.URL(t))
	storetest.AppendSteps(t, s, "run-w", 0, 2) // 5 records
	recs, err := s.Fetch(ctx, "run-w", 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := statestore.Reduce(nil, recs)
	d := &statestore.DurableSnapshot{Version: statestore.DurableSnapshotVersion, Snapshot: snap, LastEventID: recs[2].EventID}
	store := pgstore.Snapshots(s)
	if err := store.SaveSnapshot(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := store.CheckSnapshot(ctx, d); err != nil {
		t.Fatalf("check of a snapshot at runSeq 3 of 5: %v", err)
	}
	later := *snap
	later.LastEventSeq = 4
	if err := store.CheckSnapshot(ctx, &statestore.DurableSnapshot{Version: d.Version, Snapshot: &later, LastEventID: d.LastEventID}); !errors.Is(err, pgstore.ErrChainBroken) {
		t.Fatalf("check at runSeq 4 of a hash saved at 3: %v, want LOG_CHAIN_BROKEN", err)
	}
}

// TestProjector_SnapshotOfARestoredLogGrownPastIt: the log was restored
// from an older dump than run_snapshots and has grown past the snapshot's
// watermark: the runSeq is there, holding another event. The snapshot is
// discarded, the run rebuilt from the log, marked STALE.
func TestProjector_SnapshotOfARestoredLogGrownPastIt(t *testing.T) {
	ctx := context.Background()
	urls := map[string]string{"current": pgtest.URL(t), "restored": pgtest.URL(t)}
	storetest.RestoredLogGrownPastTheSnapshot(t, func(t *testing.T, reg *prometheus.Registry, log string) statestore.Store {
		return openDurable(t, urls[log], reg)
	}, func(t *testing.T, runID string) {
		from, err := pgx.Connect(ctx, urls["current"])
		if err != nil {
			t.Fatal(err)
		}
		defer from.Close(ctx)
		var body string
		var chain []byte
		if err := from.QueryRow(ctx, "SELECT body, chain_hash FROM run_snapshots WHERE run_id = $1", runID).Scan(&body, &chain); err != nil {
			t.Fatal(err)
		}
		to, err := pgx.Connect(ctx, urls["restored"])
		if err != nil {
			t.Fatal(err)
		}
		defer to.Close(ctx)
		if _, err := to.Exec(ctx, `INSERT INTO run_snapshots (run_id, body, chain_hash) VALUES ($1, $2, $3)
			ON CONFLICT (run_id) DO UPDATE SET body = EXCLUDED.body, chain_hash = EXCLUDED.chain_hash`, runID, body, chain); err != nil {
			t.Fatal(err)
		}
	})
}
