package e2e

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// TestE2E_BucketsOpenedTogetherOnACluster: replicas that open the same
// bucket at the same moment, each through another node of a 3-node
// cluster, each create it or find it made; a bucket the cluster assigned an
// instant ago may not be served by its replicas yet. Every open either
// binds to the bucket or fails with an error serve's start tries again
// (natsstore.NotReady), never one it gives up on, and binds when tried
// again. Rounds on a fresh name each, for each way serve opens a bucket.
func TestE2E_BucketsOpenedTogetherOnACluster(t *testing.T) {
	t.Parallel() // its own cluster
	cl := startNATSCluster(t)
	urls := strings.Split(cl.url(t), ",")
	js := make([]jetstream.JetStream, len(urls))
	for i, u := range urls {
		nc, err := nats.Connect(u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		if js[i], err = jetstream.New(nc); err != nil {
			t.Fatal(err)
		}
	}
	opens := map[string]func(ctx context.Context, js jetstream.JetStream, round int) error{
		"OpenBucket": func(ctx context.Context, js jetstream.JetStream, round int) error {
			_, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "RACE_" + strconv.Itoa(round), Replicas: 3})
			return err
		},
		"Registry": func(ctx context.Context, js jetstream.JetStream, round int) error {
			_, err := registry.Open(ctx, js, registry.Options{Bucket: "RACE_REG_" + strconv.Itoa(round), Replicas: 3})
			return err
		},
		"Replies": func(ctx context.Context, js jetstream.JetStream, round int) error {
			// The bucket's name is fixed: each round deleted it first.
			_, err := httpapi.OpenKVReplies(ctx, js, httpapi.KVRepliesOptions{Replicas: 3, MaxBytes: 32 << 20})
			return err
		},
	}
	const rounds = 15
	for name, open := range opens {
		t.Run(name, func(t *testing.T) {
			var notReady atomic.Int32
			for round := range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				if name == "Replies" {
					_ = js[0].DeleteStream(ctx, "KV_"+httpapi.KVRepliesBucket)
				}
				var wg sync.WaitGroup
				errs := make([]error, len(js))
				for i := range js {
					wg.Add(1)
					go func() {
						defer wg.Done()
						// As serve's start does: again while the cluster is
						// not ready, each attempt bounded as serve's requests
						// are (a request about a stream whose replicas are
						// electing its leader may get no answer at all).
						for {
							attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
							errs[i] = open(attempt, js[i], round)
							cancel()
							if !natsstore.NotReady(errs[i]) || ctx.Err() != nil {
								return
							}
							notReady.Add(1)
							time.Sleep(100 * time.Millisecond)
						}
					}()
				}
				wg.Wait()
				cancel()
				for i, err := range errs {
					if err != nil {
						t.Errorf("round %d, node %d: %v", round, i, err)
					}
				}
			}
			t.Logf("%d of %d opens found the cluster not ready, and bound once it was", notReady.Load(), rounds*len(js))
		})
	}
}
