package natsstore

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// JetStream API error codes that mean "not now" on a cluster that is
// starting or electing leaders.
const (
	jsClusterNoPeers        = 10005 // no suitable peers for placement (not all peers known yet)
	jsClusterNotAvail       = 10008 // JetStream system temporarily unavailable
	jsClusterNotLeader      = 10009 // JetStream cluster can not handle request
	jsClusterMemberInflight = 10202 // cluster member change is in progress
)

// NotReady reports whether err, from opening streams and buckets on a NATS
// cluster, means the cluster is not ready yet, so that the same open may
// succeed a moment later: the cluster did not answer (no responders: no
// JetStream meta leader, or a stream just created whose replicas do not
// serve requests yet; a request timed out; the connection is
// reconnecting), said it is electing a leader, or did not know a stream
// just created yet (ErrNotReady). Everything else is not:
// permissions, a damaged or rolled-back store, a misconfiguration, a
// refused connection, a cancelled context.
func NotReady(err error) bool {
	if errors.Is(err, nats.ErrPermissionViolation) || errors.Is(err, nats.ErrAuthorization) ||
		errors.Is(err, statestore.ErrDamaged) || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, ErrNotReady) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrConnectionReconnecting) {
		return true
	}
	var jsErr jetstream.JetStreamError
	if errors.As(err, &jsErr) && jsErr.APIError() != nil {
		switch jsErr.APIError().ErrorCode {
		case jsClusterNoPeers, jsClusterNotAvail, jsClusterNotLeader, jsClusterMemberInflight:
			return true
		}
	}
	return false
}
