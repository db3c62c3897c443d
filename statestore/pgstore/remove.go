package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// retentionVersion is the first schema version with remove_run
// (migrations/0005).
const retentionVersion = 5

// RemoverOptions configures OpenRemover.
type RemoverOptions struct {
	// Timeout bounds each removal, whatever its caller's deadline (default
	// 30s): serve sets no statement_timeout on the retention role's connections,
	// and remove_run is one statement.
	Timeout time.Duration
	Logger  *zap.Logger
}

// removeConns is the retention role's connections: the runs of a
// RemoveRuns removed this many at a time, each in its own transaction.
const removeConns = 2

// Remover removes finished runs from the log through remove_run
// (migrations/0005), connected as the retention role: each run's records,
// counter row, saved snapshot and event ids leave in one transaction. It
// does not decide what may be removed: its caller (retention) removes a run
// only once the run's archive was read back and checked. It is safe for
// concurrent use.
type Remover struct {
	pool    *pgxpool.Pool
	timeout time.Duration
	log     *zap.Logger
}

// OpenRemover connects to url as the retention role (serve
// --retention-store) and checks that the role may remove runs: a schema
// before remove_run gives STORE_MIGRATION_NEEDED, a role without EXECUTE
// on it (the runtime role, a role never granted) STORE_ROLE_REFUSED, each
// naming the fix.
func OpenRemover(ctx context.Context, url string, opts RemoverOptions) (*Remover, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	cfg, err := parseURL(url, "--retention-store")
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = removeConns
	octx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	pool, err := connect(octx, cfg, "--retention-store")
	if err != nil {
		return nil, err
	}
	if err := admitRemover(octx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return &Remover{pool: pool, timeout: opts.Timeout, log: opts.Logger.Named("pgremover")}, nil
}

func admitRemover(ctx context.Context, pool *pgxpool.Pool) error {
	r, err := readRoles(ctx, pool)
	if err != nil {
		return err
	}
	if r.version < retentionVersion {
		return &statestore.Error{Code: CodeMigrationNeeded, Message: fmt.Sprintf(
			"the database's schema is at version %d, before retention (%d): run sidecar migrate --store postgres://OWNER@host:port/database --retention-role %s with this sidecar's binary (docs/postgres.md, \"Roles\")", r.version, retentionVersion, r.user)}
	}
	var may bool
	if err := pool.QueryRow(ctx, "SELECT has_function_privilege(current_user, 'remove_run(text, bigint, bigint)', 'EXECUTE')").Scan(&may); err != nil {
		return unavailable("read the retention role's privileges", err)
	}
	if !may || r.user == r.runtime {
		return roleRefused(fmt.Sprintf("--retention-store connects as %s, which may not remove runs: connect as the retention role (deploy/postgres/roles.sql) granted by sidecar migrate --retention-role ROLE (docs/postgres.md, \"Roles\")", r.user))
	}
	return nil
}

// Close closes the pool.
func (r *Remover) Close() { r.pool.Close() }

// RemoveRuns removes runs, each as RemoveRun does (a transaction of its
// own), removeConns at a time. Every run is tried; the errors of those
// not removed are returned, joined.
func (r *Remover) RemoveRuns(ctx context.Context, runs []statestore.Removal) error {
	errs := make([]error, len(runs))
	var g errgroup.Group
	g.SetLimit(removeConns)
	for i, rm := range runs {
		g.Go(func() error {
			errs[i] = r.RemoveRun(ctx, rm.RunID, rm.LastRunSeq, rm.Records)
			return nil
		})
	}
	_ = g.Wait() // each run's outcome is in errs
	return errors.Join(errs...)
}

// RemoveRun removes runID from the log: its records (runSeq 1 to
// lastRunSeq, records of them), its counter row, its saved snapshot and
// its event ids, in one transaction. A run the log no longer has is
// removed already: nil. It removes nothing, and returns RUN_CHANGED, when
// the run's records are not those (a record came after its archive), and
// RUN_NOT_FINISHED when none of them is terminal.
func (r *Remover) RemoveRun(ctx context.Context, runID string, lastRunSeq, records uint64) error {
	if statestore.CheckID(runID, true) != nil || lastRunSeq == 0 || records == 0 || records > lastRunSeq || lastRunSeq > 1<<62 {
		return &statestore.Error{Code: statestore.CodeSchemaValidationFailed, Message: fmt.Sprintf("remove run %q: lastRunSeq %d, records %d", runID, lastRunSeq, records)}
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	var removed, last, have int64
	var finished bool
	err := r.pool.QueryRow(ctx, "SELECT o_removed, o_last, o_records, o_finished FROM remove_run($1, $2, $3)",
		runID, int64(lastRunSeq), int64(records)).Scan(&removed, &last, &have, &finished)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "42501": // insufficient_privilege
		return &statestore.Error{Code: CodeRoleRefused, Err: err, Message: fmt.Sprintf(
			"remove run %q: %s: the retention role may no longer call remove_run; run sidecar migrate --retention-role ROLE as the log's owner, which grants it again (docs/postgres.md, \"Retention\")", runID, pe.Message)}
	case err != nil:
		return unavailable("remove run "+runID, err)
	case removed > 0:
		r.log.Debug("removed", zap.String("runId", runID), zap.Int64("records", removed))
		return nil
	case last == 0:
		return nil // removed before
	case last != int64(lastRunSeq) || have != int64(records):
		return &statestore.Error{Code: statestore.CodeRunChanged, Message: fmt.Sprintf(
			"run %q has %d records up to runSeq %d, not the %d up to runSeq %d archived: nothing removed", runID, have, last, records, lastRunSeq)}
	case !finished:
		return &statestore.Error{Code: CodeRunNotFinished, Message: fmt.Sprintf("run %q has no terminal event: nothing removed", runID)}
	}
	return damaged(fmt.Sprintf("remove_run removed nothing of run %q (runSeq %d, %d records, finished)", runID, last, have), nil)
}
