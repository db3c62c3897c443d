package pgstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one versioned schema change, migrations/NNNN_name.sql.
type migration struct {
	version int
	name    string
	sql     string
}

func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("pgstore: migration file %q is not NNNN_name.sql", e.Name())
		}
		b, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: name, sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// migrationLock is the advisory lock key under which migrations run, so
// that several sidecars starting at once apply each one once.
const migrationLock = 0x53494443 // "SIDC"

// migrate applies the migrations the database lacks, each in its own
// transaction, under an advisory lock. A database at a version newer
// than this binary knows is refused (an older sidecar must not write to a
// log whose schema it does not know).
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	all, err := migrations()
	if err != nil {
		return err
	}
	return migrateTo(ctx, pool, all)
}

// migrateTo applies the migrations of all the database lacks (tests pass a
// prefix of the list to make a database of an older version).
func migrateTo(ctx context.Context, pool *pgxpool.Pool, all []migration) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return unavailable("migrate", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLock); err != nil {
		return unavailable("migrate: lock", err)
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrationLock) }()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return unavailable("migrate: schema_migrations", err)
	}
	var have int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&have); err != nil {
		return unavailable("migrate: read version", err)
	}
	if latest := all[len(all)-1].version; have > latest {
		return damaged(fmt.Sprintf("the database's schema is at version %d, newer than this sidecar's %d: run a sidecar of that version or newer", have, latest), nil)
	}
	for _, m := range all {
		if m.version <= have {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name)
			return err
		})
		if err != nil {
			return unavailable(fmt.Sprintf("migrate: apply %04d_%s", m.version, m.name), err)
		}
	}
	return nil
}
