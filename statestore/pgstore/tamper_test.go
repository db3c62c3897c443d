package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// tamper is what the review did as the (non-superuser) owner of the log:
// the triggers disabled, run-a's RunCompleted rewritten to RunFailed and
// run-b's first StepCompleted deleted.
var tamper = []string{
	"ALTER TABLE run_events DISABLE TRIGGER USER",
	`UPDATE run_events SET event_type = 'RunFailed', body = replace(body, '"eventType":"RunCompleted"', '"eventType":"RunFailed"')
		WHERE run_id = 'run-a' AND event_type = 'RunCompleted'`,
	"DELETE FROM run_events WHERE run_id = 'run-b' AND run_seq = 3",
	"ALTER TABLE run_events ENABLE TRIGGER USER",
}

// TestTamper_OwnerRewritesTheLog: the owner rewrites the log under a
// store served as the runtime role. sidecar verify's check reports both
// runs (the rewritten record, the missing one), and a restarted store
// does not serve the snapshots saved before: both runs are rebuilt from
// the log and marked STALE.
func TestTamper_OwnerRewritesTheLog(t *testing.T) {
	ctx := context.Background()
	r := migrated(t)
	serveURL := r.RuntimeURL
	before := openDurable(t, serveURL, prometheus.NewRegistry())
	for _, run := range []string{"run-a", "run-b"} {
		storetest.AppendSteps(t, before, run, 0, 2)
		if _, err := before.Append(ctx, storetest.Event(run, statestore.RunCompleted, "")); err != nil {
			t.Fatal(err)
		}
		if snap, err := before.ProjectSnapshot(ctx, run); err != nil || snap.Status != statestore.RunStatusCompleted {
			t.Fatalf("%s before: %+v %v", run, snap, err)
		}
	}
	before.Close()
	if v, err := pgstore.Verify(ctx, r.RuntimeURL, nil); err != nil || v.Runs != 2 || v.Records != 12 || len(v.Broken) != 0 {
		t.Fatalf("verify before: %+v %v, want 2 runs, 12 records, none broken", v, err)
	}

	owner, err := pgx.Connect(ctx, r.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	for _, q := range tamper {
		if _, err := owner.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	v, err := pgstore.Verify(ctx, r.RuntimeURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []pgstore.Broken{{RunID: "run-a", Code: pgstore.CodeChainBroken, RunSeq: 6}, {RunID: "run-b", Code: pgstore.CodeRecordMissing, RunSeq: 3}}
	if len(v.Broken) != len(want) {
		t.Fatalf("verify after: %+v, want %+v", v.Broken, want)
	}
	for i, b := range v.Broken {
		if b.RunID != want[i].RunID || b.Code != want[i].Code || b.RunSeq != want[i].RunSeq || b.Message == "" {
			t.Errorf("verify after: %+v, want %+v with a message", b, want[i])
		}
	}
	if v, err := pgstore.Verify(ctx, r.RuntimeURL, []string{"run-b", "run-c"}); err != nil || len(v.Broken) != 2 ||
		v.Broken[0].RunID != "run-b" || v.Broken[1].Code != pgstore.CodeRunNotFound {
		t.Errorf("verify run-b run-c: %+v %v, want run-b missing a record, run-c not found", v, err)
	}

	reg := prometheus.NewRegistry()
	restarted := openDurable(t, serveURL, reg)
	a, err := restarted.ProjectSnapshot(ctx, "run-a")
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != statestore.RunStatusFailed || !a.Stale {
		t.Errorf("run-a after the rewrite: status %s, stale %v; want the log's FAILED, stale", a.Status, a.Stale)
	}
	b, err := restarted.ProjectSnapshot(ctx, "run-b")
	if err != nil {
		t.Fatal(err)
	}
	if !b.Stale {
		t.Errorf("run-b after the deletion: status %s, stale %v; want stale", b.Status, b.Stale)
	}
	if n := storetest.Counter(t, reg, "sidecar_projector_durable_snapshots_total", "discarded"); n != 2 {
		t.Errorf("%v snapshots discarded, want 2", n)
	}
}

// TestTamper_OwnerRecomputesTheChain: an owner who rewrites a record and
// recomputes its chain hash with the database's own function passes
// sidecar verify (the limit docs/postgres.md names: every check reads the
// same database), but a restarted store still discards the run's saved
// snapshot, whose chain hash at the watermark is not the new one.
func TestTamper_OwnerRecomputesTheChain(t *testing.T) {
	ctx := context.Background()
	r := migrated(t)
	before := openDurable(t, r.RuntimeURL, prometheus.NewRegistry())
	storetest.AppendSteps(t, before, "run-a", 0, 2)
	if _, err := before.Append(ctx, storetest.Event("run-a", statestore.RunCompleted, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := before.ProjectSnapshot(ctx, "run-a"); err != nil {
		t.Fatal(err)
	}
	before.Close()
	owner, err := pgx.Connect(ctx, r.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	for _, q := range append(tamper[:2:2],
		`UPDATE run_events e SET chain_hash = run_event_chain(p.chain_hash, e.run_id, e.run_seq, e.log_seq, e.persisted_at,
			e.idempotency_key, e.event_id, e.event_type, e.body)
			FROM run_events p WHERE e.run_id = 'run-a' AND e.run_seq = 6 AND p.run_id = 'run-a' AND p.run_seq = 5`,
		"ALTER TABLE run_events ENABLE TRIGGER USER") {
		if _, err := owner.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if v, err := pgstore.Verify(ctx, r.RuntimeURL, nil); err != nil || len(v.Broken) != 0 {
		t.Fatalf("verify after a recomputed chain: %+v %v; want it to pass (the documented limit)", v, err)
	}
	reg := prometheus.NewRegistry()
	a, err := openDurable(t, r.RuntimeURL, reg).ProjectSnapshot(ctx, "run-a")
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != statestore.RunStatusFailed || !a.Stale {
		t.Errorf("run-a after the rewrite with its chain recomputed: status %s, stale %v; want the log's FAILED, stale", a.Status, a.Stale)
	}
	if n := storetest.Counter(t, reg, "sidecar_projector_durable_snapshots_total", "discarded"); n != 1 {
		t.Errorf("%v snapshots discarded, want 1", n)
	}
}

// TestTamper_LastRecordDeleted: a run whose last record the owner deleted
// takes no append (the chain has nothing to go on from): STORE_DAMAGED,
// nothing written, and verify names the missing runSeq.
func TestTamper_LastRecordDeleted(t *testing.T) {
	ctx := context.Background()
	r := migrated(t)
	s := open(t, r.RuntimeURL)
	storetest.AppendSteps(t, s, "run-a", 0, 1)
	owner, err := pgx.Connect(ctx, r.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	for _, q := range []string{tamper[0], "DELETE FROM run_events WHERE run_id = 'run-a' AND run_seq = 3", tamper[3]} {
		if _, err := owner.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	_, err = s.Append(ctx, storetest.Event("run-a", statestore.RunCompleted, ""))
	if !errors.Is(err, statestore.ErrDamaged) || !strings.Contains(err.Error(), "sidecar verify") {
		t.Fatalf("append after the last record was deleted: %v, want STORE_DAMAGED naming sidecar verify", err)
	}
	if recs, err := s.Fetch(ctx, "run-a", 0, 0); err != nil || len(recs) != 2 {
		t.Fatalf("after the refused append: %d records %v, want the 2 left", len(recs), err)
	}
	v, err := pgstore.Verify(ctx, r.RuntimeURL, []string{"run-a"})
	if err != nil || len(v.Broken) != 1 || v.Broken[0].Code != pgstore.CodeRecordMissing || v.Broken[0].RunSeq != 3 {
		t.Fatalf("verify: %+v %v, want run-a missing runSeq 3", v, err)
	}
}
