// Package pgstore is the append authority of the run event log on
// PostgreSQL (the IRunStateStore Contract v2.0.0): the table run_events with
// a unique (run_id, idempotency_key), runSeq assigned in the write from the
// run's counter row (1, 2, 3, ... per run, without gaps: a duplicate rolls
// its increment back), persistedAt from the database's clock, records
// that triggers make immutable and a hash chain over each run's records
// (Verify). Migrate applies the schema's migrations as the owner of the
// log (schema_migrations, one transaction each, under an advisory lock)
// and grants the runtime role that Open then connects as; Open migrates
// by itself only as the owner with no runtime role recorded. It passes
// the conformance suite of package storetest, as the JetStream and memory
// stores do.
package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Options configures Open.
type Options struct {
	// Timeout bounds each call that has no deadline of its own (default
	// 5s); a call with one waits at most StatementTimeout + Timeout
	// (MaxWait).
	Timeout time.Duration
	// MaxConns bounds the pool (default: the URL's pool_max_conns, else
	// DefaultMaxConns).
	MaxConns int32
	// StatementTimeout is the server's statement_timeout of the store's
	// connections (default 10s): no append runs longer.
	StatementTimeout time.Duration
	// HoleGrace is how long a follower waits for a missing log sequence
	// before it passes it (default StatementTimeout + 5s).
	HoleGrace time.Duration
	// DurableSnapshots keeps run snapshots across restarts in the table
	// run_snapshots (statestore.ProjectorOptions.Durable; serve sets it).
	DurableSnapshots bool
	Logger           *zap.Logger
	Metrics          *statestore.Metrics
	Alerts           statestore.AlertSink
	Gate             statestore.AlertGate
}

// The defaults of Options.Timeout and Options.StatementTimeout.
const (
	DefaultTimeout          = 5 * time.Second
	DefaultStatementTimeout = 10 * time.Second
)

// DefaultMaxConns is the pool's size unless Options.MaxConns or the URL's
// pool_max_conns sets it: the producers of one sidecar (up to ~50 steps
// at once by default) went through 16 connections 20 – 40% faster than
// through pgxpool's default of 4 on two cores (BENCHMARKS.md).
const DefaultMaxConns = 16

// Store is the PostgreSQL append authority. It is safe for concurrent use.
type Store struct {
	pool      *pgxpool.Pool
	timeout   time.Duration
	maxWait   time.Duration // StatementTimeout + timeout: CallContext
	holeGrace time.Duration
	log       *zap.Logger
	metrics   *statestore.Metrics
	proj      *statestore.Projector
}

var (
	_ statestore.Store     = (*Store)(nil)
	_ statestore.KeyLookup = (*Store)(nil)
)

// Open connects to url (postgres://user@host:port/db?...), checks the
// connection's role and the schema (admit) and returns the store.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.StatementTimeout <= 0 {
		opts.StatementTimeout = DefaultStatementTimeout
	}
	if opts.HoleGrace <= 0 {
		opts.HoleGrace = opts.StatementTimeout + 5*time.Second
	}
	cfg, err := parseURL(url, "--store")
	if err != nil {
		return nil, err
	}
	switch {
	case opts.MaxConns > 0:
		cfg.MaxConns = opts.MaxConns
	case !strings.Contains(url, "pool_max_conns="):
		cfg.MaxConns = DefaultMaxConns
	}
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(opts.StatementTimeout.Milliseconds(), 10)
	octx, cancel := context.WithTimeout(ctx, 4*opts.Timeout)
	defer cancel()
	pool, err := connect(octx, cfg, "--store")
	if err != nil {
		return nil, err
	}
	if err := admit(octx, pool, opts.Logger); err != nil {
		pool.Close()
		return nil, err
	}
	s := &Store{pool: pool, timeout: opts.Timeout, maxWait: opts.StatementTimeout + opts.Timeout, holeGrace: opts.HoleGrace, log: opts.Logger.Named("pgstore"), metrics: opts.Metrics}
	popts := statestore.ProjectorOptions{
		Logger: opts.Logger, Metrics: opts.Metrics, Alerts: opts.Alerts, Gate: opts.Gate,
		Contiguous: true, // runSeq is 1, 2, 3, ... per run: a hole is a visibility gap
	}
	if opts.DurableSnapshots {
		popts.Durable = snapshots{s}
	}
	s.proj = statestore.NewProjector(s, popts)
	return s, nil
}

