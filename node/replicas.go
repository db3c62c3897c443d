package node

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// checkClusterSize refuses --nats-replicas larger than the NATS cluster
// serve is connected to: JetStream would refuse every stream it creates
// (or, for an existing one, nothing would tell that it is not as
// replicated as asked). The cluster's size is what the server tells its
// clients: itself and the peers it advertises.
func checkClusterSize(nc *nats.Conn, replicas int) error {
	if replicas <= 1 {
		return nil
	}
	if nc.ConnectedClusterName() == "" {
		return fmt.Errorf("--nats-replicas %d: the NATS server at %s is not part of a cluster; use --nats-replicas 1, or a cluster (deploy/local/nats-cluster.sh, docs/jetstream.md)",
			replicas, nc.ConnectedUrlRedacted())
	}
	if n := len(nc.Servers()); replicas > n {
		return fmt.Errorf("--nats-replicas %d: the NATS cluster %q shows %d servers; use at most %d",
			replicas, nc.ConnectedClusterName(), n, n)
	}
	return nil
}

// reportReplicas warns, once at start, about every stream of the sidecar
// whose replica count is not replicas: it was created before, with
// another --nats-replicas, and serve never updates a stream (its NATS user
// may not). The warning carries the command that fixes it.
func reportReplicas(ctx context.Context, js jetstream.JetStream, replicas int, streams []string, log *zap.Logger) {
	for _, name := range streams {
		st, err := js.Stream(ctx, name)
		if err != nil {
			continue // NewGuard and Store.Check report missing streams
		}
		if have := st.CachedInfo().Config.Replicas; have != replicas {
			log.Warn("a stream of the sidecar has another replica count than --nats-replicas; change it as the NATS admin user",
				zap.String("stream", name), zap.Int("replicas", have), zap.Int("want", replicas),
				zap.String("fix", fmt.Sprintf("nats stream edit %s --replicas %d", name, replicas)))
		}
	}
}
