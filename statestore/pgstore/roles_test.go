package pgstore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// migrated sets a database up as docs/postgres.md says (deploy/postgres/
// roles.sql, then sidecar migrate --runtime-role as the owner) and
// returns its roles.
func migrated(t *testing.T) pgtest.Roles {
	t.Helper()
	r := pgtest.NewRoles(t)
	m, err := pgstore.Migrate(context.Background(), r.OwnerURL, pgstore.MigrateOptions{RuntimeRole: r.Runtime})
	if err != nil {
		t.Fatal(err)
	}
	if m.RuntimeRole != r.Runtime || m.From != 0 || m.To < 4 {
		t.Fatalf("migrate: %+v, want versions 0 to the latest and runtime role %s", m, r.Runtime)
	}
	return r
}

// TestSuite_RuntimeRole: the conformance suite, served as the runtime
// role of the documented setup.
func TestSuite_RuntimeRole(t *testing.T) {
	storetest.RunSuite(t, func(t *testing.T) statestore.Store { return open(t, migrated(t).RuntimeURL) })
}

// TestRoles_RuntimeRole: the runtime role appends, reads and keeps
// snapshots and the tables beside the log, and cannot alter, disable the
// triggers of, update, delete, truncate or insert records (nor forge the
// run's counter); serve as the owner is refused once a runtime role is
// recorded; migrate refuses a runtime role that could alter the log and
// a connection that does not own it.
func TestRoles_RuntimeRole(t *testing.T) {
	ctx := context.Background()
	r := migrated(t)
	s := openDurable(t, r.RuntimeURL, prometheus.NewRegistry())
	storetest.AppendSteps(t, s, "run-r", 0, 2)
	if _, err := s.Append(ctx, storetest.Event("run-r", statestore.RunCompleted, "")); err != nil {
		t.Fatal(err)
	}
	if snap, err := s.ProjectSnapshot(ctx, "run-r"); err != nil || snap.Status != statestore.RunStatusCompleted {
		t.Fatalf("projected as the runtime role: %+v %v", snap, err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("check as the runtime role: %v", err)
	}
	if _, err := s.Pair(ctx, "nats-1", false); err != nil {
		t.Fatalf("pair as the runtime role: %v", err)
	}
	for _, q := range []string{ // what registry and httpapi do, in short
		"INSERT INTO event_ids VALUES ('run-r', 'k', gen_random_uuid())",
		"UPDATE event_ids SET event_id = gen_random_uuid()",
		"INSERT INTO control_replies (key, fingerprint, claimed_at) VALUES ('k', 'f', now())",
		"UPDATE control_replies SET status = 200, body = '{}'",
		"DELETE FROM control_replies",
		"SELECT count(*) FROM run_snapshots",
	} {
		if _, err := s.Pool().Exec(ctx, q); err != nil {
			t.Errorf("as the runtime role, %s: %v", q, err)
		}
	}

	runtime, err := pgx.Connect(ctx, r.RuntimeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.Close(ctx)
	for _, q := range []string{
		"ALTER TABLE run_events DISABLE TRIGGER USER",
		"ALTER TABLE run_events DISABLE TRIGGER run_events_no_update",
		"ALTER TABLE run_events ADD COLUMN x int",
		"DROP TRIGGER run_events_no_update ON run_events",
		"UPDATE run_events SET event_type = 'RunFailed' WHERE event_type = 'RunCompleted'",
		"DELETE FROM run_events WHERE run_seq = 3",
		"TRUNCATE run_events",
		`INSERT INTO run_events (run_id, run_seq, idempotency_key, event_id, event_type, body, log_seq, chain_hash)
			VALUES ('run-forged', 1, 'k', 'e', 'RunStarted', '{}', -1, '\x00')`,
		"UPDATE runs SET last_seq = 0",
		"DELETE FROM run_snapshots WHERE false", // allowed: derived rows
		"CREATE TABLE run_events_copy (x int)",
		"CREATE OR REPLACE FUNCTION run_event_chain(bytea, text, bigint, bigint, timestamptz, text, text, text, text) RETURNS bytea LANGUAGE sql AS 'SELECT $1'",
	} {
		_, err := runtime.Exec(ctx, q)
		var pe *pgconn.PgError
		if allowed := strings.HasPrefix(q, "DELETE FROM run_snapshots"); allowed != (err == nil) ||
			!allowed && (!errors.As(err, &pe) || pe.Code != "42501") {
			t.Errorf("as the runtime role, %s: %v, want refused for want of privilege (42501)", q, err)
		}
	}
	// Privileges, apart from the triggers that refuse the same for anyone.
	var held []string
	if err := runtime.QueryRow(ctx, `SELECT array(SELECT t || ' ' || p FROM unnest(array['run_events', 'runs']) t,
		unnest(array['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER', 'REFERENCES']) p
		WHERE has_table_privilege(current_user, t, p))`).Scan(&held); err != nil || len(held) != 0 {
		t.Errorf("the runtime role holds %v on the log (%v), want none of them", held, err)
	}
	recs, err := s.Fetch(ctx, "run-r", 0, 0)
	if err != nil || len(recs) != 6 || recs[5].EventType != statestore.RunCompleted {
		t.Fatalf("after the refused changes: %d records %v", len(recs), err)
	}

	_, err = pgstore.Open(ctx, r.OwnerURL, pgstore.Options{})
	if !errors.Is(err, pgstore.ErrRoleRefused) || !strings.Contains(err.Error(), r.Runtime) {
		t.Errorf("serve as the owner: %v, want STORE_ROLE_REFUSED naming %s", err, r.Runtime)
	}
	if _, err := pgstore.Migrate(ctx, r.OwnerURL, pgstore.MigrateOptions{RuntimeRole: r.Owner}); !errors.Is(err, pgstore.ErrRoleRefused) {
		t.Errorf("migrate --runtime-role OWNER: %v, want STORE_ROLE_REFUSED", err)
	}
	if _, err := pgstore.Migrate(ctx, r.OwnerURL, pgstore.MigrateOptions{RuntimeRole: "no_such_role"}); !errors.Is(err, pgstore.ErrRoleRefused) {
		t.Errorf("migrate --runtime-role no_such_role: %v, want STORE_ROLE_REFUSED", err)
	}
	if _, err := pgstore.Migrate(ctx, r.RuntimeURL, pgstore.MigrateOptions{}); !errors.Is(err, pgstore.ErrRoleRefused) {
		t.Errorf("migrate as the runtime role: %v, want STORE_ROLE_REFUSED", err)
	}
	if m, err := pgstore.Migrate(ctx, r.OwnerURL, pgstore.MigrateOptions{}); err != nil || m.RuntimeRole != r.Runtime {
		t.Errorf("migrate again without --runtime-role: %+v %v, want the recorded role granted", m, err)
	}
}

// TestRoles_OlderSchemaNeedsMigrate: a runtime role on a database whose
// schema is older than the binary's does not try to migrate it: one line
// naming sidecar migrate (STORE_MIGRATION_NEEDED).
func TestRoles_OlderSchemaNeedsMigrate(t *testing.T) {
	ctx := context.Background()
	r := migrated(t)
	owner, err := pgx.Connect(ctx, r.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	if _, err := owner.Exec(ctx, "DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)"); err != nil {
		t.Fatal(err)
	}
	_, err = pgstore.Open(ctx, r.RuntimeURL, pgstore.Options{})
	if !errors.Is(err, pgstore.ErrMigrationNeeded) || !strings.Contains(err.Error(), "sidecar migrate") {
		t.Fatalf("an older schema as the runtime role: %v, want STORE_MIGRATION_NEEDED naming sidecar migrate", err)
	}
}

// TestRoles_DocsQuoteTheSQL: docs/postgres.md quotes the roles and grants
// the tests run, verbatim.
func TestRoles_DocsQuoteTheSQL(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "postgres.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join("..", "..", "deploy", "postgres", "roles.sql"), "grants.sql", "retention_grants.sql"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), "```sql\n"+string(b)+"```\n") {
			t.Errorf("docs/postgres.md does not quote %s verbatim in a sql block", f)
		}
	}
}

// TestRoles_CheckSeesARevokedPrivilege: /readyz's check fails while the
// runtime role lacks a privilege every append or read needs (an
// administrator's REVOKE), naming what is missing and the fix, and passes
// again once sidecar migrate granted it back.
func TestRoles_CheckSeesARevokedPrivilege(t *testing.T) {
	ctx := context.Background()
	r := migrated(t)
	s := openDurable(t, r.RuntimeURL, prometheus.NewRegistry())
	owner, err := pgx.Connect(ctx, r.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	for _, tc := range []struct{ revoke, want string }{
		{`REVOKE EXECUTE ON FUNCTION append_event(text, text, text, text, text, bigint) FROM "` + r.Runtime + `"`, "EXECUTE on append_event"},
		{`REVOKE SELECT ON run_events FROM "` + r.Runtime + `"`, "SELECT on run_events"},
		{`REVOKE INSERT ON event_ids FROM "` + r.Runtime + `"`, "INSERT on event_ids"},
	} {
		if err := s.Check(ctx); err != nil {
			t.Fatalf("before %s: %v", tc.revoke, err)
		}
		if _, err := owner.Exec(ctx, tc.revoke); err != nil {
			t.Fatal(err)
		}
		if err := s.Check(ctx); !errors.Is(err, statestore.ErrDamaged) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "sidecar migrate") {
			t.Fatalf("after %s: %v, want STORE_DAMAGED naming %q and sidecar migrate", tc.revoke, err, tc.want)
		}
		if _, err := pgstore.Migrate(ctx, r.OwnerURL, pgstore.MigrateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("after migrate granted them back: %v", err)
	}
}

// TestRoles_PairWithoutThePrivilege: a role that may not write the
// pairing table is told what it lacks and to run migrate, and the refusal
// is not the one of a database paired with other NATS state, whose fix
// (another data dir, --accept-new-nats-state) would not help. Before, it
// read as that refusal.
func TestRoles_PairWithoutThePrivilege(t *testing.T) {
	ctx := context.Background()
	r := migrated(t)
	owner, err := pgx.Connect(ctx, r.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	if _, err := owner.Exec(ctx, `REVOKE INSERT, UPDATE ON nats_pairing FROM "`+r.Runtime+`"`); err != nil {
		t.Fatal(err)
	}
	s := openDurable(t, r.RuntimeURL, prometheus.NewRegistry())
	_, err = s.Pair(ctx, "nats-a", false)
	if !errors.Is(err, statestore.ErrDamaged) || errors.Is(err, pgstore.ErrOtherNATSState) ||
		!strings.Contains(err.Error(), "INSERT on nats_pairing") || !strings.Contains(err.Error(), "sidecar migrate") {
		t.Fatalf("pairing without the privilege: %v, want STORE_DAMAGED naming INSERT on nats_pairing and sidecar migrate, not the other-state refusal", err)
	}
	// Another state's refusal is told apart.
	if _, err := pgstore.Migrate(ctx, r.OwnerURL, pgstore.MigrateOptions{RuntimeRole: r.Runtime}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pair(ctx, "nats-a", false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pair(ctx, "nats-b", false); !errors.Is(err, pgstore.ErrOtherNATSState) {
		t.Fatalf("another NATS state: %v, want ErrOtherNATSState", err)
	}
}