// connect opens a pool on cfg and pings the server: a server that does
// not answer, or refuses the login, gives one line naming the fix and the
// flag the URL came from.
func connect(ctx context.Context, cfg *pgxpool.Config, flag string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, unavailable("connect", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		c := cfg.ConnConfig
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "28P01" || pe.Code == "28000") { // invalid_password, invalid_authorization_specification
			return nil, &statestore.Error{Code: statestore.CodeStoreUnavailable, Err: err, Message: fmt.Sprintf(
				"PostgreSQL at %s:%d refused the login of user %s to database %s: %s: check the user of %s and its password (PGPASSFILE or PGPASSWORD), and pg_hba.conf",
				c.Host, c.Port, c.User, c.Database, pe.Message, flag)}
		}
		return nil, &statestore.Error{Code: statestore.CodeStoreUnavailable, Err: err, Message: fmt.Sprintf(
			"cannot reach PostgreSQL at %s:%d (database %s, user %s): %v: check %s and that the server is up; the password comes from PGPASSFILE or PGPASSWORD",
			c.Host, c.Port, c.Database, c.User, innermost(err), flag)}
	}
	return pool, nil
}

// admit checks that the connection's role may serve the log and migrates
// the schema when it is older than the binary's and the role may:
//   - a database with a runtime role (sidecar migrate --runtime-role) is
//     served by a role that cannot alter the log: the owner, a member of
//     it and a superuser are refused (STORE_ROLE_REFUSED);
//   - an older schema is migrated by the owner (or, on an empty database,
//     by a role that may create tables: the local default); any other role
//     gets STORE_MIGRATION_NEEDED, naming sidecar migrate;
//   - serving as a role that can alter the log logs a warning.
func admit(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger) error {
	r, err := readRoles(ctx, pool)
	if err != nil {
		return err
	}
	all, err := migrations()
	if err != nil {
		return err
	}
	latest := all[len(all)-1].version
	canAlter := r.canAlter
	switch {
	case r.version > latest:
		return schemaNewer(r.version, latest)
	case r.runtime != "" && r.canAlter:
		return roleRefused(fmt.Sprintf("connected as %s, which can alter the log (it owns run_events, is a member of its owner or a superuser): serve connects as the runtime role %s; only sidecar migrate connects as the owner (docs/postgres.md, \"Roles\")", r.user, r.runtime))
	case r.version < latest && (r.canAlter || !r.logExists && r.canCreate):
		if _, _, _, err := migrateTo(ctx, pool, all, "", ""); err != nil {
			return err
		}
		canAlter = true
	case r.version < latest:
		return &statestore.Error{Code: CodeMigrationNeeded, Message: fmt.Sprintf("the database's schema is at version %d, this sidecar's is %d, and %s may not migrate it: run sidecar migrate --store postgres://OWNER@host:port/database with this sidecar's binary (docs/postgres.md, \"Roles\")", r.version, latest, r.user)}
	}
	if canAlter {
		log.Named("pgstore").Warn("serving the log as a role that can alter it (its owner or a superuser could disable its triggers and rewrite records): give serve a runtime role of its own (deploy/postgres/roles.sql, sidecar migrate --runtime-role; docs/postgres.md, \"Roles\")",
			zap.String("role", r.user))
	}
	return nil
}

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// Pool is the store's connection pool, for what keeps its state in the
// same database (the EventIdRegistry, the control API's replies: tables of
// this package's migrations). Closed by Close.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// appendTables are the tables an append writes (the log and the
// EventIdRegistry): a lock on one that conflicts with a write holds every
// append (Check).
var appendTables = []string{"run_events", "event_ids"}

