package natsstore

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// OpenBucket creates the KV bucket cfg describes, or binds to it as it is
// when it exists: the sidecar's NATS user may not update buckets
// (docs/jetstream.md), so a bucket an administrator configured otherwise
// (more replicas, say) is kept as it is.
func OpenBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, cfg.Bucket)
	}
	return kv, err
}
