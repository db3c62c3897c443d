package pgstore_test

import (
	"context"
	"encoding/json"
	"fmt"
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

// appendSteps appends RunStarted (when from is 0) and StepStarted,
// StepCompleted of steps from..to-1.
func appendSteps(t *testing.T, s *pgstore.Store, runID string, from, to int) {
	t.Helper()
	ctx := context.Background()
	if from == 0 {
		if _, err := s.Append(ctx, storetest.Event(runID, statestore.RunStarted, "")); err != nil {
			t.Fatal(err)
		}
	}
	for i := from; i < to; i++ {
		for _, typ := range []string{statestore.StepStarted, statestore.StepCompleted} {
			if _, err := s.Append(ctx, storetest.Event(runID, typ, fmt.Sprintf("s%03d", i))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// counter reads a counter of reg by name and, when given, its outcome label.
func counter(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if outcome == "" || (l.GetName() == "outcome" && l.GetValue() == outcome) {
					return m.GetCounter().GetValue()
				}
			}
			if outcome == "" && len(m.GetLabel()) == 0 {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func snapshotJSON(t *testing.T, s *statestore.RunSnapshot) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestProjector_DurableSnapshots: seed 001 §1 on PostgreSQL. A restarted
// store loads the run's snapshot from run_snapshots and reduces only the
// records after its watermark, getting what a full replay gives.
func TestProjector_DurableSnapshots(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	reg1 := prometheus.NewRegistry()
	s1 := openDurable(t, url, reg1)
	appendSteps(t, s1, "run-durable", 0, 50) // 101 records
	if _, err := s1.ProjectSnapshot(ctx, "run-durable"); err != nil {
		t.Fatal(err)
	}
	appendSteps(t, s1, "run-durable", 50, 53) // 6 more, below SaveEvery
	want, err := s1.ProjectSnapshot(ctx, "run-durable")
	if err != nil {
		t.Fatal(err)
	}
	if n := counter(t, reg1, "sidecar_projector_durable_snapshots_total", "saved"); n != 1 {
		t.Fatalf("%v saves, want 1", n)
	}

	reg2 := prometheus.NewRegistry()
	s2 := openDurable(t, url, reg2) // a restart: nothing in memory
	got, err := s2.ProjectSnapshot(ctx, "run-durable")
	if err != nil {
		t.Fatal(err)
	}
	if snapshotJSON(t, got) != snapshotJSON(t, want) {
		t.Fatalf("after the restart:\n%s\nwant (a full replay):\n%s", snapshotJSON(t, got), snapshotJSON(t, want))
	}
	if n := counter(t, reg2, "sidecar_projector_durable_snapshots_total", "loaded"); n != 1 {
		t.Fatalf("%v loads, want 1", n)
	}
	if n := counter(t, reg2, "sidecar_projector_events_applied_total", ""); n != 6 {
		t.Fatalf("the restarted projector reduced %v records, want the 6 after the persisted watermark (not 107)", n)
	}
}

// TestProjector_SnapshotTheLogContradicts: a persisted snapshot taken at
// a record the log does not hold (the log restored from an older dump
// than the snapshots) is discarded, the run rebuilt from the log and
// marked STALE.
func TestProjector_SnapshotTheLogContradicts(t *testing.T) {
	ctx := context.Background()
	now := openDurable(t, pgtest.URL(t), prometheus.NewRegistry())
	appendSteps(t, now, "run-restored", 0, 40)
	if _, err := now.ProjectSnapshot(ctx, "run-restored"); err != nil {
		t.Fatal(err)
	}
	var body string
	if err := now.Pool().QueryRow(ctx, "SELECT body FROM run_snapshots WHERE run_id = 'run-restored'").Scan(&body); err != nil {
		t.Fatal(err)
	}
	// The "restore": a log holding the run's first five steps only, under
	// the newer snapshot.
	url := pgtest.URL(t)
	backup := openDurable(t, url, prometheus.NewRegistry())
	appendSteps(t, backup, "run-restored", 0, 5)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "INSERT INTO run_snapshots (run_id, body) VALUES ('run-restored', $1)", body); err != nil {
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
	if n := counter(t, reg, "sidecar_projector_durable_snapshots_total", "discarded"); n != 1 {
		t.Fatalf("%v discarded, want 1", n)
	}
}