// Check reports whether the store can append now: the database answers,
// its schema is the one this binary migrated to, and the tables the
// sidecar writes exist (an administrator's DROP or a restore of an older
// dump fails it with STORE_DAMAGED), and no other session holds or waits
// for a lock on them that an append would wait for (STORE_UNAVAILABLE).
// serve's /readyz calls it.
func (s *Store) Check(ctx context.Context) error {
	ctx, cancel := s.callContext(ctx)
	defer cancel()
	all, err := migrations()
	if err != nil {
		return err
	}
	var version int
	var missing, lacking, blocking, unguarded []string
	g := runtimeGrants()
	err = s.pool.QueryRow(ctx, `SELECT coalesce((SELECT max(version) FROM schema_migrations), 0),
		array(SELECT t FROM unnest($1::text[]) t WHERE to_regclass(t) IS NULL),
		array(SELECT g.priv || ' on ' || g.obj FROM unnest($2::text[], $3::text[]) AS g(obj, priv)
			WHERE NOT coalesce(has_table_privilege(to_regclass(g.obj), g.priv), true))
		|| array(SELECT 'EXECUTE on ' || split_part(f, '(', 1) FROM unnest($4::text[]) f
			WHERE NOT coalesce(has_function_privilege(to_regprocedure(f), 'EXECUTE'), true)),
		array(SELECT l.mode || ' on ' || l.relation::regclass::text || ' (pid ' || l.pid ||
			CASE WHEN l.granted THEN ', held)' ELSE ', waiting)' END
			FROM pg_locks l WHERE l.locktype = 'relation' AND l.pid <> pg_backend_pid()
			AND l.relation IN (SELECT to_regclass(t) FROM unnest($5::text[]) t)
			AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')),
		array(SELECT g.what FROM (VALUES
			('the trigger run_events_no_update (records immutable)', NOT EXISTS (SELECT 1 FROM pg_trigger
				WHERE tgrelid = to_regclass('run_events') AND tgname = 'run_events_no_update' AND tgenabled IN ('O', 'A'))),
			('the trigger run_events_no_truncate', NOT EXISTS (SELECT 1 FROM pg_trigger
				WHERE tgrelid = to_regclass('run_events') AND tgname = 'run_events_no_truncate' AND tgenabled IN ('O', 'A'))),
			('the unique index run_events_by_log_seq (the log'||chr(39)||'s order)', to_regclass('run_events_by_log_seq') IS NULL),
			('the unique constraint run_events_run_id_idempotency_key_key (no duplicate record)',
				to_regclass('run_events_run_id_idempotency_key_key') IS NULL)
		) AS g(what, gone) WHERE g.gone AND to_regclass('run_events') IS NOT NULL)`,
		tables, g.objs, g.privs, g.funcs, appendTables).Scan(&version, &missing, &lacking, &blocking, &unguarded)
	switch {
	case err != nil:
		return unavailable("check", err)
	case len(blocking) > 0:
		// Appends queue behind these (a lock waiting counts: later
		// requests queue behind it): the store cannot append now.
		return &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: fmt.Sprintf(
			"check: another session holds or waits for a lock an append waits for: %s; end it unless it is maintenance you expect (pg_stat_activity names the session; SELECT pg_terminate_backend(pid))",
			strings.Join(blocking, ", "))}
	case len(missing) > 0:
		return damaged(fmt.Sprintf("tables %v are missing: restore the database from a backup (the sidecar never drops a table)", missing), nil)
	case version != all[len(all)-1].version:
		return damaged(fmt.Sprintf("the schema is at version %d, this sidecar migrated it to %d: was the database restored from an older dump? restart the sidecar to migrate it", version, all[len(all)-1].version), nil)
	case len(unguarded) > 0:
		return damaged(fmt.Sprintf("the schema was changed by hand: %s missing or disabled: restore it as the migrations define it (statestore/pgstore/migrations; a disabled trigger: ALTER TABLE run_events ENABLE TRIGGER ...), or restore the database from a backup (docs/postgres.md, \"Schema\")",
			strings.Join(unguarded, ", ")), nil)
	case len(lacking) > 0:
		return damaged(fmt.Sprintf("this role lacks %s, which serve needs: run sidecar migrate as the database's owner, which grants them again (docs/postgres.md, \"Roles\")", strings.Join(lacking, ", ")), nil)
	}
	return nil
}

