package pgstore

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// snapshots is a statestore.SnapshotStore on the table run_snapshots.
type snapshots struct{ s *Store }

var _ statestore.SnapshotStore = snapshots{}

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
	if _, err := d.s.pool.Exec(ctx, `INSERT INTO run_snapshots (run_id, body) VALUES ($1, $2)
		ON CONFLICT (run_id) DO UPDATE SET body = EXCLUDED.body, saved_at = now()`, snap.Snapshot.RunID, string(b)); err != nil {
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
