package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// AppendSteps appends RunStarted (when from is 0) and StepStarted,
// StepCompleted of steps from..to-1.
func AppendSteps(tb testing.TB, s statestore.Store, runID string, from, to int) {
	tb.Helper()
	ctx := context.Background()
	if from == 0 {
		if _, err := s.Append(ctx, Event(runID, statestore.RunStarted, "")); err != nil {
			tb.Fatal(err)
		}
	}
	for i := from; i < to; i++ {
		for _, typ := range []string{statestore.StepStarted, statestore.StepCompleted} {
			if _, err := s.Append(ctx, Event(runID, typ, fmt.Sprintf("s%03d", i))); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// Counter reads the counter name of reg, the series with label
// outcome=outcome when outcome is set; 0 when there is none.
func Counter(tb testing.TB, reg *prometheus.Registry, name, outcome string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := outcome == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == "outcome" && l.GetValue() == outcome)
			}
			if match {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// DurableSnapshots checks Execution Semantics Contract v1.1 §1 on a backend:
// a restarted store projects a run from its persisted snapshot, reducing only
// the records after its watermark, and gets the snapshot a full replay gives.
// open returns a new store (a restart: nothing in memory) on the same log,
// with durable snapshots on and its metrics in reg.
func DurableSnapshots(t *testing.T, open func(t *testing.T, reg *prometheus.Registry) statestore.Store) {
	ctx := context.Background()
	reg1 := prometheus.NewRegistry()
	s1 := open(t, reg1)
	AppendSteps(t, s1, "run-durable", 0, 50) // 101 records
	if _, err := s1.ProjectSnapshot(ctx, "run-durable"); err != nil {
		t.Fatal(err)
	}
	AppendSteps(t, s1, "run-durable", 50, 53) // 6 more, not saved yet
	want, err := s1.ProjectSnapshot(ctx, "run-durable")
	if err != nil {
		t.Fatal(err)
	}
	if n := Counter(t, reg1, "sidecar_projector_durable_snapshots_total", "saved"); n != 1 {
		t.Fatalf("%v saves, want 1 (after 101 records; 6 more are below SaveEvery)", n)
	}

	reg2 := prometheus.NewRegistry()
	s2 := open(t, reg2)
	got, err := s2.ProjectSnapshot(ctx, "run-durable")
	if err != nil {
		t.Fatal(err)
	}
	if g, w := snapshotJSON(t, got), snapshotJSON(t, want); g != w {
		t.Fatalf("after the restart:\n%s\nwant (a full replay):\n%s", g, w)
	}
	if n := Counter(t, reg2, "sidecar_projector_durable_snapshots_total", "loaded"); n != 1 {
		t.Fatalf("%v loads, want 1", n)
	}
	if n := Counter(t, reg2, "sidecar_projector_events_applied_total", ""); n != 6 {
		t.Fatalf("the restarted projector reduced %v records, want the 6 after the persisted watermark (not 107)", n)
	}
}

// RestoredLogGrownPastTheSnapshot checks that a persisted snapshot is
// taken at one record, not at a runSeq: the run's log was restored from an
// older backup and has grown past the snapshot's watermark since, so the
// watermark's runSeq is there again, holding another event (another
// eventId). The snapshot is discarded (PROJECTOR_SNAPSHOT_MISMATCH), the
// run rebuilt from the log it now has and marked STALE.
//
// open returns a new store (nothing in memory) with durable snapshots on
// and its metrics in reg, on the log named log: "current" or "restored".
// carry makes the current log's persisted snapshot of runID the one the
// restored log's stores load (a no-op when both logs share one snapshot
// store); it is called after both logs are written.
func RestoredLogGrownPastTheSnapshot(t *testing.T, open func(t *testing.T, reg *prometheus.Registry, log string) statestore.Store, carry func(t *testing.T, runID string)) {
	const runID = "run-restored-grown"
	ctx := context.Background()
	cur := open(t, prometheus.NewRegistry(), "current")
	AppendSteps(t, cur, runID, 0, 40) // 81 records
	saved, err := cur.ProjectSnapshot(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	// The restored log: the backup's first five steps, then other steps
	// (r005...) until it is longer than the snapshot's watermark.
	restored := open(t, prometheus.NewRegistry(), "restored")
	AppendSteps(t, restored, runID, 0, 5) // 11 records
	for i := 5; i < 45; i++ {
		for _, typ := range []string{statestore.StepStarted, statestore.StepCompleted} {
			if _, err := restored.Append(ctx, Event(runID, typ, fmt.Sprintf("r%03d", i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	recs, err := restored.Fetch(ctx, runID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	w := saved.LastEventSeq
	var at *statestore.RunEventRecord
	for i := range recs {
		if recs[i].RunSeq == w {
			at = &recs[i]
		}
	}
	if at == nil {
		t.Fatalf("the restored log has no record at the snapshot's watermark (runSeq %d): the test does not set up what it names", w)
	}
	carry(t, runID)

	reg := prometheus.NewRegistry()
	got, err := open(t, reg, "restored").ProjectSnapshot(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	if n := Counter(t, reg, "sidecar_projector_durable_snapshots_total", "discarded"); n != 1 {
		t.Fatalf("%v snapshots discarded, want 1: the log holds %s (eventId %s) at the snapshot's runSeq %d, not the record it was taken at",
			n, at.EventType, at.EventID, w)
	}
	want, _ := statestore.Reduce(nil, recs)
	if !got.Stale || got.EventCount != want.EventCount || len(got.Steps) != len(want.Steps) || got.LastEventSeq != want.LastEventSeq {
		t.Fatalf("after the restore: stale %v, %d events, %d steps, watermark %d; want stale and the restored log's %d, %d, %d",
			got.Stale, got.EventCount, len(got.Steps), got.LastEventSeq, want.EventCount, len(want.Steps), want.LastEventSeq)
	}
	for _, st := range got.Steps {
		if strings.HasPrefix(st.StepID, "s") && st.StepID >= "s005" {
			t.Fatalf("the run shows step %s, which only the snapshot has", st.StepID)
		}
	}
}

func snapshotJSON(tb testing.TB, s *statestore.RunSnapshot) string {
	tb.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}
