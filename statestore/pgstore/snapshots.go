package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// snapshots is a statestore.SnapshotStore on the table run_snapshots.
type snapshots struct{ s *Store }

var (
	_ statestore.SnapshotStore   = snapshots{}
	_ statestore.SnapshotChecker = snapshots{}
)

func (d snapshots) LoadSnapshot(ctx context.Context, runID string) (*statestore.DurableSnapshot, error) {
	ctx, cancel := d.s.withTimeout(ctx)
	defer cancel()
	var body string
	err := d.s.pool.QueryRow(ctx, "SELECT body FROM run_snapshots WHERE run_id = $1", runID).Scan(&body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, statestore.ErrNotFound
	}
	if err != nil {
		return nil, unavailable("load snapshot", err)
	}
	var snap statestore.DurableSnapshot
	if err := json.Unmarshal([]byte(body), &snap); err != nil {
		return nil, statestore.ErrNotFound // damaged: rebuilt from the log and written anew
	}
	return &snap, nil
}

func (d snapshots) SaveSnapshot(ctx context.Context, snap *statestore.DurableSnapshot) error {
	b, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	ctx, cancel := d.s.withTimeout(ctx)
	defer cancel()
	// With the chain hash of the record at the watermark (none: nothing
	// is saved; the log no longer holds it).
	if _, err := d.s.pool.Exec(ctx, `INSERT INTO run_snapshots (run_id, body, chain_hash)
		SELECT $1, $2, e.chain_hash FROM run_events e WHERE e.run_id = $1 AND e.run_seq = $3
		ON CONFLICT (run_id) DO UPDATE SET body = EXCLUDED.body, chain_hash = EXCLUDED.chain_hash, saved_at = now()`,
		snap.Snapshot.RunID, string(b), snap.Snapshot.LastEventSeq); err != nil {
		return unavailable("save snapshot", err)
	}
	return nil
}

func (d snapshots) DeleteSnapshot(ctx context.Context, runID string) error {
	ctx, cancel := d.s.withTimeout(ctx)
	defer cancel()
	if _, err := d.s.pool.Exec(ctx, "DELETE FROM run_snapshots WHERE run_id = $1", runID); err != nil {
		return unavailable("delete snapshot", err)
	}
	return nil
}

// checkChain is CheckSnapshot's query: the saved chain hash, the chain
// hash the log holds at the watermark, and the first record up to the
// watermark that does not follow the one before it (runSeq not the next,
// or a chain hash that is not SHA-256 of the previous one and the
// record's canonical bytes: a record changed, or one before it changed
// or removed), all computed in the database.
const checkChain = `SELECT
	(SELECT s.chain_hash FROM run_snapshots s WHERE s.run_id = $1),
	(SELECT e.chain_hash FROM run_events e WHERE e.run_id = $1 AND e.run_seq = $2),
	(SELECT min(x.run_seq) FROM (
		SELECT e.run_seq, e.chain_hash, lag(e.run_seq, 1, 0::bigint) OVER w AS seq_before,
			run_event_chain(coalesce(lag(e.chain_hash) OVER w, decode(repeat('00', 32), 'hex')), e.run_id, e.run_seq, e.log_seq,
				e.persisted_at, e.idempotency_key, e.event_id, e.event_type, e.body) AS computed
		FROM run_events e WHERE e.run_id = $1 AND e.run_seq <= $2
		WINDOW w AS (ORDER BY e.run_seq)) x
	 WHERE x.run_seq <> x.seq_before + 1 OR x.chain_hash IS DISTINCT FROM x.computed)`

// CheckSnapshot implements statestore.SnapshotChecker: the records up to
// d's watermark are the ones its chain hash was saved with. It returns
// LOG_CHAIN_BROKEN naming the first record that breaks the chain, or the
// watermark when the hash there is not the saved one.
func (d snapshots) CheckSnapshot(ctx context.Context, snap *statestore.DurableSnapshot) error {
	ctx, cancel := d.s.withTimeout(ctx)
	defer cancel()
	runID, w := snap.Snapshot.RunID, snap.Snapshot.LastEventSeq
	var saved, head []byte
	var broken *int64
	if err := d.s.pool.QueryRow(ctx, checkChain, runID, w).Scan(&saved, &head, &broken); err != nil {
		return unavailable("check snapshot", err)
	}
	switch {
	case broken != nil:
		return chainBroken(fmt.Sprintf("run %s: the record at runSeq %d does not follow the one before it in the hash chain (a record changed or removed)", runID, *broken))
	case saved == nil || !bytes.Equal(saved, head):
		return chainBroken(fmt.Sprintf("run %s: the chain hash at runSeq %d is not the one its snapshot was saved with", runID, w))
	}
	return nil
}

func chainBroken(msg string) error {
	return &statestore.Error{Code: CodeChainBroken, Message: msg}
}
