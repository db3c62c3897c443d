package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestRegistry_UnansweredRequestFailsWithinTheTimeout: a registry call
// whose request the server never answers (lost with a NATS node that
// died) fails within the JetStream timeout, whatever the caller's
// context: without a deadline, or with one an hour away (a step's). nats.go
// waits for a KV answer until the caller's deadline, and the producer's
// emit, with its step, waited the hour.
func TestRegistry_UnansweredRequestFailsWithinTheTimeout(t *testing.T) {
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Permissions: natsstore.AllPermissions})
	const timeout = 300 * time.Millisecond
	js, deaf := natstest.ConnectDeaf(t, srv, jetstream.WithDefaultTimeout(timeout))
	r := open(t, js, registry.Options{})
	known, _, err := r.EventID(context.Background(), "run-deaf", idemKey(0))
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(context.Context, string) error{
		"event id": func(ctx context.Context, name string) error {
			_, _, err := r.EventID(ctx, "run-deaf-"+name, idemKey(1))
			return err
		},
		"lookup": func(ctx context.Context, _ string) error { _, err := r.Lookup(ctx, "run-deaf", idemKey(0)); return err },
		"adopt": func(ctx context.Context, _ string) error {
			return r.Adopt(ctx, "run-deaf", idemKey(0), known)
		},
	}
	deaf.Store(true)
	t.Cleanup(func() { deaf.Store(false) }) // after the parallel subtests
	storetest.UnansweredCalls(t, calls, registry.ErrUnavailable, 100*timeout)
}
