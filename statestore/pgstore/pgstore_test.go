package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t *testing.T, url string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), url, pgstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestSuite: the conformance suite of every backend, unchanged.
func TestSuite(t *testing.T) {
	storetest.RunSuite(t, func(t *testing.T) statestore.Store { return open(t, pgtest.URL(t)) })
}

// TestRecordsImmutable: the database itself refuses to change or remove a
// record, whoever asks (the sidecar's own connection included).
func TestRecordsImmutable(t *testing.T) {
	url := pgtest.URL(t)
	s := open(t, url)
	ctx := context.Background()
	if _, err := s.Append(ctx, storetest.Event("run-i", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		"UPDATE run_events SET event_type = 'RunCompleted'",
		"UPDATE run_events SET persisted_at = now() - interval '1 day'",
		"DELETE FROM run_events",
		"TRUNCATE run_events",
	} {
		if _, err := conn.Exec(ctx, q); err == nil {
			t.Errorf("%s: accepted", q)
		}
	}
	recs, err := s.Fetch(ctx, "run-i", 0, 0)
	if err != nil || len(recs) != 1 || recs[0].EventType != statestore.RunStarted {
		t.Fatalf("after the refused changes: %+v %v", recs, err)
	}
}

// TestMigrations: a second Open applies nothing; a database whose schema
// is newer than the binary's is refused with STORE_SCHEMA_NEWER (a
// rollout's order, not damage) and a fix, by serve, migrate and verify.
func TestMigrations(t *testing.T) {
	url := pgtest.URL(t)
	open(t, url)
	open(t, url) // again: nothing to apply
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES (9999, 'future')"); err != nil {
		t.Fatal(err)
	}
	_, err = pgstore.Open(ctx, url, pgstore.Options{})
	if !errors.Is(err, pgstore.ErrSchemaNewer) || errors.Is(err, statestore.ErrDamaged) || !strings.Contains(err.Error(), "9999") {
		t.Fatalf("serve on a newer schema: %v, want STORE_SCHEMA_NEWER naming version 9999", err)
	}
	if _, err := pgstore.Migrate(ctx, url, pgstore.MigrateOptions{}); !errors.Is(err, pgstore.ErrSchemaNewer) {
		t.Fatalf("migrate on a newer schema: %v, want STORE_SCHEMA_NEWER", err)
	}
	if _, err := pgstore.Verify(ctx, url, nil); !errors.Is(err, pgstore.ErrSchemaNewer) {
		t.Fatalf("verify of a newer schema: %v, want STORE_SCHEMA_NEWER (it cannot vouch for a format it does not know)", err)
	}
}

// TestMigrate_AtOnce: migrations started together on a fresh database
// apply the schema once; one reports it migrated from version 0, the
// others that there was nothing to apply.
func TestMigrate_AtOnce(t *testing.T) {
	url := pgtest.URL(t)
	var wg sync.WaitGroup
	got := make([]pgstore.Migrated, 3)
	errs := make([]error, 3)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = pgstore.Migrate(context.Background(), url, pgstore.MigrateOptions{})
		}()
	}
	wg.Wait()
	fromZero := 0
	for i, m := range got {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if m.From == 0 {
			fromZero++
		} else if m.From != m.To {
			t.Fatalf("migration %d: %+v, want from 0 or nothing to apply", i, m)
		}
	}
	if fromZero != 1 {
		t.Fatalf("%d of 3 migrations say they migrated from version 0: %+v", fromZero, got)
	}
}

// appenderEnv makes the test binary an appender process (see
// TestRunSeqAcrossProcesses).
const appenderEnv = "PGSTORE_TEST_APPENDER"

