package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestSizeCollector: on PostgreSQL serve exports the log's size as on
// JetStream, read as the runtime role: sidecar_log_records follows the
// records appended and the run retention removed, sidecar_log_bytes is
// the table's with its indexes, and sidecar_log_last_sequence counts
// every record ever appended, the removed ones too.
func TestSizeCollector(t *testing.T) {
	ctx := context.Background()
	r := migratedForRetention(t)
	s := openDurable(t, r.RuntimeURL, prometheus.NewRegistry())
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.SizeCollector())
	for _, id := range []string{"run-a", "run-b"} {
		storetest.AppendSteps(t, s, id, 0, 2) // with RunCompleted, 6 records a run
		if _, err := s.Append(ctx, storetest.Event(id, statestore.RunCompleted, "")); err != nil {
			t.Fatal(err)
		}
	}
	// The statistics' count reaches the metric once the appending
	// sessions flush theirs (within about 10 s of going idle).
	waitRecords := func(want float64) {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for {
			got := gathered(t, reg, "sidecar_log_records")
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("sidecar_log_records %v, want %v", got, want)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitRecords(12)
	if got := gathered(t, reg, "sidecar_log_last_sequence"); got != float64(count(t, r.OwnerURL, "SELECT max(log_seq) FROM run_events")) || got < 12 {
		t.Fatalf("sidecar_log_last_sequence %v", got)
	}
	bytes := gathered(t, reg, "sidecar_log_bytes")
	if want := float64(count(t, r.OwnerURL, "SELECT pg_total_relation_size('run_events')")); bytes != want || bytes == 0 {
		t.Fatalf("sidecar_log_bytes %v, want %v", bytes, want)
	}
	if err := openRemover(t, r.RetentionURL).RemoveRun(ctx, "run-a", 6, 6); err != nil {
		t.Fatal(err)
	}
	waitRecords(6)
	if got := gathered(t, reg, "sidecar_log_last_sequence"); got < 12 {
		t.Fatalf("sidecar_log_last_sequence %v after the removal, want the records ever appended", got)
	}
	// The newest run leaves too: the gauge does not go back.
	if err := openRemover(t, r.RetentionURL).RemoveRun(ctx, "run-b", 6, 6); err != nil {
		t.Fatal(err)
	}
	waitRecords(0)
	if got := gathered(t, reg, "sidecar_log_last_sequence"); got < 12 {
		t.Fatalf("sidecar_log_last_sequence %v once every run was removed, want the records ever appended", got)
	}
}

// gathered is the value of the one gauge named name that reg gathers.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s not gathered", name)
	return 0
}
