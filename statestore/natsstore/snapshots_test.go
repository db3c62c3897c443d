package natsstore_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestProjector_DurableSnapshots: with a snapshot bucket, a restarted
// store projects a run from its persisted snapshot and only the records
// after its watermark (Execution Semantics Contract v1.1 §1: a restart does
// not replay every log), and gets the snapshot a full replay gives.
func TestProjector_DurableSnapshots(t *testing.T) {
	js, _ := natstest.Start(t)
	storetest.DurableSnapshots(t, func(t *testing.T, reg *prometheus.Registry) statestore.Store {
		s, err := natsstore.Open(context.Background(), js, natsstore.Options{SnapshotBucket: natsstore.DefaultSnapshotBucket,
			Metrics: statestore.NewMetrics(reg), Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestProjector_SnapshotTheLogContradicts: a persisted snapshot whose
// record the log does not hold (the event stream was restored from an
// older backup; the snapshot bucket was not) is discarded: the run is
// rebuilt from the log, marked STALE, and the contradiction counted
// (PROJECTOR_SNAPSHOT_MISMATCH). Without the check the run would show the
// steps the log lost.
func TestProjector_SnapshotTheLogContradicts(t *testing.T) {
	js, _ := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Permissions: natsstore.AllPermissions})
	ctx := context.Background()
	open := func(stream string, reg *prometheus.Registry) *natsstore.Store {
		s, err := natsstore.Open(ctx, js, natsstore.Options{Stream: stream, SubjectPrefix: "log." + stream, StateBucket: "STATE_" + stream,
			SnapshotBucket: "SNAPS", Metrics: statestore.NewMetrics(reg), Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	now := open("NOW", prometheus.NewRegistry())
	storetest.AppendSteps(t, now, "run-restored", 0, 40)
	if _, err := now.ProjectSnapshot(ctx, "run-restored"); err != nil {
		t.Fatal(err)
	}
	// The "backup": the same run with its first five steps only, in a
	// stream of its own.
	reg := prometheus.NewRegistry()
	backup := open("BACKUP", reg)
	storetest.AppendSteps(t, backup, "run-restored", 0, 5)
	snap, err := backup.ProjectSnapshot(ctx, "run-restored")
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Steps) != 5 || snap.EventCount != 11 {
		t.Fatalf("snapshot of the restored log: %d steps, %d events; want the log's 5 and 11, not the persisted snapshot's", len(snap.Steps), snap.EventCount)
	}
	if !snap.Stale {
		t.Fatal("a run whose persisted snapshot the log contradicts is not marked stale")
	}
	if n := storetest.Counter(t, reg, "sidecar_projector_durable_snapshots_total", "discarded"); n != 1 {
		t.Fatalf("%v discarded, want 1", n)
	}
}

// TestProjector_SnapshotOfARestoredLogGrownPastIt: the event stream was
// restored from an older backup and has grown past the persisted
// snapshot's watermark: the runSeq is there, holding another event. The
// snapshot is discarded, the run rebuilt from the log, marked STALE.
func TestProjector_SnapshotOfARestoredLogGrownPastIt(t *testing.T) {
	js, _ := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Permissions: natsstore.AllPermissions})
	streams := map[string]string{"current": "NOW", "restored": "RESTORED"}
	storetest.RestoredLogGrownPastTheSnapshot(t, func(t *testing.T, reg *prometheus.Registry, log string) statestore.Store {
		stream := streams[log]
		s, err := natsstore.Open(context.Background(), js, natsstore.Options{Stream: stream, SubjectPrefix: "log." + stream, StateBucket: "STATE_" + stream,
			SnapshotBucket: "SNAPS", Metrics: statestore.NewMetrics(reg), Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}, func(*testing.T, string) {}) // both streams share the bucket SNAPS
}
