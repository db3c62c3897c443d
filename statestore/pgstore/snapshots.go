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
	ctx, cancel := d.s.callContext(ctx)
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
	ctx, cancel := d.s.callContext(ctx)
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
	ctx, cancel := d.s.callContext(ctx)
	defer cancel()
	if _, err := d.s.pool.Exec(ctx, "DELETE FROM run_snapshots WHERE run_id = $1", runID); err != nil {
		return unavailable("delete snapshot", err)
	}
	return nil
}

// CheckSnapshot implements statestore.SnapshotChecker: the records up to
// d's watermark are the ones its chain hash was saved with. It reads them
// and recomputes their chain in this binary, as sidecar verify does
// (hashing in the database cost about twice reading them), and returns
// LOG_CHAIN_BROKEN naming the first record that breaks the chain, or the
// watermark when the hash there is not the saved one.
func (d snapshots) CheckSnapshot(ctx context.Context, snap *statestore.DurableSnapshot) error {
	ctx, cancel := d.s.callContext(ctx)
	defer cancel()
	runID, w := snap.Snapshot.RunID, snap.Snapshot.LastEventSeq
	// One query: the saved chain hash beside each record up to the
	// watermark (no row: the snapshot is gone).
	rows, err := d.s.pool.Query(ctx, "SELECT "+chainColumns+`, s.chain_hash FROM run_snapshots s
		JOIN run_events ON run_events.run_id = s.run_id AND run_events.run_seq <= $2
		WHERE s.run_id = $1 ORDER BY run_events.run_seq`, runID, w)
	if err != nil {
		return unavailable("check snapshot", err)
	}
	var walk runWalk
	var rec chainRow
	var saved []byte
	if _, err := pgx.ForEachRow(rows, append(rec.dest(), &saved), func() error { walk.step(&rec); return nil }); err != nil {
		return unavailable("check snapshot", err)
	}
	switch b := walk.broken; {
	case b != nil:
		return chainBroken(fmt.Sprintf("run %s: %s: %s", runID, b.Code, b.Message))
	case walk.next != w+1 || !bytes.Equal(walk.prev, saved):
		return chainBroken(fmt.Sprintf("run %s: the chain hash at runSeq %d is not the one its snapshot was saved with", runID, w))
	}
	return nil
}

func chainBroken(msg string) error {
	return &statestore.Error{Code: CodeChainBroken, Message: msg}
}
