package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conductor-sidecar/sidecar/statestore"
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
//go:embed grants.sql
var grantsSQL string

// MigrateOptions configures Migrate.
type MigrateOptions struct {
	// RuntimeRole is the role sidecar serve connects as. Migrate records
	// it in the database and grants it what serve needs (grants.sql); a
	// later Migrate without it grants the recorded one again. Empty and
	// none recorded: no role is granted anything.
	RuntimeRole string
	// Timeout bounds the whole migration (default 10m: the first chaining
	// of a large log rewrites every record once).
	Timeout time.Duration
}

// Migrated is what Migrate did.
type Migrated struct {
	// From and To are the schema's versions before and after.
	From, To int
	// RuntimeRole is the role granted serve's privileges ("" if none).
	RuntimeRole string
}

// Migrate connects to url as the owner of the log (or the role that is to
// own it, on an empty database), applies the migrations the database
// lacks and grants the runtime role what serve needs. It is sidecar
// migrate. It refuses, with STORE_ROLE_REFUSED, a connection that does
// not own the log and a runtime role that could alter it (a superuser,
// the owner or a member of it).
func Migrate(ctx context.Context, url string, opts MigrateOptions) (Migrated, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return Migrated{}, &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "parse the PostgreSQL URL (postgres://user:password@host:port/database)", Err: err}
	}
	cfg.MaxConns = 1
	pool, err := connect(ctx, cfg)
	if err != nil {
		return Migrated{}, err
	}
	defer pool.Close()
	r, err := readRoles(ctx, pool)
	if err != nil {
		return Migrated{}, err
	}
	if r.logExists && !r.canAlter {
		return Migrated{}, roleRefused(fmt.Sprintf("%s does not own the log (run_events): sidecar migrate connects as its owner", r.user))
	}
	all, err := migrations()
	if err != nil {
		return Migrated{}, err
	}
	out := Migrated{From: r.version, To: all[len(all)-1].version}
	out.RuntimeRole, err = migrateTo(ctx, pool, all, opts.RuntimeRole)
	return out, err
}

// roles is what a connection's role may do with the log.
type roles struct {
	user string
	// logExists: run_events exists; canAlter: the role owns it (or is a
	// member of its owner, or a superuser), so it could alter it.
	logExists, canAlter bool
	// canCreate: the role may create tables in the current schema.
	canCreate bool
	version   int
	// runtime is the recorded runtime role ("" if none).
	runtime string
}

func readRoles(ctx context.Context, pool *pgxpool.Pool) (roles, error) {
	var r roles
	var hasMigrations, hasRuntime bool
	err := pool.QueryRow(ctx, `SELECT current_user::text,
		to_regclass('run_events') IS NOT NULL,
		coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user), false)
			OR coalesce(pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = to_regclass('run_events')), 'USAGE'), false),
		coalesce(has_schema_privilege(current_schema(), 'CREATE'), false),
		to_regclass('schema_migrations') IS NOT NULL,
		to_regclass('runtime_role') IS NOT NULL`).Scan(&r.user, &r.logExists, &r.canAlter, &r.canCreate, &hasMigrations, &hasRuntime)
	if err != nil {
		return r, unavailable("read the connection's role", err)
	}
	if hasMigrations {
		if err := pool.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&r.version); err != nil {
			return r, unavailable("read the schema's version", err)
		}
	}
	if hasRuntime {
		err := pool.QueryRow(ctx, "SELECT role_name::text FROM runtime_role").Scan(&r.runtime)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return r, unavailable("read the runtime role", err)
		}
	}
	return r, nil
}

// migrateTo applies the migrations of all the database lacks (tests pass a
// prefix of the list to make a database of an older version), each in its
// own transaction, under an advisory lock; records runtime when set, and
// grants the recorded runtime role serve's privileges. It returns the
// runtime role granted. A database at a version newer than this binary
// knows is refused (an older sidecar must not write to a log whose schema
// it does not know).
func migrateTo(ctx context.Context, pool *pgxpool.Pool, all []migration, runtime string) (string, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return "", unavailable("migrate", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLock); err != nil {
		return "", unavailable("migrate: lock", err)
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrationLock) }()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return "", unavailable("migrate: schema_migrations", err)
	}
	var have int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&have); err != nil {
		return "", unavailable("migrate: read version", err)
	}
	if latest := all[len(all)-1].version; have > latest {
		return "", damaged(fmt.Sprintf("the database's schema is at version %d, newer than this sidecar's %d: run a sidecar of that version or newer", have, latest), nil)
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
			return "", unavailable(fmt.Sprintf("migrate: apply %04d_%s", m.version, m.name), err)
		}
	}
	var hasRuntime bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('runtime_role') IS NOT NULL").Scan(&hasRuntime); err != nil {
		return "", unavailable("migrate: runtime role", err)
	}
	if !hasRuntime { // an older version (tests)
		return "", nil
	}
	if runtime != "" {
		if err := fitRuntime(ctx, conn.Conn(), runtime); err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx, `INSERT INTO runtime_role (role_name) VALUES ($1)
			ON CONFLICT (only_row) DO UPDATE SET role_name = EXCLUDED.role_name`, runtime); err != nil {
			return "", unavailable("migrate: record the runtime role", err)
		}
	}
	err = conn.QueryRow(ctx, "SELECT role_name::text FROM runtime_role").Scan(&runtime)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", unavailable("migrate: read the runtime role", err)
	}
	grants := strings.ReplaceAll(grantsSQL, `:"runtime"`, pgx.Identifier{runtime}.Sanitize())
	if _, err := conn.Exec(ctx, grants); err != nil {
		return "", unavailable("migrate: grant the runtime role "+runtime, err)
	}
	return runtime, nil
}

// fitRuntime refuses a runtime role that does not exist or could alter the
// log.
func fitRuntime(ctx context.Context, conn *pgx.Conn, runtime string) error {
	var exists, super, owner, self bool
	err := conn.QueryRow(ctx, `SELECT count(*) = 1, coalesce(bool_or(rolsuper), false),
		coalesce(bool_or(pg_has_role(rolname, (SELECT relowner FROM pg_class WHERE oid = to_regclass('run_events')), 'USAGE')), false),
		coalesce(bool_or(rolname = current_user), false)
		FROM pg_roles WHERE rolname = $1`, runtime).Scan(&exists, &super, &owner, &self)
	switch {
	case err != nil:
		return unavailable("migrate: read the runtime role", err)
	case !exists:
		return roleRefused(fmt.Sprintf("--runtime-role %s: no such role: create it first (deploy/postgres/roles.sql)", runtime))
	case super:
		return roleRefused(fmt.Sprintf("--runtime-role %s is a superuser: it could alter the log; give serve a role of its own (deploy/postgres/roles.sql)", runtime))
	case self, owner:
		return roleRefused(fmt.Sprintf("--runtime-role %s owns the log (or is a member of its owner): it could alter it; give serve a role of its own (deploy/postgres/roles.sql)", runtime))
	}
	return nil
}

func roleRefused(msg string) error {
	return &statestore.Error{Code: CodeRoleRefused, Message: msg}
}
