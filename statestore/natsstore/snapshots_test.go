package natsstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// appendSteps appends RunStarted (when from is 0) and StepStarted,
// StepCompleted of steps from..to-1.
func appendSteps(t *testing.T, s *natsstore.Store, runID string, from, to int) {
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

func snapshotJSON(t *testing.T, s *statestore.RunSnapshot) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestProjector_DurableSnapshots: with a snapshot bucket, a restarted
// store projects a run from its persisted snapshot and only the records
// after its watermark (seed 001 §1: a restart does not replay every log),
// and gets the snapshot a full replay gives.
func TestProjector_DurableSnapshots(t *testing.T) {
	js, _ := natstest.Start(t)
	ctx := context.Background()
	open := func(reg *prometheus.Registry) *natsstore.Store {
		s, err := natsstore.Open(ctx, js, natsstore.Options{SnapshotBucket: natsstore.DefaultSnapshotBucket,
			Metrics: statestore.NewMetrics(reg), Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	reg1 := prometheus.NewRegistry()
	s1 := open(reg1)
	appendSteps(t, s1, "run-durable", 0, 50) // 101 records
	if _, err := s1.ProjectSnapshot(ctx, "run-durable"); err != nil {
		t.Fatal(err)
	}
	appendSteps(t, s1, "run-durable", 50, 53) // 6 more, not saved yet
	want, err := s1.ProjectSnapshot(ctx, "run-durable")
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(metricVec(t, reg1, "sidecar_projector_durable_snapshots_total", "saved")); n != 1 {
		t.Fatalf("%v saves, want 1 (after 101 records; 6 more are below SaveEvery)", n)
	}

	reg2 := prometheus.NewRegistry()
	s2 := open(reg2) // a restart: a new projector, nothing in memory
	got, err := s2.ProjectSnapshot(ctx, "run-durable")
	if err != nil {
		t.Fatal(err)
	}
	if snapshotJSON(t, got) != snapshotJSON(t, want) {
		t.Fatalf("after the restart:\n%s\nwant (a full replay):\n%s", snapshotJSON(t, got), snapshotJSON(t, want))
	}
	if n := testutil.ToFloat64(metricVec(t, reg2, "sidecar_projector_durable_snapshots_total", "loaded")); n != 1 {
		t.Fatalf("%v loads, want 1", n)
	}
	if n := testutil.ToFloat64(metricVec(t, reg2, "sidecar_projector_events_applied_total", "")); n != 6 {
		t.Fatalf("the restarted projector reduced %v records, want the 6 after the persisted watermark (not 107)", n)
	}
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
	appendSteps(t, now, "run-restored", 0, 40)
	if _, err := now.ProjectSnapshot(ctx, "run-restored"); err != nil {
		t.Fatal(err)
	}
	// The "backup": the same run with its first five steps only, in a
	// stream of its own.
	reg := prometheus.NewRegistry()
	backup := open("BACKUP", reg)
	appendSteps(t, backup, "run-restored", 0, 5)
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
	if n := testutil.ToFloat64(metricVec(t, reg, "sidecar_projector_durable_snapshots_total", "discarded")); n != 1 {
		t.Fatalf("%v discarded, want 1", n)
	}
}

// metricVec returns the collector of name (with label outcome, when
// given) from reg.
func metricVec(t *testing.T, reg *prometheus.Registry, name, outcome string) prometheus.Collector {
	t.Helper()
	return gatheredValue{t: t, reg: reg, name: name, outcome: outcome}
}

type gatheredValue struct {
	t             *testing.T
	reg           *prometheus.Registry
	name, outcome string
}

func (g gatheredValue) Describe(chan<- *prometheus.Desc) {}

func (g gatheredValue) Collect(ch chan<- prometheus.Metric) {
	mfs, err := g.reg.Gather()
	if err != nil {
		g.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != g.name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := g.outcome == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == "outcome" && l.GetValue() == g.outcome)
			}
			if match {
				ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "", nil, nil), prometheus.CounterValue, m.GetCounter().GetValue())
				return
			}
		}
	}
}
