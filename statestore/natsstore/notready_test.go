package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// TestNotReady: an open that failed because the NATS cluster is not
// ready yet may succeed a moment later; one that failed for a reason time
// does not fix will not.
func TestNotReady(t *testing.T) {
	unavailable := func(err error) error {
		return &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "read the log's watermark", Err: err}
	}
	apiErr := func(code jetstream.ErrorCode) error {
		return fmt.Errorf("open bucket SIDECAR_RUNS: %w", &jetstream.APIError{Code: 503, ErrorCode: code, Description: "x"})
	}
	permission := fmt.Errorf("%w: Permissions Violation for Publish to \"$JS.API.STREAM.CREATE.SIDECAR_EVENTS\"", nats.ErrPermissionViolation)
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"NoResponders", unavailable(nats.ErrNoResponders), true},
		{"Timeout", fmt.Errorf("open runs: %w", nats.ErrTimeout), true},
		{"RequestDeadline", unavailable(context.DeadlineExceeded), true},
		{"Reconnecting", unavailable(nats.ErrConnectionReconnecting), true},
		{"ClusterNotAvailable", apiErr(10008), true},
		{"NotLeader", apiErr(10009), true},
		{"NoPeersYet", apiErr(10005), true},
		{"MemberChange", apiErr(10202), true},
		{"JetStreamNotEnabled", fmt.Errorf("open: %w", jetstream.ErrJetStreamNotEnabled), false},
		{"StreamNotFound", fmt.Errorf("guard: %w", jetstream.ErrStreamNotFound), false},
		{"JustCreated", fmt.Errorf("open SIDECAR_CONTROL_REPLIES: %w", fmt.Errorf("%w: bucket SIDECAR_CONTROL_REPLIES was just created: %w", natsstore.ErrNotReady, jetstream.ErrBucketNotFound)), true},
		{"StreamConfigDiffers", apiErr(10058), false},
		{"Damaged", &statestore.Error{Code: statestore.CodeStoreDamaged, Message: "stream SIDECAR_EVENTS exists but deny_delete is off"}, false},
		{"DamagedAfterTimeout", fmt.Errorf("%w: %w", &statestore.Error{Code: statestore.CodeStoreDamaged, Message: "rolled back"}, nats.ErrTimeout), false},
		{"PermissionDenied", fmt.Errorf("%w (%w)", unavailable(context.DeadlineExceeded), permission), false},
		{"Authorization", fmt.Errorf("connect: %w", nats.ErrAuthorization), false},
		{"Canceled", unavailable(context.Canceled), false},
		{"Other", errors.New("listen on 127.0.0.1:8787: address already in use"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := natsstore.NotReady(c.err); got != c.want {
				t.Errorf("natsstore.NotReady(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}
