package runlist_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestList_FirstPageReadsNoRemovedRows: a replica whose window (3 rows)
// let finished rows go lists the one that retention did not forget, from
// the bucket, whether the replica still knows which rows it let go (17 of
// them) or no longer does (37: more than it names); once retention forgot
// every finished run (the bucket holds their purge markers), a replica
// that knows comes up with the first page from memory alone: its
// connection receives none of the markers; so does a replica started
// after them, from the second page it lists on. The row kept may be one that
// came into the bucket beyond the window already (its run, the oldest,
// finished last).
func TestList_FirstPageReadsNoRemovedRows(t *testing.T) {
	for _, c := range []struct {
		name           string
		finished, keep int  // keep: the finished run forgotten last
		late           bool // the run kept finishes after the others
		readsNoMarkers bool
	}{
		{"known", 20, 0, false, true},
		{"finished beyond the window", 20, 0, true, true},
		{"too many to name", 40, 35, false, false},
	} {
		t.Run(c.name, func(t *testing.T) { firstPageAfterRetention(t, c.finished, c.keep, c.late, c.readsNoMarkers) })
	}
}

func firstPageAfterRetention(t *testing.T, nFinished, keep int, late, readsNoMarkers bool) {
	ctx := context.Background()
	js, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Logger: zaptest.NewLogger(t)})
	store, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	open := func(js jetstream.JetStream, own bool) *runlist.List {
		l, err := runlist.Open(ctx, js, runlist.Options{Log: store, Owner: owner(own), Poll: 20 * time.Millisecond,
			MaxFinished: 3, MarkerTTL: time.Hour, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(ctx) })
		return l
	}
	follower := open(js, true)
	rjs := natstest.Connect(t, srv)
	replica := open(rjs, false)

	var finished, running []string // oldest first
	for i := range nFinished + 2 {
		id := fmt.Sprintf("run-%02d", i)
		evs := []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, "")}
		if i < nFinished {
			if !late || i != keep {
				evs = append(evs, storetest.Event(id, statestore.RunCompleted, ""))
			}
			finished = append(finished, id)
		} else {
			running = append(running, id)
		}
		for _, w := range evs {
			if _, err := store.Append(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
	}
	if late {
		if _, err := store.Append(ctx, storetest.Event(finished[keep], statestore.RunCompleted, "")); err != nil {
			t.Fatal(err)
		}
	}
	waitIndexed(t, follower)
	waitIndexed(t, replica)

	// lists waits (minutes at most) until the replica's first page is
	// want, newest first.
	listsOn := func(replica *runlist.List, want []string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			p, err := replica.List(runlist.Filter{}, 50, "")
			if err != nil {
				t.Fatal(err)
			}
			if slices.Equal(ids(p.Runs), want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the first page is %v, want %v", ids(p.Runs), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	lists := func(want []string) { t.Helper(); listsOn(replica, want) }
	newestFirst := func(s ...[]string) []string {
		out := slices.Concat(s...)
		slices.Reverse(out)
		return out
	}
	lists(newestFirst(finished, running))
	// The follower writes the list's floor (a replica that starts later
	// reads from it).
	kv, err := js.KeyValue(ctx, runlist.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, err := kv.Get(ctx, "floor"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the follower wrote no floor")
		}
	}

	// Retention forgets every finished run but one beyond the window (in
	// the bucket only): the page still shows it.
	for i, id := range finished {
		if i == keep {
			continue
		}
		if err := follower.ForgetRun(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	lists(newestFirst(finished[keep:keep+1], running))

	// And that one too: the page holds the open runs only.
	if err := follower.ForgetRun(ctx, finished[keep]); err != nil {
		t.Fatal(err)
	}
	lists(newestFirst(running))
	if !readsNoMarkers {
		return
	}
	fromMemory := func(replica *runlist.List, rjs jetstream.JetStream) {
		t.Helper()
		// The connection's count takes the watchers' deliveries too (the
		// purge markers' reach the mirror a moment later): the fewest
		// of three reads is the page's own.
		nc := rjs.Conn()
		var p *runlist.Page
		got := uint64(math.MaxUint64)
		for range 3 {
			before := nc.Stats().InMsgs
			var err error
			if p, err = replica.List(runlist.Filter{}, 50, ""); err != nil {
				t.Fatal(err)
			}
			got = min(got, nc.Stats().InMsgs-before)
			time.Sleep(100 * time.Millisecond)
		}
		if got >= uint64(nFinished) {
			t.Fatalf("the first page %v received %d messages (the bucket holds %d purge markers); want it read from memory", ids(p.Runs), got, nFinished)
		}
		if !slices.Equal(ids(p.Runs), newestFirst(running)) {
			t.Fatalf("the first page is %v, want %v", ids(p.Runs), newestFirst(running))
		}
	}
	fromMemory(replica, rjs)

	// A replica that starts now, from the list's floor, has not read the
	// rows beyond it: its first page reads the bucket, finds none of them,
	// and the next page comes from memory.
	ljs := natstest.Connect(t, srv)
	later := open(ljs, false)
	waitIndexed(t, later)
	listsOn(later, newestFirst(running))
	fromMemory(later, ljs)
}