// TestRunSeqAcrossProcesses: four processes append 50 events each to one
// run at once, each event twice, and the same 50 shared events racing
// one another: runSeq is 1..250, strictly increasing, without a gap, each
// shared event is stored once, and no duplicate consumed a number.
func TestRunSeqAcrossProcesses(t *testing.T) {
	url := pgtest.URL(t)
	open(t, url) // migrated
	const procs, each = 4, 50
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^TestAppenderProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), appenderEnv+"="+url, "PGSTORE_TEST_PROC="+strconv.Itoa(p), "PGSTORE_TEST_EACH="+strconv.Itoa(each))
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("appender %d: %v\n%s", p, err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	recs, err := open(t, url).Fetch(context.Background(), "run-procs", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != procs*each+each {
		t.Fatalf("%d records, want %d", len(recs), procs*each+each)
	}
	for i, r := range recs {
		if r.RunSeq != int64(i+1) {
			t.Fatalf("record %d has runSeq %d, want %d (strictly increasing, no gap)", i, r.RunSeq, i+1)
		}
	}
}

// TestAppenderProcess is one appender of TestRunSeqAcrossProcesses; it
// does nothing unless that test started it.
func TestAppenderProcess(t *testing.T) {
	url := os.Getenv(appenderEnv)
	if url == "" {
		t.Skip("started by TestRunSeqAcrossProcesses only")
	}
	s, err := pgstore.Open(context.Background(), url, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, _ := strconv.Atoi(os.Getenv("PGSTORE_TEST_PROC"))
	each, _ := strconv.Atoi(os.Getenv("PGSTORE_TEST_EACH"))
	for i := range each {
		w := storetest.Event("run-procs", statestore.StepStarted, fmt.Sprintf("p%d-s%03d", p, i))
		first, err := s.Append(context.Background(), w)
		if err != nil {
			t.Fatal(err)
		}
		again, err := s.Append(context.Background(), w)
		if err != nil || !again.Idempotent || again.RunSeq != first.RunSeq {
			t.Fatalf("duplicate: %+v %v, want the first's runSeq %d", again, err, first.RunSeq)
		}
		// The same event from every process: one is stored, the others
		// get it back.
		if _, err := s.Append(context.Background(), storetest.Event("run-procs", statestore.StepStarted, fmt.Sprintf("shared-%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMigrations_OlderSchema: a database a sidecar of schema version 2
// wrote (its append_event, before the registry's tables and the hash
// chain existed) is migrated at Open with its records untouched and
// chained, and the log goes on where it stopped.
func TestMigrations_OlderSchema(t *testing.T) {
	url := pgtest.URL(t)
	ctx := context.Background()
	if err := pgstore.MigrateTo(ctx, url, 2); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var old []*statestore.RunEventWrite
	for _, typ := range []string{statestore.RunStarted, statestore.StepStarted, statestore.StepCompleted} {
		w := storetest.Event("run-old", typ, "s1")
		body, _ := json.Marshal(w)
		if _, err := conn.Exec(ctx, "SELECT * FROM append_event($1, $2, $3, $4, $5, -1)",
			w.RunID, w.IdempotencyKey, w.EventID, w.EventType, string(body)); err != nil {
			t.Fatal(err)
		}
		old = append(old, w)
	}
	if _, err := conn.Exec(ctx, "SELECT 1 FROM event_ids"); err == nil {
		t.Fatal("version 2 already has event_ids: the test does not start from the older schema")
	}

	s := open(t, url) // migrates to the latest version
	if err := s.Check(ctx); err != nil {
		t.Fatalf("check after the migration: %v", err)
	}
	recs, err := s.Fetch(ctx, "run-old", 0, 0)
	if err != nil || len(recs) != len(old) {
		t.Fatalf("fetch after the migration: %d records, %v", len(recs), err)
	}
	for i, r := range recs {
		if r.RunSeq != int64(i+1) || r.EventID != old[i].EventID || r.IdempotencyKey != old[i].IdempotencyKey {
			t.Fatalf("record %d changed by the migration: %+v", i+1, r)
		}
	}
	// A duplicate of an old record is still one; a new event takes runSeq 4.
	if res, err := s.Append(ctx, old[1]); err != nil || !res.Idempotent || res.RunSeq != 2 {
		t.Fatalf("duplicate of an old record: %+v %v", res, err)
	}
	if res, err := s.Append(ctx, storetest.Event("run-old", statestore.RunCompleted, "")); err != nil || res.RunSeq != 4 {
		t.Fatalf("append after the migration: %+v %v", res, err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM event_ids").Scan(&n); err != nil || n != 0 {
		t.Fatalf("event_ids after the migration: %d %v", n, err)
	}
	// The older records were chained by the migration, and the new one
	// chains from them: the chain recomputed in Go verifies, and every
	// record has its hash.
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM run_events WHERE chain_hash IS NULL").Scan(&n); err != nil || n != 0 {
		t.Fatalf("records without a chain hash after the migration: %d %v", n, err)
	}
	if v, err := pgstore.Verify(ctx, url, nil); err != nil || v.Runs != 1 || v.Records != 4 || len(v.Broken) != 0 {
		t.Fatalf("verify after the migration: %+v %v, want 1 run, 4 records, none broken", v, err)
	}
}

// TestCheck: /readyz's check fails closed, with STORE_DAMAGED, when a
// table the sidecar writes was dropped or the schema's version is not the
// one this process migrated to (a restore of an older dump).
func TestCheck(t *testing.T) {
	ctx := context.Background()
	for name, damage := range map[string]string{
		"table dropped": "DROP TABLE control_replies",
		"older version": "DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)",
		"registry gone": "DROP TABLE event_ids",
		// The schema's guards, changed by hand: served as healthy before.
		"immutability trigger disabled": "ALTER TABLE run_events DISABLE TRIGGER run_events_no_update",
		"truncate trigger dropped":      "DROP TRIGGER run_events_no_truncate ON run_events",
		"log order index dropped":       "DROP INDEX run_events_by_log_seq",
		"idempotency key not unique":    "ALTER TABLE run_events DROP CONSTRAINT run_events_run_id_idempotency_key_key",
	} {
		t.Run(name, func(t *testing.T) {
			url := pgtest.URL(t)
			s := open(t, url)
			if err := s.Check(ctx); err != nil {
				t.Fatalf("healthy store: %v", err)
			}
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, damage); err != nil {
				t.Fatal(err)
			}
			if err := s.Check(ctx); !errors.Is(err, statestore.ErrDamaged) {
				t.Fatalf("after %q: %v, want STORE_DAMAGED", damage, err)
			}
		})
	}
}

// TestPair: the first NATS state pairs; the same one passes; another is
// refused with STORE_DAMAGED naming both, unless accepted, which re-pairs.
// Sidecars pairing at once on a fresh database agree on one.
func TestPair(t *testing.T) {
	ctx := context.Background()
	s := open(t, pgtest.URL(t))
	if prev, err := s.Pair(ctx, "nats-a", false); err != nil || prev != "" {
		t.Fatalf("first pairing: %q %v", prev, err)
	}
	if _, err := s.Pair(ctx, "nats-a", false); err != nil {
		t.Fatalf("same state: %v", err)
	}
	_, err := s.Pair(ctx, "nats-b", false)
	if !errors.Is(err, statestore.ErrDamaged) || !strings.Contains(err.Error(), "nats-a") || !strings.Contains(err.Error(), "nats-b") {
		t.Fatalf("other state: %v, want STORE_DAMAGED naming both", err)
	}
	if prev, err := s.Pair(ctx, "nats-b", true); err != nil || prev != "nats-a" {
		t.Fatalf("accepted: %q %v", prev, err)
	}
	if _, err := s.Pair(ctx, "nats-a", false); !errors.Is(err, statestore.ErrDamaged) {
		t.Fatalf("the old state after re-pairing: %v", err)
	}

	fresh := open(t, pgtest.URL(t))
	var wg sync.WaitGroup
	errs := make([]error, 64)
	for i := range errs {
		wg.Go(func() { _, errs[i] = fresh.Pair(ctx, "nats-shared", false) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("sidecar %d pairing at once: %v", i, err)
		}
	}
}

// TestCheck_ALockThatBlocksAppends: while another session holds (or
// waits for) a lock on the log's tables that an append would wait for
// (LOCK TABLE, ALTER TABLE, VACUUM FULL, REINDEX), the store cannot append
// now, and Check says so: STORE_UNAVAILABLE naming the table, the lock and
// the session. Before, /readyz answered ready through a 50 s table lock
// while every append and read timed out.
func TestCheck_ALockThatBlocksAppends(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	s := open(t, url)
	for _, lock := range []string{
		"LOCK TABLE run_events IN ACCESS EXCLUSIVE MODE",
		"LOCK TABLE run_events IN SHARE MODE", // reads pass, appends wait (as under a REINDEX)
		"LOCK TABLE event_ids IN EXCLUSIVE MODE",
	} {
		t.Run(lock, func(t *testing.T) {
			if err := s.Check(ctx); err != nil {
				t.Fatalf("before the lock: %v", err)
			}
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, lock); err != nil {
				t.Fatal(err)
			}
			err = s.Check(ctx)
			if !errors.Is(err, statestore.ErrUnavailable) || !strings.Contains(err.Error(), "lock") {
				t.Fatalf("while %q is held: %v, want STORE_UNAVAILABLE naming the lock", lock, err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.Check(ctx); err != nil {
				t.Fatalf("after the lock: %v", err)
			}
		})
	}
}
