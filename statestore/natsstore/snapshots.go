package natsstore

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// DefaultSnapshotBucket is the KV bucket of the persisted run snapshots
// (statestore.ProjectorOptions.Durable): one key per run, its RunToken.
const DefaultSnapshotBucket = "SIDECAR_SNAPSHOTS"

// snapshots is a statestore.SnapshotStore on a KV bucket.
type snapshots struct {
	kv jetstream.KeyValue
}

var _ statestore.SnapshotStore = (*snapshots)(nil)

func openSnapshots(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*snapshots, error) {
	kv, err := OpenBucket(ctx, js, jetstream.KeyValueConfig{Bucket: bucket, History: 1, Replicas: replicas,
		Description: "run snapshots projected from the event log, with their watermark (derived: lost, they are rebuilt from the log)"})
	if err != nil {
		return nil, unavailable("open bucket "+bucket, err)
	}
	return &snapshots{kv: kv}, nil
}

func (s *snapshots) LoadSnapshot(ctx context.Context, runID string) (*statestore.DurableSnapshot, error) {
	e, err := s.kv.Get(ctx, RunToken(runID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, statestore.ErrNotFound
	}
	if err != nil {
		return nil, unavailable("load snapshot", err)
	}
	var d statestore.DurableSnapshot
	if err := json.Unmarshal(e.Value(), &d); err != nil {
		return nil, statestore.ErrNotFound // damaged: rebuilt from the log and written anew
	}
	return &d, nil
}

func (s *snapshots) SaveSnapshot(ctx context.Context, d *statestore.DurableSnapshot) error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	if _, err := s.kv.Put(ctx, RunToken(d.Snapshot.RunID), b); err != nil {
		return unavailable("save snapshot", err)
	}
	return nil
}

func (s *snapshots) DeleteSnapshot(ctx context.Context, runID string) error {
	if err := s.kv.Delete(ctx, RunToken(runID)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return unavailable("delete snapshot", err)
	}
	return nil
}
