package e2e

import (
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/bench/soak"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
)

// TestE2E_BoundedSoak is the bounded version of the retention soak
// (bench/soak, docs/retention.md): a serve with a 20 s retention window
// next to the real Conductor, 2 runs a second for 150 s. Hot state stays
// bounded by the window, not by the runs submitted: at no sample does the
// log, a per-run bucket or table hold the records or keys of more than
// half the runs submitted (at 2 runs a second, a 20 s window and a pass
// every 10 s about a fifth stay), and once every run is past its window
// none is left. Every run is in the archive, the archive verifies and
// Conductor holds none of their workflows.
func TestE2E_BoundedSoak(t *testing.T) {
	// The two logs soak side by side (each its own serve, data dir and
	// archive): about three minutes each, mostly waiting.
	t.Run("jetstream", func(t *testing.T) { t.Parallel(); boundedSoak(t, false) })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); boundedSoak(t, true) })
}

func boundedSoak(t *testing.T, postgres bool) {
	cfg := soak.Config{
		Sidecar: sidecartest.Binary(t), ConductorURL: conductortest.URL(t), Dir: t.TempDir(),
		Window: 20 * time.Second, Rate: 2, Duration: 150 * time.Second, Sample: 5 * time.Second,
		// A generous safety net: on a loaded machine Conductor may be
		// slow to end the last runs.
		Settle: 10 * time.Minute,
		Log:    testLog{t},
	}
	_, file, _, _ := runtime.Caller(0)
	cfg.Root = filepath.Join(filepath.Dir(file), "..")
	if postgres {
		cfg.Postgres, cfg.PostgresAdminURL = true, pgtest.URL(t)
	}
	res, err := soak.Do(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var sum strings.Builder
	res.Summary(&sum)
	t.Log("\n" + sum.String())

	f := res.Final
	if f.Submitted < 100 || f.SubmitErrors > f.Submitted/10 {
		t.Fatalf("%d runs submitted, %d not: the soak did not run", f.Submitted, f.SubmitErrors)
	}
	if len(res.NotArchived) > 0 || res.VerifyErr != nil {
		t.Fatalf("%d runs not in the archive (e.g. %v); archive verify: %v\n%s", len(res.NotArchived), first(res.NotArchived), res.VerifyErr, res.VerifyOutput)
	}
	if len(res.ConductorLeft) > 0 {
		t.Fatalf("Conductor still holds the workflows of %d of %d runs (e.g. %v)", len(res.ConductorLeft), len(res.Runs), first(res.ConductorLeft))
	}
	// What holds something per run: the log's records, the event ids, the
	// run index, the run list's rows and the snapshots, on NATS; on
	// PostgreSQL the log's tables.
	// The run list by its keys: its bucket keeps a removed run's marker for
	// 15 minutes (docs/jetstream.md).
	perRun := []string{"SIDECAR_EVENTS", "KV_SIDECAR_EVENT_IDS", "KV_SIDECAR_RUNS", "keys_SIDECAR_RUNLIST", "KV_SIDECAR_SNAPSHOTS"}
	if postgres {
		perRun = []string{"pg_run_events", "pg_event_ids", "pg_runs", "pg_run_snapshots", "KV_SIDECAR_RUNS", "keys_SIDECAR_RUNLIST"}
	}
	base := res.Samples[0]
	for _, name := range perRun {
		if _, ok := base.Messages[name]; !ok {
			t.Fatalf("no sample of %s: %v", name, base.Messages)
		}
		// Keys (or rows) per run: what the log holds of a run at most.
		var peak int64
		var at soak.Sample
		for _, sm := range res.Samples {
			if n := sm.Messages[name] - base.Messages[name]; n > peak {
				peak, at = n, sm
			}
		}
		perRunMax := int64(1)
		if name == "SIDECAR_EVENTS" || name == "KV_SIDECAR_EVENT_IDS" || name == "pg_run_events" || name == "pg_event_ids" {
			perRunMax = 4 // RunStarted, StepStarted, StepCompleted, RunCompleted
		}
		if name == "KV_SIDECAR_RUNS" {
			perRunMax = 3 // the run index keeps three keys a run
		}
		if limit := perRunMax * f.Submitted / 2; peak > limit {
			t.Errorf("%s: %d at %s (%d runs submitted by then), more than %d: hot state grows with the runs submitted, not with the window",
				name, peak, at.Elapsed.Truncate(time.Second), at.Submitted, limit)
		}
		// A few keys are not per run (the run index's key of the plan).
		if n := f.Messages[name]; n > base.Messages[name]+3 {
			t.Errorf("%s: %d once every run was past its window (%d before the first run): runs left it behind", name, n, base.Messages[name])
		}
	}
	if f.LogRecords != 0 || f.Removed != f.Submitted {
		t.Errorf("at the end: %d records in the log, %d of %d runs removed", f.LogRecords, f.Removed, f.Submitted)
	}
}

func first(ids []string) []string { return ids[:min(3, len(ids))] }

// testLog writes the soak's progress to the test's log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
