package natsstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// overlong is longer than a NATS server's control line (4 KiB): a subject
// or KV key built from it makes the server close the connection.
var overlong = strings.Repeat("k", 5000)

// requireConnected fails t unless js's connection is still up: a round
// trip to the server succeeds (a server that closed it for a too long
// control line answers nothing more).
func requireConnected(t *testing.T, js jetstream.JetStream, after string) {
	t.Helper()
	nc := js.Conn()
	if err := nc.FlushTimeout(10 * time.Second); err != nil || nc.Status() != nats.CONNECTED {
		t.Fatalf("after %s the connection is %v (flush: %v): the store is cut off the server", after, nc.Status(), err)
	}
}

// TestStore_OverlongRunIDLeavesTheConnection: reading a run whose id no
// write could ever have used (longer than the id limit, longer than the
// server's control line) finds nothing and keeps the store connected. A
// snapshot bucket's key built from such an id used to close the
// connection for good.
func TestStore_OverlongRunIDLeavesTheConnection(t *testing.T) {
	js, _ := natstest.Start(t)
	ctx := context.Background()
	s, err := natsstore.Open(ctx, js, natsstore.Options{SnapshotBucket: natsstore.DefaultSnapshotBucket, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	for _, id := range []string{overlong, strings.Repeat("é", statestore.MaxIDBytes)} {
		if _, err := s.ProjectSnapshot(ctx, id); !errors.Is(err, statestore.ErrNotFound) {
			t.Errorf("ProjectSnapshot(%d bytes): %v, want ErrNotFound", len(id), err)
		}
		requireConnected(t, js, "ProjectSnapshot")
		if _, err := s.GetSnapshot(ctx, id); !errors.Is(err, statestore.ErrNotFound) {
			t.Errorf("GetSnapshot(%d bytes): %v, want ErrNotFound", len(id), err)
		}
		requireConnected(t, js, "GetSnapshot")
		if recs, err := s.Fetch(ctx, id, 0, 0); err != nil || len(recs) != 0 {
			t.Errorf("Fetch(%d bytes): %d records, %v; want none", len(id), len(recs), err)
		}
		requireConnected(t, js, "Fetch")
		if _, err := s.Lookup(ctx, id, strings.Repeat("a", 64)); !errors.Is(err, statestore.ErrNotFound) {
			t.Errorf("Lookup(%d bytes): %v, want ErrNotFound", len(id), err)
		}
		requireConnected(t, js, "Lookup")
	}
	if _, err := s.Append(ctx, storetest.Event("run-after-long-ids", statestore.RunStarted, "")); err != nil {
		t.Fatalf("append after the long reads: %v", err)
	}
}

// TestOpenBucket_RefusesOverlongKeys: every bucket the sidecar opens
// refuses a key longer than MaxKeyBytes before it reaches the server, with
// ErrKeyTooLong, whatever builds the key; the connection stays up.
func TestOpenBucket_RefusesOverlongKeys(t *testing.T) {
	js, _ := natstest.Start(t)
	ctx := context.Background()
	kv, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "TEST_BOUNDS"})
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]func(key string) error{
		"Get":    func(k string) error { _, err := kv.Get(ctx, k); return err },
		"Put":    func(k string) error { _, err := kv.Put(ctx, k, []byte("v")); return err },
		"Create": func(k string) error { _, err := kv.Create(ctx, k, []byte("v")); return err },
		"Update": func(k string) error { _, err := kv.Update(ctx, k, []byte("v"), 1); return err },
		"Delete": func(k string) error { return kv.Delete(ctx, k) },
		"Purge":  func(k string) error { return kv.Purge(ctx, k) },
		"GetRevision": func(k string) error {
			_, err := kv.GetRevision(ctx, k, 1)
			return err
		},
		"History": func(k string) error { _, err := kv.History(ctx, k); return err },
		"Watch": func(k string) error {
			w, err := kv.Watch(ctx, k)
			if err == nil {
				w.Stop()
			}
			return err
		},
	}
	long := strings.Repeat("k", natsstore.MaxKeyBytes+1)
	for name, op := range ops {
		for _, k := range []string{long, overlong} {
			if err := op(k); !errors.Is(err, natsstore.ErrKeyTooLong) {
				t.Errorf("%s of a %d-byte key: %v, want ErrKeyTooLong", name, len(k), err)
			}
			requireConnected(t, js, name)
		}
	}
	ok := strings.Repeat("k", natsstore.MaxKeyBytes)
	if _, err := kv.Put(ctx, ok, []byte("v")); err != nil {
		t.Fatalf("Put of a %d-byte key: %v", len(ok), err)
	}
	if e, err := kv.Get(ctx, ok); err != nil || string(e.Value()) != "v" {
		t.Fatalf("Get of a %d-byte key: %v", len(ok), err)
	}
}
