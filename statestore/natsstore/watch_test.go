package natsstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// TestWatch_AStalledConsumer: the server keeps a KV watch's consumer but
// it delivers nothing (paused on the server here, as an overloaded server
// left an ordered consumer for good under a steady load). A key put after
// that still reaches the watch, once, through a new consumer from the
// revision after the last one delivered, and the initial-values marker is
// not delivered again.
func TestWatch_AStalledConsumer(t *testing.T) {
	ctx := context.Background()
	js := connect(t, startServer(t, t.TempDir()))
	kv, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "STALL", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "a", "1"); err != nil {
		t.Fatal(err)
	}
	kw, err := natsstore.Watch(ctx, kv, jetstream.AllKeys, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = kw.Stop() }()
	next := func() (jetstream.KeyValueEntry, bool) {
		t.Helper()
		select {
		case e, ok := <-kw.Updates():
			if !ok {
				t.Fatal("the watch ended")
			}
			return e, true
		case <-time.After(2 * time.Minute):
			return nil, false
		}
	}
	if e, ok := next(); !ok || e == nil || e.Key() != "a" {
		t.Fatalf("first update %v, want key a", e)
	}
	if e, ok := next(); !ok || e != nil {
		t.Fatalf("second update %v, want the initial-values marker", e)
	}
	st, err := js.Stream(ctx, "KV_STALL")
	if err != nil {
		t.Fatal(err)
	}
	paused := natstest.StallConsumers(t, st)
	if paused != 1 {
		t.Fatalf("paused %d consumers, want the watch's one", paused)
	}
	rev, err := kv.PutString(ctx, "b", "2")
	if err != nil {
		t.Fatal(err)
	}
	e, ok := next()
	if !ok {
		t.Fatal("the key put while the watch's consumer was stalled never arrived")
	}
	if e == nil || e.Key() != "b" || e.Revision() != rev {
		t.Fatalf("update %v, want key b at revision %d", e, rev)
	}
	// Once: the next update is the next put, not b again nor a marker.
	rev, err = kv.PutString(ctx, "c", "3")
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := next(); !ok || e == nil || e.Key() != "c" || e.Revision() != rev {
		t.Fatalf("update %v after b, want key c at revision %d", e, rev)
	}
}

// TestWatch_ReopensOnceForTheSameLastRevision: a watch of some keys sees
// the bucket's last revision move past it with another key. It opens a
// new consumer once for that revision, not again every check, and still
// delivers its own keys once.
func TestWatch_ReopensOnceForTheSameLastRevision(t *testing.T) {
	ctx := context.Background()
	js := connect(t, startServer(t, t.TempDir()))
	kv, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "OTHERKEYS", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	kw, err := natsstore.Watch(ctx, kv, "a.>", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = kw.Stop() }()
	if e := <-kw.Updates(); e != nil {
		t.Fatalf("first update %v, want the initial-values marker", e)
	}
	st, err := js.Stream(ctx, "KV_OTHERKEYS")
	if err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		var names []string
		for name := range st.ConsumerNames(ctx).Name() {
			names = append(names, name)
		}
		return names
	}
	consumer := func() string {
		t.Helper()
		now := names()
		if len(now) != 1 {
			t.Fatalf("consumers %v, want the watch's one", now)
		}
		return now[0]
	}
	first := consumer()
	if _, err := kv.PutString(ctx, "b", "1"); err != nil {
		t.Fatal(err)
	}
	// While the watch moves to a new consumer the old one may still be
	// listed for a moment: wait for one consumer that is not the first.
	deadline := time.Now().Add(2 * time.Minute)
	second := first
	for second == first && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if now := names(); len(now) == 1 {
			second = now[0]
		}
	}
	if second == first {
		t.Fatal("the watch never checked the bucket's last revision")
	}
	// Two more checks' worth of idle time: the same last revision must
	// not make it open another consumer.
	time.Sleep(25 * time.Second)
	if now := consumer(); now != second {
		t.Fatalf("the watch opened consumer %s after %s for the same last revision", now, second)
	}
	rev, err := kv.PutString(ctx, "a.x", "2")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-kw.Updates():
		if e == nil || e.Key() != "a.x" || e.Revision() != rev {
			t.Fatalf("update %v, want a.x at revision %d", e, rev)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("a.x never arrived")
	}
}
