package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
)

// PostgresOptions configures OpenPostgres.
type PostgresOptions struct {
	// Timeout bounds each call that has no deadline of its own (default 5s).
	Timeout time.Duration
	// MaxWait bounds each call whatever its caller's deadline (default:
	// Timeout and the store's default statement_timeout;
	// pgstore.Store.MaxWait is the store's).
	MaxWait time.Duration
	// Logger receives adopt notices and debug traces (default zap.NewNop()).
	Logger *zap.Logger
	// Metrics records operations (default nil: none).
	Metrics *Metrics
}

// OpenPostgres returns a Registry on the table event_ids of the database
// pool is connected to, the one the run event log is in (package pgstore
// creates the table with its migrations and hands out the pool). It
// checks the table is there. The Registry does not own pool.
//
// On PostgreSQL an EventID is one statement in the common case (insert the
// fresh eventId unless the key has one, return what is stored), an Adopt
// one upsert; (run_id, idempotency_key) is the table's primary key, so
// racing producers, in any number of processes, all return the one row.
func OpenPostgres(ctx context.Context, pool *pgxpool.Pool, opts PostgresOptions) (*Registry, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = pgstore.DefaultTimeout
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = opts.Timeout + pgstore.DefaultStatementTimeout
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	e := &pgEntries{pool: pool, timeout: opts.Timeout, maxWait: opts.MaxWait, log: opts.Logger.Named("registry")}
	ctx, cancel := e.callContext(ctx)
	defer cancel()
	if _, err := pool.Exec(ctx, "SELECT 1 FROM event_ids LIMIT 0"); err != nil {
		return nil, fmt.Errorf("%w: open table event_ids (pgstore's migrations create it): %w", ErrUnavailable, err)
	}
	return &Registry{entries: e, log: e.log, metrics: opts.Metrics}, nil
}

// pgEntries keeps the eventIds in the table event_ids.
type pgEntries struct {
	pool    *pgxpool.Pool
	timeout time.Duration
	maxWait time.Duration
	log     *zap.Logger
}

func (p *pgEntries) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return pgstore.CallContext(ctx, p.timeout, p.maxWait)
}

// insertOrGet inserts the fresh eventId unless the key has one and
// returns the stored value, with true when it is the fresh one. Its SELECT
// sees the statement's snapshot: a row that a racing producer committed
// while the INSERT waited on it is not in it, and the query returns no
// row (getOrCreate then reads it with a new statement).
const insertOrGet = `WITH ins AS (
	INSERT INTO event_ids (run_id, idempotency_key, event_id) VALUES ($1, $2, $3)
	ON CONFLICT (run_id, idempotency_key) DO NOTHING RETURNING event_id)
SELECT event_id::text, true FROM ins
UNION ALL
SELECT event_id::text, false FROM event_ids WHERE run_id = $1 AND idempotency_key = $2
LIMIT 1`

func (p *pgEntries) getOrCreate(ctx context.Context, runID, idempotencyKey, key, fresh string) (string, bool, error) {
	ctx, cancel := p.callContext(ctx)
	defer cancel()
	var stored string
	var created bool
	err := p.pool.QueryRow(ctx, insertOrGet, runID, idempotencyKey, fresh).Scan(&stored, &created)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// A racing producer's row committed during the INSERT: read it.
		stored, err = p.lookup(ctx, runID, idempotencyKey, key)
		if errors.Is(err, ErrNotFound) {
			return "", false, fmt.Errorf("%w: key %s: inserted by another producer and not found", ErrConflict, key)
		}
		if err != nil {
			return "", false, err
		}
	case err != nil:
		return "", false, pgUnavailable("get or create", key, err)
	}
	p.log.Debug("eventId", zap.String("runId", runID), zap.String("idempotencyKey", idempotencyKey),
		zap.String("eventId", stored), zap.Bool("created", created))
	return stored, created, nil
}

func (p *pgEntries) adopt(ctx context.Context, runID, idempotencyKey, key, eventID string) (bool, error) {
	ctx, cancel := p.callContext(ctx)
	defer cancel()
	// The upsert writes (and returns a row) only when the stored value
	// differs or there is none.
	tag, err := p.pool.Exec(ctx, `INSERT INTO event_ids (run_id, idempotency_key, event_id) VALUES ($1, $2, $3)
		ON CONFLICT (run_id, idempotency_key) DO UPDATE SET event_id = EXCLUDED.event_id
		WHERE event_ids.event_id <> EXCLUDED.event_id`, runID, idempotencyKey, eventID)
	if err != nil {
		return false, pgUnavailable("adopt", key, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	p.log.Info("eventId adopted from the append authority", zap.String("runId", runID),
		zap.String("idempotencyKey", idempotencyKey), zap.String("eventId", eventID))
	return true, nil
}

func (p *pgEntries) lookup(ctx context.Context, runID, idempotencyKey, key string) (string, error) {
	ctx, cancel := p.callContext(ctx)
	defer cancel()
	var stored string
	err := p.pool.QueryRow(ctx, "SELECT event_id::text FROM event_ids WHERE run_id = $1 AND idempotency_key = $2",
		runID, idempotencyKey).Scan(&stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: key %s", ErrNotFound, key)
	}
	if err != nil {
		return "", pgUnavailable("lookup", key, err)
	}
	return stored, nil
}

func pgUnavailable(op, key string, err error) error {
	return fmt.Errorf("%w: %s key %s: %w", ErrUnavailable, op, key, err)
}
