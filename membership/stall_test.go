package membership_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/membership"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestMembers_AStalledWatchSeesANewMember: the server keeps a member's
// watch consumer but it delivers nothing (paused on the server here, as
// an overloaded server left one for good). A member that joins after that
// still becomes live in its view.
func TestMembers_AStalledWatchSeesANewMember(t *testing.T) {
	js, srv := natstest.Start(t)
	ctx := context.Background()
	opts := membership.Options{Heartbeat: 50 * time.Millisecond, DeadAfter: time.Minute}
	a := open(t, srv, opts)
	waitLive(t, 1, a)
	st, err := js.Stream(ctx, "KV_"+membership.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	paused := natstest.StallConsumers(t, st)
	if paused != 1 {
		t.Fatalf("paused %d consumers, want a's one", paused)
	}
	b := open(t, srv, opts)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		keys, _ := a.Live()
		if slices.Contains(keys, b.Key()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a counts %v live, never the member that joined while its watch was stalled", keys)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
