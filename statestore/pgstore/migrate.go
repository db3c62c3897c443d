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

//go:embed retention_grants.sql
var retentionGrantsSQL string

// MigrateOptions configures Migrate.
type MigrateOptions struct {
	// RuntimeRole is the role sidecar serve connects as. Migrate records
	// it in the database and grants it what serve needs (grants.sql); a
	// later Migrate without it grants the recorded one again. Empty and
	// none recorded: no role is granted anything.
	RuntimeRole string
	// RetentionRole is the role retention connects as to remove finished
	// runs (serve --retention-store). Migrate records it and grants it
	// EXECUTE on remove_run alone (retention_grants.sql); a later Migrate
	// without it grants the recorded one again. It must be none of the
	// owner, a superuser and the runtime role.
	RetentionRole string
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
	// RetentionRole is the role granted retention's ("" if none).
	RetentionRole string
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
	cfg, err := parseURL(url, "--store")
	if err != nil {
		return Migrated{}, err
	}
	cfg.MaxConns = 1
	pool, err := connect(ctx, cfg, "--store")
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
	out := Migrated{To: all[len(all)-1].version}
	out.From, out.RuntimeRole, out.RetentionRole, err = migrateTo(ctx, pool, all, opts.RuntimeRole, opts.RetentionRole)
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
// own transaction, under an advisory lock; records runtime and retention
// when set, and grants the recorded roles their privileges. It returns the
// version it found under the lock (another migrate may have applied the
// migrations while this one waited for it) and the roles granted. A database at a version newer than this binary knows is
// refused (an older sidecar must not write to a log whose schema it does
// not know).
func migrateTo(ctx context.Context, pool *pgxpool.Pool, all []migration, runtime, retention string) (int, string, string, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, "", "", unavailable("migrate", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLock); err != nil {
		return 0, "", "", unavailable("migrate: lock", err)
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrationLock) }()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return 0, "", "", unavailable("migrate: schema_migrations", err)
	}
	var have int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&have); err != nil {
		return 0, "", "", unavailable("migrate: read version", err)
	}
	if latest := all[len(all)-1].version; have > latest {
		return 0, "", "", schemaNewer(have, latest)
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
			return 0, "", "", unavailable(fmt.Sprintf("migrate: apply %04d_%s", m.version, m.name), err)
		}
	}
	runtime, err = grantRole(ctx, conn.Conn(), "runtime_role", "--runtime-role", runtime, grantsSQL, `:"runtime"`, fitRuntime)
	if err != nil {
		return 0, "", "", err
	}
	retention, err = grantRole(ctx, conn.Conn(), "retention_role", "--retention-role", retention, retentionGrantsSQL, `:"retention"`,
		func(ctx context.Context, conn *pgx.Conn, role string) error {
			return fitRetention(ctx, conn, role, runtime)
		})
	return have, runtime, retention, err
}

// grantRole records role in table (one row) when set, after fit accepts
// it, and grants the recorded role grants (with placeholder replaced by
// it). It returns the role granted: "" when none is recorded, or the table
// does not exist (an older version, in tests).
func grantRole(ctx context.Context, conn *pgx.Conn, table, flag, role, grants, placeholder string,
	fit func(ctx context.Context, conn *pgx.Conn, role string) error) (string, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		return "", unavailable("migrate: "+flag, err)
	}
	if !exists {
		return "", nil
	}
	if role != "" {
		if err := fit(ctx, conn, role); err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx, "INSERT INTO "+table+` (role_name) VALUES ($1)
			ON CONFLICT (only_row) DO UPDATE SET role_name = EXCLUDED.role_name`, role); err != nil {
			return "", unavailable("migrate: record "+flag+" "+role, err)
		}
	}
	err := conn.QueryRow(ctx, "SELECT role_name::text FROM "+table).Scan(&role)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", unavailable("migrate: read "+flag, err)
	}
	if _, err := conn.Exec(ctx, strings.ReplaceAll(grants, placeholder, pgx.Identifier{role}.Sanitize())); err != nil {
		return "", unavailable("migrate: grant "+flag+" "+role, err)
	}
	return role, nil
}

// fitRetention refuses a retention role that does not exist, could alter
// the log, or is (or is a member of, or has as a member) the runtime role:
// the role that serves the log must not be able to remove a run.
func fitRetention(ctx context.Context, conn *pgx.Conn, retention, runtime string) error {
	if err := fitRole(ctx, conn, "--retention-role", retention, "give retention a role of its own"); err != nil {
		return err
	}
	if runtime == "" {
		return nil
	}
	var shared bool
	err := conn.QueryRow(ctx, `SELECT pg_has_role($1, $2, 'USAGE') OR pg_has_role($2, $1, 'USAGE')`, runtime, retention).Scan(&shared)
	switch {
	case err != nil:
		return unavailable("migrate: read the retention role", err)
	case shared:
		return roleRefused(fmt.Sprintf("--retention-role %s is the runtime role %s, or a member of it or it of the other: the role that serves the log must not remove runs; give retention a role of its own (deploy/postgres/roles.sql)", retention, runtime))
	}
	return nil
}

// fitRuntime refuses a runtime role that does not exist or could alter the
// log.
func fitRuntime(ctx context.Context, conn *pgx.Conn, runtime string) error {
	return fitRole(ctx, conn, "--runtime-role", runtime, "give serve a role of its own")
}

// fitRole refuses a role (given as flag) that does not exist or could
// alter the log; fix ends the message.
func fitRole(ctx context.Context, conn *pgx.Conn, flag, role, fix string) error {
	var exists, super, owner, self bool
	err := conn.QueryRow(ctx, `SELECT count(*) = 1, coalesce(bool_or(rolsuper), false),
		coalesce(bool_or(pg_has_role(rolname, (SELECT relowner FROM pg_class WHERE oid = to_regclass('run_events')), 'USAGE')), false),
		coalesce(bool_or(rolname = current_user), false)
		FROM pg_roles WHERE rolname = $1`, role).Scan(&exists, &super, &owner, &self)
	switch {
	case err != nil:
		return unavailable("migrate: read "+flag, err)
	case !exists:
		return roleRefused(fmt.Sprintf("%s %s: no such role: create it first (deploy/postgres/roles.sql)", flag, role))
	case super:
		return roleRefused(fmt.Sprintf("%s %s is a superuser: it could alter the log; %s (deploy/postgres/roles.sql)", flag, role, fix))
	case self, owner:
		return roleRefused(fmt.Sprintf("%s %s owns the log (or is a member of its owner): it could alter it; %s (deploy/postgres/roles.sql)", flag, role, fix))
	}
	return nil
}

func roleRefused(msg string) error {
	return &statestore.Error{Code: CodeRoleRefused, Message: msg}
}

// schemaNewer is the STORE_SCHEMA_NEWER error of a database at version
// have, past this binary's latest.
func schemaNewer(have, latest int) error {
	return &statestore.Error{Code: CodeSchemaNewer, Message: fmt.Sprintf("the database's schema is at version %d, newer than this sidecar's %d: a sidecar of a later version migrated it; run one of that version or newer", have, latest)}
}
