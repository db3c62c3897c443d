package registry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
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
	n := 0
	calls := map[string]func(context.Context) error{
		"event id": func(ctx context.Context) error {
			n++
			_, _, err := r.EventID(ctx, "run-deaf", idemKey(n))
			return err
		},
		"lookup": func(ctx context.Context) error { _, err := r.Lookup(ctx, "run-deaf", idemKey(0)); return err },
		"adopt": func(ctx context.Context) error {
			return r.Adopt(ctx, "run-deaf", idemKey(0), known)
		},
	}
	deaf.Store(true)
	defer deaf.Store(false)
	for name, call := range calls {
		for _, deadline := range []time.Duration{0, time.Hour} {
			t.Run(fmt.Sprintf("%s, deadline %v", name, deadline), func(t *testing.T) {
				ctx := context.Background()
				if deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, deadline)
					defer cancel()
				}
				done := make(chan error, 1)
				go func() { done <- call(ctx) }()
				select {
				case err := <-done:
					if !errors.Is(err, registry.ErrUnavailable) {
						t.Fatalf("unanswered request: %v, want ErrUnavailable", err)
					}
				case <-time.After(100 * timeout):
					t.Fatalf("a request the server never answered still waits after %v (the timeout is %v)", 100*timeout, timeout)
				}
			})
		}
	}
}
