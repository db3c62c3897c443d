package natsstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// BenchmarkBucketPut measures what the write guard costs a KV write: the
// same Put to the same bucket on one server, through the bucket as
// JetStream gives it (raw) and as OpenBucket gives it (guarded: a key
// bound and the guard's cached lookup before the write).
func BenchmarkBucketPut(b *testing.B) {
	ctx := context.Background()
	js, srv := natstest.StartIn(b, b.TempDir(), natsstore.EmbeddedConfig{SyncInterval: 2 * time.Minute, Logger: zap.NewNop()})
	if err := srv.Check(); err != nil {
		b.Fatal(err)
	}
	guarded, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "BENCH_PUT"})
	if err != nil {
		b.Fatal(err)
	}
	raw, err := js.KeyValue(ctx, "BENCH_PUT")
	if err != nil {
		b.Fatal(err)
	}
	val := make([]byte, 256)
	for _, kv := range []struct {
		name string
		kv   jetstream.KeyValue
	}{{"raw", raw}, {"guarded", guarded}} {
		b.Run(kv.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if _, err := kv.kv.Put(ctx, fmt.Sprintf("k%d", i%1000), val); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
