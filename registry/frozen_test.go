package registry_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestPostgres_FrozenServerFailsWithinTheBound: the PostgreSQL host stops
// answering while its connections stay open (every process of the cluster
// stopped). Each call of the registry fails with ErrUnavailable within the
// bound it was given, whatever its caller's deadline: an eventId is asked
// for under a run's start lock, with a step's deadline that can be an
// hour away.
func TestPostgres_FrozenServerFailsWithinTheBound(t *testing.T) {
	cl := pgtest.Own(t)
	const timeout, maxWait = 300 * time.Millisecond, time.Second
	store, err := pgstore.Open(context.Background(), cl.URL, pgstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	r, err := registry.OpenPostgres(context.Background(), store.Pool(), registry.PostgresOptions{Logger: zaptest.NewLogger(t), Timeout: timeout, MaxWait: maxWait})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.EventID(context.Background(), "run.frozen", idemKey(1)); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(ctx context.Context, name string) error{
		"event id": func(ctx context.Context, name string) error {
			_, _, err := r.EventID(ctx, "run.frozen."+name, idemKey(2))
			return err
		},
		"adopt": func(ctx context.Context, name string) error {
			return r.Adopt(ctx, "run.frozen.adopt."+name, idemKey(3), "6f1c3a52-1b2f-4c3d-9e4f-5a6b7c8d9e0f")
		},
		"lookup": func(ctx context.Context, _ string) error {
			_, err := r.Lookup(ctx, "run.frozen", idemKey(1))
			return err
		},
	}
	cl.Freeze(t) // thawed when the test ends, after its parallel subtests
	storetest.UnansweredCalls(t, calls, registry.ErrUnavailable, 30*time.Second)
}
