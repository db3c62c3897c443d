package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// migratedForRetention is migrated with the retention role granted too.
func migratedForRetention(t *testing.T) pgtest.Roles {
	t.Helper()
	r := migrated(t)
	m, err := pgstore.Migrate(context.Background(), r.OwnerURL, pgstore.MigrateOptions{RetentionRole: r.Retention})
	if err != nil {
		t.Fatal(err)
	}
	if m.RetentionRole != r.Retention || m.RuntimeRole != r.Runtime {
		t.Fatalf("migrate --retention-role: %+v, want runtime %s and retention %s", m, r.Runtime, r.Retention)
	}
	return r
}

func openRemover(t *testing.T, url string) *pgstore.Remover {
	t.Helper()
	rm, err := pgstore.OpenRemover(context.Background(), url, pgstore.RemoverOptions{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rm.Close)
	return rm
}

// count runs q (one number) as the owner.
func count(t *testing.T, url, q string, args ...any) int64 {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int64
	if err := c.QueryRow(ctx, q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// TestRemover_RemoveRun: the retention role removes a finished run's
// records, counter row, saved snapshot and event ids in one go, and
// removing it again is harmless; the other runs stay whole, sidecar verify
// stays clean (no record reported missing), and an append to another run
// still chains. A run whose records are not the archived ones, or that
// has no terminal event, loses nothing.
func TestRemover_RemoveRun(t *testing.T) {
	ctx := context.Background()
	r := migratedForRetention(t)
	s := openDurable(t, r.RuntimeURL, prometheus.NewRegistry())
	for _, id := range []string{"run-a", "run-b", "run-open"} {
		storetest.AppendSteps(t, s, id, 0, 2)
		if id != "run-open" {
			if _, err := s.Append(ctx, storetest.Event(id, statestore.RunCompleted, "")); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.ProjectSnapshot(ctx, id); err != nil { // saves its snapshot
			t.Fatal(err)
		}
		if _, err := s.Pool().Exec(ctx, "INSERT INTO event_ids VALUES ($1, 'k', gen_random_uuid())", id); err != nil {
			t.Fatal(err)
		}
	}
	rm := openRemover(t, r.RetentionURL)

	for _, tc := range []struct {
		name          string
		run           string
		last, records uint64
		want          error
	}{
		{"ErrRunChanged", "run-a", 5, 5, statestore.ErrRunChanged}, // run-a has 6
		{"ErrRunChanged fewer", "run-a", 6, 5, statestore.ErrRunChanged},
		{"ErrRunNotFinished", "run-open", 5, 5, pgstore.ErrRunNotFinished},
		{"invalid", "run-a", 0, 0, statestore.ErrSchemaValidation},
		{"invalid id", "run|a", 6, 6, statestore.ErrSchemaValidation},
	} {
		if err := rm.RemoveRun(ctx, tc.run, tc.last, tc.records); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if n := count(t, r.OwnerURL, "SELECT count(*) FROM run_events"); n != 17 {
		t.Fatalf("after the refused removals the log holds %d records, want 17", n)
	}

	for range 2 { // again: harmless
		if err := rm.RemoveRun(ctx, "run-a", 6, 6); err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range []string{"run_events", "runs", "run_snapshots", "event_ids"} {
		if n := count(t, r.OwnerURL, "SELECT count(*) FROM "+table+" WHERE run_id = 'run-a'"); n != 0 {
			t.Errorf("%s keeps %d rows of the removed run", table, n)
		}
		if n := count(t, r.OwnerURL, "SELECT count(*) FROM "+table+" WHERE run_id = 'run-b'"); n == 0 {
			t.Errorf("%s lost the rows of run-b", table)
		}
	}
	v, err := pgstore.Verify(ctx, r.RuntimeURL, nil)
	if err != nil || len(v.Broken) != 0 || v.Runs != 2 || v.Records != 11 {
		t.Fatalf("verify after the removal: %+v %v, want 2 runs, 11 records, nothing broken", v, err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, storetest.Event("run-open", statestore.RunCompleted, "")); err != nil {
		t.Fatal(err)
	}
	if v, err := pgstore.Verify(ctx, r.RuntimeURL, nil); err != nil || len(v.Broken) != 0 {
		t.Fatalf("verify after one more append: %+v %v", v, err)
	}
}

// TestRemover_OnlyTheRetentionRole: the runtime role that serves the log
// can neither delete a record nor call remove_run, and may not open a
// Remover; the retention role cannot delete a record itself, only through
// remove_run; the owner's own DELETE is refused by the trigger; TRUNCATE
// is refused for everyone. Migrate refuses the runtime role as the
// retention role.
func TestRemover_OnlyTheRetentionRole(t *testing.T) {
	ctx := context.Background()
	r := migratedForRetention(t)
	s := openDurable(t, r.RuntimeURL, prometheus.NewRegistry())
	storetest.AppendSteps(t, s, "run-r", 0, 1)
	if _, err := s.Append(ctx, storetest.Event("run-r", statestore.RunCompleted, "")); err != nil {
		t.Fatal(err)
	}
	for _, as := range []struct{ name, url string }{{"runtime", r.RuntimeURL}, {"retention", r.RetentionURL}, {"owner", r.OwnerURL}} {
		c, err := pgx.Connect(ctx, as.url)
		if err != nil {
			t.Fatal(err)
		}
		qs := []string{"DELETE FROM run_events WHERE run_id = 'run-r'", "TRUNCATE run_events",
			"UPDATE run_events SET body = '{}'", "DELETE FROM runs WHERE run_id = 'run-r'"}
		if as.name == "runtime" {
			qs = append(qs, "SELECT * FROM remove_run('run-r', 4, 4)")
		}
		if as.name == "owner" {
			qs = qs[:3] // the owner owns runs
		}
		for _, q := range qs {
			_, err := c.Exec(ctx, q)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "42501" {
				t.Errorf("as the %s role, %s: %v, want refused (42501)", as.name, q, err)
			}
		}
		c.Close(ctx)
	}
	if _, err := pgstore.OpenRemover(ctx, r.RuntimeURL, pgstore.RemoverOptions{}); !errors.Is(err, pgstore.ErrRoleRefused) {
		t.Errorf("a Remover as the runtime role: %v, want STORE_ROLE_REFUSED", err)
	}
	if n := count(t, r.OwnerURL, "SELECT count(*) FROM run_events WHERE run_id = 'run-r'"); n != 4 {
		t.Fatalf("after the refused deletes run-r has %d records, want 4", n)
	}
	// A retention role that lost remove_run is told so, with the fix
	// (not STORE_DAMAGED: the log is whole), and removes nothing; the
	// owner's migrate grants it again.
	rm := openRemover(t, r.RetentionURL)
	owner, err := pgx.Connect(ctx, r.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, "REVOKE EXECUTE ON FUNCTION remove_run(text, bigint, bigint) FROM "+pgx.Identifier{r.Retention}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	owner.Close(ctx)
	if err := rm.RemoveRun(ctx, "run-r", 4, 4); !errors.Is(err, pgstore.ErrRoleRefused) || !strings.Contains(err.Error(), "sidecar migrate --retention-role") {
		t.Fatalf("remove_run revoked: %v, want STORE_ROLE_REFUSED naming sidecar migrate", err)
	}
	if _, err := pgstore.Migrate(ctx, r.OwnerURL, pgstore.MigrateOptions{RetentionRole: r.Retention}); err != nil {
		t.Fatal(err)
	}
	// A login the server refuses names the flag the URL came from.
	if _, err := pgstore.OpenRemover(ctx, strings.Replace(r.RetentionURL, r.Retention+"@", "no_such_role@", 1), pgstore.RemoverOptions{}); err == nil ||
		!strings.Contains(err.Error(), "refused the login") || !strings.Contains(err.Error(), "--retention-store") {
		t.Fatalf("a Remover as a role that cannot log in: %v, want the login refused, naming --retention-store", err)
	}
	if err := rm.RemoveRun(ctx, "run-r", 4, 4); err != nil {
		t.Fatal(err)
	}
	if n := count(t, r.OwnerURL, "SELECT count(*) FROM run_events WHERE run_id = 'run-r'"); n != 0 {
		t.Fatalf("after remove_run run-r has %d records, want 0", n)
	}
	_, err = pgstore.Migrate(ctx, r.OwnerURL, pgstore.MigrateOptions{RetentionRole: r.Runtime})
	if !errors.Is(err, pgstore.ErrRoleRefused) || !strings.Contains(err.Error(), "runtime role") {
		t.Errorf("migrate --retention-role RUNTIME: %v, want STORE_ROLE_REFUSED", err)
	}
	if _, err := pgstore.Migrate(ctx, r.OwnerURL, pgstore.MigrateOptions{RetentionRole: r.Owner}); !errors.Is(err, pgstore.ErrRoleRefused) {
		t.Errorf("migrate --retention-role OWNER: %v, want STORE_ROLE_REFUSED", err)
	}
}

// TestFollow_PassesRemovedRuns: a follower from the start of a log some
// of whose runs were removed passes their log sequences at once (their
// records are older than the grace), not one grace per removed run.
func TestFollow_PassesRemovedRuns(t *testing.T) {
	ctx := context.Background()
	r := migratedForRetention(t)
	s, err := pgstore.Open(ctx, r.RuntimeURL, pgstore.Options{HoleGrace: 2 * time.Second, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for i := range 6 {
		id := fmt.Sprintf("run-%d", i)
		storetest.AppendSteps(t, s, id, 0, 1)
		if _, err := s.Append(ctx, storetest.Event(id, statestore.RunCompleted, "")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2500 * time.Millisecond) // the records are older than the grace
	rm := openRemover(t, r.RetentionURL)
	for _, id := range []string{"run-0", "run-2", "run-4"} {
		if err := rm.RemoveRun(ctx, id, 4, 4); err != nil {
			t.Fatal(err)
		}
	}
	tl, err := s.Follow(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	began := time.Now()
	got := readAll(t, tl, 12, 10*time.Second)
	if len(got) != 12 {
		t.Fatalf("%d records, want the 12 of the 3 runs left", len(got))
	}
	if took := time.Since(began); took > time.Second {
		t.Fatalf("the follower took %s past the removed runs, want no wait (grace 2s)", took)
	}
	if last, err := s.LastSeq(ctx); err != nil || last != got[11].LogSeq {
		t.Fatalf("LastSeq %d %v, want %d", last, err, got[11].LogSeq)
	}
}

// TestRemover_AppendRacingARemoval: an append to a run whose removal
// holds the run's row (it waits for the removal to commit, then finds the
// row gone) appends the run anew at runSeq 1, as an append after the
// removal would; it does not fail.
func TestRemover_AppendRacingARemoval(t *testing.T) {
	ctx := context.Background()
	r := migratedForRetention(t)
	s := openDurable(t, r.RuntimeURL, prometheus.NewRegistry())
	storetest.AppendSteps(t, s, "run-x", 0, 1)
	// The owner plays remove_run's steps, with a pause after its lock.
	owner, err := pgx.Connect(ctx, r.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	tx, err := owner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM runs WHERE run_id = 'run-x' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var res statestore.AppendResult
	go func() {
		var err error
		res, err = s.Append(ctx, storetest.Event("run-x", statestore.RunCompleted, ""))
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // the append waits for the run's row
	for _, q := range []string{"SELECT set_config('sidecar.removing_run', 'run-x', true)", "DELETE FROM run_events WHERE run_id = 'run-x'", "DELETE FROM runs WHERE run_id = 'run-x'"} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || !res.Persisted || res.RunSeq != 1 {
		t.Fatalf("the append racing the removal: %+v %v, want appended anew at runSeq 1", res, err)
	}
	if v, err := pgstore.Verify(ctx, r.RuntimeURL, nil); err != nil || len(v.Broken) != 0 {
		t.Fatalf("verify: %+v %v", v, err)
	}
}
