package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// MigrateTo applies the migrations up to version to the database at url,
// making a database of an older schema for TestMigrations_OlderSchema.
func MigrateTo(ctx context.Context, url string, version int) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	all, err := migrations()
	if err != nil {
		return err
	}
	var some []migration
	for _, m := range all {
		if m.version <= version {
			some = append(some, m)
		}
	}
	_, _, _, err = migrateTo(ctx, pool, some, "", "")
	return err
}

// Snapshots is the store's statestore.SnapshotStore on run_snapshots.
func Snapshots(s *Store) interface {
	statestore.SnapshotStore
	statestore.SnapshotChecker
} {
	return snapshots{s}
}
