package membership_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/membership"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// open starts a member on its own connection to srv and closes it when
// the test ends (Close is idempotent).
func open(t *testing.T, srv *natsstore.Embedded, opts membership.Options) *membership.Members {
	t.Helper()
	js := natstest.Connect(t, srv)
	m, err := membership.Open(context.Background(), js, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

// waitLive waits until every member of ms counts exactly want live
// members and knows it (does not own every run).
func waitLive(t *testing.T, want int, ms ...*membership.Members) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, m := range ms {
		for {
			keys, all := m.Live()
			if len(keys) == want && !all {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("member %s: live %v (owns all: %v), want %d live", m.Key(), keys, all, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

var runIDs = func() []string {
	ids := make([]string, 3000)
	for i := range ids {
		ids[i] = fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
	}
	return ids
}()

// owners returns, for each run, the members that own it.
func owners(ms ...*membership.Members) map[string][]int {
	out := map[string][]int{}
	for _, id := range runIDs {
		for i, m := range ms {
			if m.Owns(id) {
				out[id] = append(out[id], i)
			}
		}
	}
	return out
}

func requireOneOwner(t *testing.T, got map[string][]int) {
	t.Helper()
	for _, id := range runIDs {
		if len(got[id]) != 1 {
			t.Fatalf("run %s owned by members %v, want exactly one", id, got[id])
		}
	}
}

func TestMembers_EveryRunHasOneOwnerAndTheSharesAreEven(t *testing.T) {
	_, srv := natstest.Start(t)
	opts := membership.Options{Name: "same-name", Heartbeat: 50 * time.Millisecond, DeadAfter: time.Minute}
	a, b, c := open(t, srv, opts), open(t, srv, opts), open(t, srv, opts)
	waitLive(t, 3, a, b, c)

	got := owners(a, b, c)
	requireOneOwner(t, got)
	share := make([]int, 3)
	for _, o := range got {
		share[o[0]]++
	}
	for i, n := range share {
		// 1,000 expected; a binomial(3000, 1/3) stays within ±130 but
		// with negligible odds.
		if n < 850 || n > 1150 {
			t.Errorf("member %d owns %d of %d runs, want about a third: %v", i, n, len(runIDs), share)
		}
	}
}

func TestMembers_ALeavingMembersRunsMoveAtOnceAndOnlyThey(t *testing.T) {
	_, srv := natstest.Start(t)
	// DeadAfter is long: only Close's delete can make b leave within
	// the wait.
	opts := membership.Options{Heartbeat: 50 * time.Millisecond, DeadAfter: time.Minute}
	a, b, c := open(t, srv, opts), open(t, srv, opts), open(t, srv, opts)
	waitLive(t, 3, a, b, c)
	before := owners(a, b, c)

	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitLive(t, 2, a, c)
	after := owners(a, c)
	requireOneOwner(t, after)
	moved := 0
	for _, id := range runIDs {
		was, is := before[id][0], after[id][0]
		switch {
		case was == 1:
			moved++ // b's run: to a or c
		case (was == 0) != (is == 0):
			t.Fatalf("run %s moved between the members that stayed (from %d)", id, was)
		}
	}
	if moved == 0 {
		t.Fatal("b owned no run")
	}
}

func TestMembers_ADeadMembersRunsMoveAfterDeadAfter(t *testing.T) {
	_, srv := natstest.Start(t)
	opts := membership.Options{Heartbeat: 50 * time.Millisecond, DeadAfter: 500 * time.Millisecond}
	a, c := open(t, srv, opts), open(t, srv, opts)

	// b dies: its connection closes, so its key is never deleted and its
	// heartbeats stop reaching the bucket.
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := membership.Open(context.Background(), js, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	waitLive(t, 3, a, b, c)
	nc.Close()

	waitLive(t, 2, a, c)
	requireOneOwner(t, owners(a, c))

	// b cannot write its heartbeat: it cannot tell whether the others
	// wrote it off, so it owns every run (work done twice, never none).
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, all := b.Live(); all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a member whose heartbeat fails does not own every run")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, id := range runIDs[:100] {
		if !b.Owns(id) {
			t.Fatalf("b, cut off, does not own run %s", id)
		}
	}
}

func TestMembers_ANewMemberIgnoresTheKeysOfTheDead(t *testing.T) {
	_, srv := natstest.Start(t)
	opts := membership.Options{Heartbeat: 50 * time.Millisecond, DeadAfter: time.Minute}
	js := natstest.Connect(t, srv)
	// A member killed -9 left its key behind (it lives for a minute).
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: membership.DefaultBucket, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), "m-dead", []byte(`{"name":"killed"}`)); err != nil {
		t.Fatal(err)
	}
	a := open(t, srv, opts)
	// Until it has seen a heartbeat of every live member, a new member
	// may see fewer members than there are, never a dead one: alone, it
	// owns every run.
	time.Sleep(10 * opts.Heartbeat)
	keys, all := a.Live()
	if len(keys) != 1 || keys[0] != a.Key() || all {
		t.Fatalf("live %v (owns all: %v), want only itself", keys, all)
	}
	for _, id := range runIDs {
		if !a.Owns(id) {
			t.Fatalf("alone, the member does not own run %s", id)
		}
	}
}

func TestMembers_OwnsEveryRunUntilItKnows(t *testing.T) {
	_, srv := natstest.Start(t)
	opts := membership.Options{Heartbeat: time.Hour, DeadAfter: 2 * time.Hour}
	a := open(t, srv, opts)
	b := open(t, srv, opts)
	// No heartbeat tick yet and b's first heartbeat came before a's
	// watch: a does not know b, b may know a; each owns every run that
	// it cannot place, so every run has an owner.
	for id, o := range owners(a, b) {
		if len(o) == 0 {
			t.Fatalf("run %s has no owner", id)
		}
	}
}

func TestOpen_RefusesADeadAfterShorterThanTwoHeartbeats(t *testing.T) {
	js, _ := natstest.Start(t)
	_, err := membership.Open(context.Background(), js, membership.Options{Heartbeat: time.Second, DeadAfter: time.Second})
	if err == nil || !errors.Is(err, membership.ErrInvalidOptions) {
		t.Fatalf("err = %v, want ErrInvalidOptions", err)
	}
}

func TestMembers_AMemberWhoseHeartbeatIsRefusedOwnsEveryRun(t *testing.T) {
	js, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Permissions: natsstore.AllPermissions})
	opts := membership.Options{Heartbeat: 50 * time.Millisecond, DeadAfter: 500 * time.Millisecond}
	a, b := open(t, srv, opts), open(t, srv, opts)
	waitLive(t, 2, a, b)

	// An administrator seals the bucket's stream: every heartbeat is
	// refused while the watch goes on delivering.
	ctx := context.Background()
	st, err := js.Stream(ctx, "KV_"+membership.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Sealed = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, m := range []*membership.Members{a, b} {
		for {
			if _, all := m.Live(); all {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("a member whose heartbeats are refused does not own every run")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	requireOwned := func(m *membership.Members) {
		for _, id := range runIDs {
			if !m.Owns(id) {
				t.Fatalf("member %s does not own run %s", m.Key(), id)
			}
		}
	}
	requireOwned(a)
	requireOwned(b)
}
