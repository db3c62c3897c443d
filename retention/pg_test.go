package retention_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Where the PostgreSQL backend's log is: the database's URLs as the
// runtime role and as the retention role.
const (
	envPGRuntime   = "RETENTION_PG_RUNTIME"
	envPGRetention = "RETENTION_PG_RETENTION"
)

// holeGrace is the PostgreSQL log's pgstore.Options.HoleGrace: a follower
// passes the log sequences of a removed run at once when the records
// after them are older than this (in production, retention removes runs
// whose records are older than the retention period).
const holeGrace = time.Second

// postgres is a PostgreSQL log set up as docs/postgres.md says (owner,
// runtime and retention roles), served as the runtime role; retention
// removes through the retention role.
var postgres = &backend{
	name: "PostgreSQL",
	create: func(t *testing.T) map[string]string {
		roles := pgtest.NewRoles(t)
		if _, err := pgstore.Migrate(context.Background(), roles.OwnerURL, pgstore.MigrateOptions{RuntimeRole: roles.Runtime, RetentionRole: roles.Retention}); err != nil {
			t.Fatal(err)
		}
		return map[string]string{envPGRuntime: roles.RuntimeURL, envPGRetention: roles.RetentionURL, envArchiveDir: archiveDir(t, t.TempDir())}
	},
	open: func(t *testing.T, get func(string) string) *hot {
		runtimeURL, retentionURL := get(envPGRuntime), get(envPGRetention)
		s, err := pgstore.Open(context.Background(), runtimeURL, pgstore.Options{DurableSnapshots: true, HoleGrace: holeGrace, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		closeLog := func() { once.Do(s.Close) }
		t.Cleanup(closeLog)
		return &hot{t: t, store: s, dir: get(envArchiveDir), close: closeLog,
			newRemover: func() retention.Remover {
				rm, err := pgstore.OpenRemover(context.Background(), retentionURL, pgstore.RemoverOptions{Logger: zaptest.NewLogger(t)})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(rm.Close)
				return rm
			},
			verify: func() {
				t.Helper()
				v, err := pgstore.Verify(context.Background(), runtimeURL, nil)
				if err != nil || len(v.Broken) != 0 {
					t.Fatalf("sidecar verify: %+v %v", v, err)
				}
			}}
	},
	grace: holeGrace,
	// A row's xmin is the transaction that wrote it last: every save of
	// the snapshot changes it.
	snapshots: func(ctx context.Context, h *hot) (map[string]string, error) {
		rows, err := h.store.(*pgstore.Store).Pool().Query(ctx, "SELECT run_id, xmin::text FROM run_snapshots")
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		var id, rev string
		_, err = pgx.ForEachRow(rows, []any{&id, &rev}, func() error { out[id] = rev; return nil })
		return out, err
	},
	// A saved snapshot and an event id for each finished run: both leave
	// with the run.
	seed: func(t *testing.T, h *hot) {
		ctx := context.Background()
		s := h.store.(*pgstore.Store)
		pool := s.Pool()
		for id := range h.finished {
			if _, err := s.ProjectSnapshot(ctx, id); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, "INSERT INTO event_ids VALUES ($1, 'k', gen_random_uuid())", id); err != nil {
				t.Fatal(err)
			}
		}
	},
	removed: func(t *testing.T, h *hot) {
		ctx := context.Background()
		pool := h.store.(*pgstore.Store).Pool()
		var left int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM run_snapshots WHERE run_id <> ALL($1))
			+ (SELECT count(*) FROM event_ids WHERE run_id <> ALL($1))`, h.open).Scan(&left); err != nil || left != 0 {
			t.Fatalf("%d snapshot and event id rows of removed runs left (%v)", left, err)
		}
		_, err := pool.Exec(ctx, "DELETE FROM run_events WHERE run_id = $1", h.open[0])
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Fatalf("the runtime role's DELETE: %v, want refused (42501)", err)
		}
	},
}
