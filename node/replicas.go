package node

import (
	"context"
	"fmt"
	"strings"

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

// reportReplicas warns, once at start, when streams of the sidecar have
// another replica count than replicas (replicaMismatch): they were
// created before, with another --nats-replicas, and serve never updates a
// stream (its NATS user may not).
func reportReplicas(ctx context.Context, js jetstream.JetStream, replicas int, streams []string, log *zap.Logger) {
	have := make([]streamReplicas, 0, len(streams))
	for _, name := range streams {
		st, err := js.Stream(ctx, name)
		if err != nil {
			continue // NewGuard and Store.Check report missing streams
		}
		have = append(have, streamReplicas{name, st.CachedInfo().Config.Replicas})
	}
	for _, w := range replicaMismatch(have, replicas) {
		log.Warn(w.msg, zap.Strings("streams", w.streams), zap.Int("want", replicas), zap.String("fix", w.fix))
	}
}

// streamReplicas is a stream's name and replica count.
type streamReplicas struct {
	name     string
	replicas int
}

// replicaWarning is one warning of replicaMismatch.
type replicaWarning struct {
	msg, fix string
	streams  []string
}

// replicaMismatch is what to warn about streams whose replica count is
// not replicas, one warning for all of a kind, with the safe fix. Streams
// with more copies than asked are the deployment's (another replica's
// --nats-replicas, or an admin's): this replica's flag is what to
// change, since lowering the streams would keep fewer copies of the log.
// Streams with fewer are raised by the NATS admin user.
func replicaMismatch(have []streamReplicas, replicas int) []replicaWarning {
	var more, fewer replicaWarning
	most := 0
	for _, s := range have {
		switch {
		case s.replicas > replicas:
			more.streams = append(more.streams, fmt.Sprintf("%s=%d", s.name, s.replicas))
			most = max(most, s.replicas)
		case s.replicas < replicas:
			fewer.streams = append(fewer.streams, s.name)
		}
	}
	var out []replicaWarning
	if len(more.streams) > 0 {
		more.msg = "streams of the sidecar keep more copies than --nats-replicas: give this replica the --nats-replicas the others have; lowering the streams' replicas would keep fewer copies of the log"
		more.fix = fmt.Sprintf("--nats-replicas %d", most)
		out = append(out, more)
	}
	if len(fewer.streams) > 0 {
		fixes := make([]string, len(fewer.streams))
		for i, name := range fewer.streams {
			fixes[i] = fmt.Sprintf("nats stream edit %s --replicas %d", name, replicas)
		}
		fewer.msg = "streams of the sidecar keep fewer copies than --nats-replicas; raise them as the NATS admin user"
		fewer.fix = strings.Join(fixes, "; ")
		out = append(out, fewer)
	}
	return out
}
