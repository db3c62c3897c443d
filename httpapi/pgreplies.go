package httpapi

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
)

// PostgresReplies keeps replies in the table control_replies of the run
// event log's database (serve --store postgres://...; package pgstore's
// migrations create the table), shared by every sidecar on it. Time is
// the database's clock, the same for every replica.
type PostgresReplies struct {
	pool *pgxpool.Pool
	ttl  time.Duration
	// StaleAfter is how long a claim without an answer blocks its key
	// (a process that died mid-request); then a retry takes it over.
	StaleAfter time.Duration
	// MaxBytes bounds the table's rows (0: DefaultRepliesMaxBytes).
	MaxBytes int64
	timeout  time.Duration
	maxWait  time.Duration
	// lastPrune is when a Claim last deleted the expired rows (unix ns).
	lastPrune atomic.Int64
}

// pruneEvery is how often Claims delete the rows older than the TTL: the
// table's size follows the requests of the last TTL, and no background
// loop runs for it.
const pruneEvery = time.Minute

// OpenPostgresReplies returns the replies on pool's database, after
// checking the table is there. Replies expire after ttl (default 24h).
// Each call waits at most maxWait whatever its caller's deadline (default:
// the store's with its default timeouts; pgstore.Store.MaxWait is the
// store's). It does not own pool.
func OpenPostgresReplies(ctx context.Context, pool *pgxpool.Pool, ttl, maxWait time.Duration) (*PostgresReplies, error) {
	if ttl <= 0 {
		ttl = 24 * time.Hour
	}
	if maxWait <= 0 {
		maxWait = pgstore.DefaultTimeout + pgstore.DefaultStatementTimeout
	}
	p := &PostgresReplies{pool: pool, ttl: ttl, StaleAfter: time.Minute, timeout: pgstore.DefaultTimeout, maxWait: maxWait}
	ctx, cancel := p.callContext(ctx)
	defer cancel()
	if _, err := pool.Exec(ctx, "SELECT 1 FROM control_replies LIMIT 0"); err != nil {
		return nil, fmt.Errorf("open table control_replies (pgstore's migrations create it): %w", err)
	}
	return p, nil
}

func (p *PostgresReplies) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return pgstore.CallContext(ctx, p.timeout, p.maxWait)
}

// claimRow inserts a claim, or takes the key over when its row expired or
// is a stale claim of the same request; it writes nothing otherwise.
const claimRow = `INSERT INTO control_replies (key, fingerprint, claimed_at) VALUES ($1, $2, now())
ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, claimed_at = EXCLUDED.claimed_at, status = NULL, body = NULL
WHERE control_replies.claimed_at < now() - $4::bigint * interval '1 microsecond'
   OR (control_replies.status IS NULL AND control_replies.fingerprint = EXCLUDED.fingerprint
       AND control_replies.claimed_at <= now() - $3::bigint * interval '1 microsecond')`

// Claim implements Replies.
func (p *PostgresReplies) Claim(ctx context.Context, key, fp string) (*Reply, error) {
	ctx, cancel := p.callContext(ctx)
	defer cancel()
	p.prune(ctx)
	for range 3 {
		tag, err := p.pool.Exec(ctx, claimRow, key, fp, p.StaleAfter.Microseconds(), p.ttl.Microseconds())
		if err != nil {
			return nil, fmt.Errorf("claim reply %s: %w", key, err)
		}
		if tag.RowsAffected() == 1 {
			return nil, nil
		}
		var held string
		var status *int
		var body *string
		err = p.pool.QueryRow(ctx, "SELECT fingerprint, status, body FROM control_replies WHERE key = $1", key).Scan(&held, &status, &body)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue // released meanwhile
		case err != nil:
			return nil, fmt.Errorf("read reply %s: %w", key, err)
		case held != fp:
			return nil, ErrKeyReused
		case status != nil:
			return &Reply{Status: *status, Body: []byte(*body)}, nil
		}
		return nil, ErrReplyPending
	}
	return nil, ErrReplyPending
}

// pruneBytes deletes the oldest rows (by claimed_at, which a keep sets)
// past the newest $1 bytes: a row counts its key, its fingerprint and its
// body as stored (pg_column_size: compressed, if PostgreSQL compressed it).
const pruneBytes = `DELETE FROM control_replies c USING (
	SELECT key FROM (
		SELECT key, sum(octet_length(key) + octet_length(fingerprint) + coalesce(pg_column_size(body), 0))
			OVER (ORDER BY claimed_at DESC, key ROWS UNBOUNDED PRECEDING) AS newer
		FROM control_replies) r
	WHERE newer > $1) old
WHERE c.key = old.key`

// prune deletes the expired rows, then the oldest past MaxBytes, at most
// once every pruneEvery across the process's Claims; a failure is left to
// the next one.
func (p *PostgresReplies) prune(ctx context.Context) {
	now := time.Now().UnixNano()
	last := p.lastPrune.Load()
	if now-last < int64(pruneEvery) || !p.lastPrune.CompareAndSwap(last, now) {
		return
	}
	_, _ = p.pool.Exec(ctx, "DELETE FROM control_replies WHERE claimed_at < now() - $1::bigint * interval '1 microsecond'", p.ttl.Microseconds())
	maxBytes := p.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultRepliesMaxBytes
	}
	_, _ = p.pool.Exec(ctx, pruneBytes, maxBytes)
}

// Keep implements Replies.
func (p *PostgresReplies) Keep(ctx context.Context, key, fp string, r *Reply) error {
	ctx, cancel := p.callContext(ctx)
	defer cancel()
	_, err := p.pool.Exec(ctx, `INSERT INTO control_replies (key, fingerprint, claimed_at, status, body) VALUES ($1, $2, now(), $3, $4)
		ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, claimed_at = EXCLUDED.claimed_at,
		status = EXCLUDED.status, body = EXCLUDED.body`, key, fp, r.Status, string(r.Body))
	if err != nil {
		return fmt.Errorf("keep reply %s: %w", key, err)
	}
	return nil
}

// Release implements Replies: it deletes the claim, never a kept answer.
func (p *PostgresReplies) Release(ctx context.Context, key string) error {
	ctx, cancel := p.callContext(ctx)
	defer cancel()
	if _, err := p.pool.Exec(ctx, "DELETE FROM control_replies WHERE key = $1 AND status IS NULL", key); err != nil {
		return fmt.Errorf("release reply %s: %w", key, err)
	}
	return nil
}
