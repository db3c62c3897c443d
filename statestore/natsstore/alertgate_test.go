package natsstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

type countingSink struct{ n atomic.Int32 }

func (c *countingSink) InvalidTransition(context.Context, statestore.InvalidTransitionAlert) {
	c.n.Add(1)
}

func TestAlertGate_OncePerEventAcrossReplicasAndRestarts(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv := startServer(t, dir)
	js := connect(t, srv)
	store := openUnique(t, js)
	for _, w := range []*statestore.RunEventWrite{
		storetest.Event("run.a*", statestore.RunStarted, ""), storetest.Event("run.a*", statestore.RunCompleted, ""),
		storetest.Event("run.a*", statestore.RunPaused, ""), // invalid: the run is COMPLETED
	} {
		if _, err := store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	sink := &countingSink{}
	// Four replicas, each with its own connection, gate and projector, racing.
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		gate, err := natsstore.OpenAlertGate(ctx, connect(t, srv), natsstore.AlertGateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p := statestore.NewProjector(store, statestore.ProjectorOptions{Gate: gate, Alerts: sink})
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.Project(ctx, "run.a*"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got := sink.n.Load(); got != 1 {
		t.Fatalf("%d alerts from 4 replicas, want 1", got)
	}
	invalid := mustInvalidEventID(t, store)
	// Restart the server on the same data dir: the claim survives.
	srv.Shutdown()
	srv.WaitForShutdown()
	srv = startServer(t, dir)
	gate, err := natsstore.OpenAlertGate(ctx, connect(t, srv), natsstore.AlertGateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := gate.First(ctx, "run.a*", invalid)
	if err != nil || first {
		t.Fatalf("after restart: first=%v err=%v, want a claimed alert", first, err)
	}
	if first, err := gate.First(ctx, "run.a*", uuid.NewString()); err != nil || !first {
		t.Fatalf("a new eventId: first=%v err=%v", first, err)
	}
	if first, err := gate.First(ctx, "weird run", "not a uuid | at all"); err != nil || !first {
		t.Fatalf("a forged eventId must still be claimable: first=%v err=%v", first, err)
	}
}

func mustInvalidEventID(t *testing.T, s *natsstore.Store) string {
	t.Helper()
	snap, err := statestore.NewProjector(s, statestore.ProjectorOptions{}).Project(context.Background(), "run.a*")
	if err != nil || len(snap.InvalidEvents) != 1 {
		t.Fatalf("snapshot: %v %v", snap, err)
	}
	return snap.InvalidEvents[0]
}