// grants are privileges: each table's as pairs (objs[i], privs[i]), and
// the functions that may be executed.
type grants struct{ objs, privs, funcs []string }

// runtimeGrants are the privileges grants.sql gives the runtime role,
// which Check requires of serve's own role. SELECT on the log_seq
// sequence is not among them: only a metric reads it, and does without
// it (SizeCollector).
var runtimeGrants = sync.OnceValue(func() grants {
	var g grants
	for _, m := range grantLine.FindAllStringSubmatch(grantsSQL, -1) {
		if strings.HasPrefix(m[2], "SEQUENCE ") {
			continue
		}
		if strings.HasPrefix(m[2], "FUNCTION ") {
			g.funcs = append(g.funcs, strings.TrimPrefix(m[2], "FUNCTION "))
			continue
		}
		for _, obj := range strings.Split(m[2], ",") {
			for _, priv := range strings.Split(m[1], ",") {
				g.objs, g.privs = append(g.objs, strings.TrimSpace(obj)), append(g.privs, strings.TrimSpace(priv))
			}
		}
	}
	return g
})

// grantLine is a line of grants.sql: GRANT privileges ON objects TO ...
var grantLine = regexp.MustCompile(`(?m)^GRANT (.+?) ON (.+?) TO `)

// tables are the tables the migrations create.
var tables = []string{"schema_migrations", "runs", "run_events", "event_ids", "control_replies", "nats_pairing", "run_snapshots", "runtime_role", "retention_role"}

// Pair checks that natsState, the identity of the NATS state serving with
// this database (serve: the run index's creation), is the one paired with
// it at the first start, and pairs it then. Another one gives a
// STORE_DAMAGED error naming both, unless accept, which pairs natsState
// instead (the operator accepts that the state of the other is gone).
// It returns the previous pairing when it changed ("" on the first).
func (s *Store) Pair(ctx context.Context, natsState string, accept bool) (previous string, err error) {
	ctx, cancel := s.callContext(ctx)
	defer cancel()
	var paired string
	var at time.Time
	err = s.pool.QueryRow(ctx, `WITH ins AS (INSERT INTO nats_pairing (nats_state) VALUES ($1) ON CONFLICT DO NOTHING RETURNING nats_state, paired_at)
		SELECT nats_state, paired_at FROM ins UNION ALL SELECT nats_state, paired_at FROM nats_pairing LIMIT 1`, natsState).Scan(&paired, &at)
	if errors.Is(err, pgx.ErrNoRows) { // another sidecar paired during the insert: read its row
		err = s.pool.QueryRow(ctx, "SELECT nats_state, paired_at FROM nats_pairing").Scan(&paired, &at)
	}
	switch {
	case err != nil:
		return "", s.pairFailed(ctx, err)
	case paired == natsState:
		return "", nil
	case !accept:
		return "", damaged(fmt.Sprintf("this database was used with other NATS state (paired %s with %s; this sidecar has %s)",
			at.UTC().Format(time.RFC3339), paired, natsState), ErrOtherNATSState)
	}
	if _, err := s.pool.Exec(ctx, "UPDATE nats_pairing SET nats_state = $1, paired_at = now()", natsState); err != nil {
		return "", s.pairFailed(ctx, err)
	}
	s.log.Warn("paired the database with new NATS state: the runs the old state knew are not resumed",
		zap.String("previous", paired), zap.String("natsState", natsState))
	return paired, nil
}

