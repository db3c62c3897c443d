package runlist_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestList_ForgetRun runs a real retention pass with the list as a
// Forgetter, the sidecar's own NATS user holding the list: the finished
// runs' rows leave the bucket and the memory of both replicas (the other
// learns by its watch), the open runs' rows stay, forgetting again is
// nothing, and the markers expire so that the bucket holds only what is
// open.
func TestList_ForgetRun(t *testing.T) {
	ctx := context.Background()
	js, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Logger: zaptest.NewLogger(t)})
	store, err := natsstore.Open(ctx, js, natsstore.Options{Removable: true, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	open := func(js jetstream.JetStream, own bool) *runlist.List {
		l, err := runlist.Open(ctx, js, runlist.Options{Log: store, Owner: owner(own), Poll: 20 * time.Millisecond, MarkerTTL: time.Second, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(ctx) })
		return l
	}
	a, b := open(js, true), open(natstest.Connect(t, srv), false)

	var finished, running []string
	for i := range 12 {
		id := fmt.Sprintf("run-%02d", i)
		evs := []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""), storetest.Event(id, statestore.StepStarted, "s1")}
		if i%3 != 0 {
			evs = append(evs, storetest.Event(id, statestore.StepCompleted, "s1"), storetest.Event(id, statestore.RunCompleted, ""))
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
	waitIndexed(t, a)
	waitIndexed(t, b)
	for _, l := range []*runlist.List{a, b} {
		if got := ids(allRows(t, l, runlist.Filter{}, 5)); len(got) != 12 {
			t.Fatalf("listed %d runs before retention, want 12", len(got))
		}
	}

	// A real pass: archive, forget (the list), remove from the log.
	nc, err := srv.ConnectRetention()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	rjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	rm, err := natsstore.OpenRemover(ctx, rjs, natsstore.RemoverOptions{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	arch, err := archive.Open(ctx, archive.NewDir(t.TempDir()), archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := retention.New(store, arch, rm, retention.Options{
		RetainFinished: time.Hour, Forgetters: []retention.Forgetter{a}, Logger: zaptest.NewLogger(t),
		Now: func() time.Time { return time.Now().Add(2 * time.Hour) },
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Removed != len(finished) {
		t.Fatalf("removed %d runs, want %d", res.Removed, len(finished))
	}

	// Both replicas drop the rows: the owner and the one that only
	// watches the bucket.
	for name, l := range map[string]*runlist.List{"owner": a, "other replica": b} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := ids(allRows(t, l, runlist.Filter{}, 5))
			slices.Sort(got)
			if slices.Equal(got, running) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s lists %v after retention, want only the open runs %v", name, got, running)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Forgetting again, or a run the list never had, is nothing.
	for _, id := range []string{finished[0], "never-was"} {
		if err := a.ForgetRun(ctx, id); err != nil {
			t.Fatalf("ForgetRun(%s) again: %v", id, err)
		}
	}
	// The markers expire: the bucket keeps the open runs' rows, the
	// cursor and the step durations, nothing of the forgotten runs.
	st, err := js.Stream(ctx, "KV_"+runlist.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, id := range running {
		want = append(want, "$KV."+runlist.DefaultBucket+".run."+natsstore.RunToken(id))
	}
	slices.Sort(want)
	deadline := time.Now().Add(15 * time.Second)
	for {
		// The rows' subjects, read from the stream (no consumer: markers
		// expire meanwhile).
		info, err := st.Info(ctx, jetstream.WithSubjectFilter("$KV."+runlist.DefaultBucket+".run.>"))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for subj := range info.State.Subjects {
			got = append(got, subj)
		}
		slices.Sort(got)
		if slices.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bucket keeps rows or markers %v, want only the open runs' %v", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A restarted replica (a new watch) lists the open runs only.
	c := open(natstest.Connect(t, srv), false)
	waitIndexed(t, c)
	got := ids(allRows(t, c, runlist.Filter{}, 0))
	slices.Sort(got)
	if !slices.Equal(got, running) {
		t.Fatalf("a new replica lists %v, want %v", got, running)
	}
}

// switchOwner is an Owner that can start owning the list later.
type switchOwner struct{ owns atomic.Bool }

func (o *switchOwner) Owns(string) bool { return o.owns.Load() }

// TestList_ForgetRunBeforeTheListReadTheLog: retention removes due runs
// from a log the list has not read yet (a generator's, a restored one, a
// new replica's), without waiting for the list to include the log; once
// the list has read the whole log, it holds no row of a removed run and a
// row of every run still there.
func TestList_ForgetRunBeforeTheListReadTheLog(t *testing.T) {
	ctx := context.Background()
	js, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Logger: zaptest.NewLogger(t)})
	store, err := natsstore.Open(ctx, js, natsstore.Options{Removable: true, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var finished, running []string
	for i := range 9 {
		id := fmt.Sprintf("unread-%02d", i)
		evs := []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""), storetest.Event(id, statestore.StepStarted, "s1")}
		if i%3 != 0 {
			evs = append(evs, storetest.Event(id, statestore.StepCompleted, "s1"), storetest.Event(id, statestore.RunCompleted, ""))
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
	// The list has not read the log: no replica follows it yet.
	own := &switchOwner{}
	l, err := runlist.Open(ctx, js, runlist.Options{Log: store, Owner: own, Poll: 20 * time.Millisecond,
		Timeout: 2 * time.Second, MarkerTTL: time.Minute, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(ctx) })

	nc, err := srv.ConnectRetention()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	rjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	rm, err := natsstore.OpenRemover(ctx, rjs, natsstore.RemoverOptions{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	arch, err := archive.Open(ctx, archive.NewDir(t.TempDir()), archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := retention.New(store, arch, rm, retention.Options{
		RetainFinished: time.Hour, Forgetters: []retention.Forgetter{l}, Logger: zaptest.NewLogger(t),
		Now: func() time.Time { return time.Now().Add(2 * time.Hour) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(ctx) })
	res, err := r.Pass(ctx)
	if err != nil {
		t.Fatalf("a pass on a log the list has not read: %v", err)
	}
	if res.Removed != len(finished) {
		t.Fatalf("removed %d runs, want %d", res.Removed, len(finished))
	}

	// The log moves on (a log whose last records were removed before the
	// list read them stays "not included" until its next record: the
	// list's cursor moves with the records it reads), and the list reads
	// it now: the open runs are listed, the removed ones are not, in
	// memory or in the bucket.
	later := "unread-later"
	if _, err := store.Append(ctx, storetest.Event(later, statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	running = append(running, later)
	own.owns.Store(true)
	waitIndexed(t, l)
	got := ids(allRows(t, l, runlist.Filter{}, 0))
	slices.Sort(got)
	if !slices.Equal(got, running) {
		t.Fatalf("the list holds %v once it read the log, want only the runs still there %v", got, running)
	}
	for _, id := range finished {
		if has, err := l.HasRow(ctx, id); err != nil || has {
			t.Fatalf("HasRow(%s) of a removed run = %v, %v; want false", id, has, err)
		}
	}
}