// pairFailed is Pair's error for err: a privilege the role lacks is
// named as Check names it, with its fix (migrate grants it again).
func (s *Store) pairFailed(ctx context.Context, err error) error {
	err = unavailable("pair with nats", err)
	if errors.Is(err, statestore.ErrDamaged) {
		if cerr := s.Check(ctx); errors.Is(cerr, statestore.ErrDamaged) {
			return cerr
		}
	}
	return err
}

// Append implements statestore.Store.
func (s *Store) Append(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	began := time.Now()
	res, err := s.append(ctx, w, -1)
	s.metrics.Appended(res, err, time.Since(began))
	return res, err
}

// AppendIf implements statestore.Store: the run's counter row, locked in
// the same transaction, must say lastSeq.
func (s *Store) AppendIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	began := time.Now()
	res, err := s.append(ctx, w, max(lastSeq, 0))
	s.metrics.Appended(res, err, time.Since(began))
	return res, err
}

func (s *Store) append(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	if err := statestore.ValidateWrite(w); err != nil {
		return statestore.AppendResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return statestore.AppendResult{}, unavailable("append", err)
	}
	body, err := statestore.EncodeWrite(w)
	if err != nil {
		return statestore.AppendResult{}, fmt.Errorf("pgstore: encode event: %w", err)
	}
	ctx, cancel := s.callContext(ctx)
	defer cancel()
	// One statement: append_event (migrations/0002) does the steps of
	// docs/postgres.md, "Appends", in the statement's own transaction.
	var (
		eventID    *string
		seq        *int64
		at         *time.Time
		idempotent *bool
		changed    *int64
	)
	err = s.pool.QueryRow(ctx, "SELECT o_event_id, o_run_seq, o_persisted_at, o_idempotent, o_changed_last FROM append_event($1, $2, $3, $4, $5, $6)",
		w.RunID, w.IdempotencyKey, w.EventID, w.EventType, string(body), lastSeq).Scan(&eventID, &seq, &at, &idempotent, &changed)
	switch {
	case err != nil:
		return statestore.AppendResult{}, unavailable("append", err)
	case changed != nil:
		return statestore.AppendResult{}, statestore.RunChanged(w.RunID, lastSeq, *changed)
	case eventID == nil || seq == nil || at == nil || idempotent == nil:
		return statestore.AppendResult{}, damaged("append_event answered without a record", nil)
	}
	return statestore.AppendResult{EventID: *eventID, RunSeq: *seq, PersistedAt: statestore.FormatPersistedAt(*at), Idempotent: *idempotent, Persisted: !*idempotent}, nil
}

// Fetch implements statestore.Store.
func (s *Store) Fetch(ctx context.Context, runID string, afterSeq int64, limit int) ([]statestore.RunEventRecord, error) {
	if statestore.CheckID(runID, false) != nil {
		return []statestore.RunEventRecord{}, nil // ValidateWrite never let such a run in
	}
	if err := ctx.Err(); err != nil {
		return nil, unavailable("fetch", err)
	}
	ctx, cancel := s.callContext(ctx)
	defer cancel()
	q := "SELECT run_seq, persisted_at, body FROM run_events WHERE run_id = $1 AND run_seq > $2 ORDER BY run_seq"
	args := []any{runID, afterSeq}
	if limit > 0 {
		q += " LIMIT $3"
		args = append(args, limit)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, unavailable("fetch", err)
	}
	defer rows.Close()
	out := []statestore.RunEventRecord{}
	for rows.Next() {
		var seq int64
		var at time.Time
		var body string
		if err := rows.Scan(&seq, &at, &body); err != nil {
			return nil, unavailable("fetch", err)
		}
		rec, err := record(seq, at, body)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, unavailable("fetch", err)
	}
	return out, nil
}

// Lookup implements statestore.KeyLookup.
func (s *Store) Lookup(ctx context.Context, runID, idempotencyKey string) (*statestore.RunEventRecord, error) {
	if statestore.CheckID(runID, false) != nil || !utf8.ValidString(idempotencyKey) {
		return nil, statestore.ErrNotFound
	}
	ctx, cancel := s.callContext(ctx)
	defer cancel()
	var seq int64
	var at time.Time
	var body string
	err := s.pool.QueryRow(ctx, "SELECT run_seq, persisted_at, body FROM run_events WHERE run_id = $1 AND idempotency_key = $2",
		runID, idempotencyKey).Scan(&seq, &at, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, statestore.ErrNotFound
	}
	if err != nil {
		return nil, unavailable("lookup", err)
	}
	rec, err := record(seq, at, body)
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// GetSnapshot implements statestore.Store.
func (s *Store) GetSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	return s.proj.Snapshot(ctx, runID)
}

// ProjectSnapshot implements statestore.Store.
func (s *Store) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	return s.proj.Project(ctx, runID)
}

func record(seq int64, at time.Time, body string) (statestore.RunEventRecord, error) {
	var rec statestore.RunEventRecord
	if err := json.Unmarshal([]byte(body), &rec.RunEventWrite); err != nil {
		return rec, damaged(fmt.Sprintf("record %d does not decode", seq), err)
	}
	if len(rec.Payload) == 0 {
		rec.Payload = nil
	}
	rec.RunSeq, rec.PersistedAt = seq, statestore.FormatPersistedAt(at)
	return rec, nil
}

// MaxWait is the longest any call of the store waits for PostgreSQL,
// whatever its caller's deadline: the server's statement_timeout and the
// store's timeout. Other users of Pool bound their calls by it
// (CallContext).
func (s *Store) MaxWait() time.Duration { return s.maxWait }

func (s *Store) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return CallContext(ctx, s.timeout, s.maxWait)
}

// CallContext bounds one call to PostgreSQL: by timeout when ctx has no
// deadline, and by maxWait when it has one (an earlier deadline stays).
// No statement runs longer than the server's statement_timeout, so a call
// still waiting after it and a margin waits on a host that stopped
// answering while its connections stay open (hung, partitioned): a
// caller's deadline an hour away (a step's) must not keep the call, its
// pool connection and the locks its caller holds that long.
func CallContext(ctx context.Context, timeout, maxWait time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		timeout = maxWait
	}
	return context.WithTimeout(ctx, timeout)
}

func unavailable(op string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42501" || pe.Code == "XX001") { // insufficient_privilege, data_corrupted
		return &statestore.Error{Code: statestore.CodeStoreDamaged, Message: op + ": " + pe.Message, Err: err}
	}
	return &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: op + ": " + err.Error(), Err: err}
}

// innermost is the last error of err's chain (a refused dial, a refused
// password), without the driver's multi-line summary of every attempt.
func innermost(err error) error {
	for {
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			if u.Unwrap() == nil {
				return err
			}
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			all := u.Unwrap()
			if len(all) == 0 {
				return err
			}
			err = all[len(all)-1]
		default:
			return err
		}
	}
}

func damaged(msg string, err error) error {
	return &statestore.Error{Code: statestore.CodeStoreDamaged, Message: msg, Err: err}
}

// ForgetRun drops runID's snapshot from the projector's memory, for a run
// that leaves hot state (a retention Forgetter); the log is not touched.
func (s *Store) ForgetRun(_ context.Context, runID string) error {
	s.proj.Forget(runID)
	return nil
}

// parseURL is url's pool configuration; flag names the option that gave
// it. A URL pgx cannot parse is STORE_URL_INVALID with pgx's reason,
// which shows the URL with its password masked.
func parseURL(url, flag string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, &statestore.Error{Code: CodeURLInvalid, Kind: errcode.Invalid, Err: err,
			Message: fmt.Sprintf("%s: %v (the form is postgres://user@host:port/database, the password in PGPASSFILE or PGPASSWORD; docs/postgres.md)", flag, err)}
	}
	return cfg, nil
}

// CheckURL checks url, a PostgreSQL URL given by option flag, without
// connecting: nil, or the STORE_URL_INVALID error Open would return.
func CheckURL(url, flag string) error {
	_, err := parseURL(url, flag)
	return err
}
