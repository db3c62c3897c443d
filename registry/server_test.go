package registry_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/registry"
)

// startServer runs an embedded JetStream server on 127.0.0.1 with a random
// port and its store in dir. Cleanup shuts it down; shutting it down earlier
// is fine.
func startServer(tb testing.TB, dir string) *server.Server {
	tb.Helper()
	return startServerSync(tb, dir, false)
}

// startServerSync is startServer; with syncAlways the server fsyncs every
// write before it acknowledges it, as the sidecar's embedded server does.
func startServerSync(tb testing.TB, dir string, syncAlways bool) *server.Server {
	tb.Helper()
	s, err := server.NewServer(&server.Options{
		Host:       "127.0.0.1",
		Port:       -1,
		JetStream:  true,
		StoreDir:   dir,
		SyncAlways: syncAlways,
		NoLog:      true,
		NoSigs:     true,
	})
	if err != nil {
		tb.Fatalf("new server: %v", err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		tb.Fatal("nats server not ready after 10s")
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// connect opens a new client connection to s; Cleanup closes it.
func connect(tb testing.TB, s *server.Server) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// open opens a Registry with a test logger unless opts has a logger.
func open(tb testing.TB, js jetstream.JetStream, opts registry.Options) *registry.Registry {
	tb.Helper()
	if opts.Logger == nil {
		if t, ok := tb.(*testing.T); ok {
			opts.Logger = zaptest.NewLogger(t)
		}
	}
	r, err := registry.Open(ctx(tb), js, opts)
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	return r
}

// newTestRegistry starts a server and returns a Registry on it with the
// default bucket, plus the connection's JetStream handle.
func newTestRegistry(t *testing.T) (*registry.Registry, *nats.Conn, jetstream.JetStream, *server.Server) {
	t.Helper()
	s := startServer(t, t.TempDir())
	nc, js := connect(t, s)
	return open(t, js, registry.Options{}), nc, js, s
}

func ctx(tb testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return c
}

// idemKey returns a distinct valid idempotencyKey for i.
func idemKey(i int) string {
	sum := sha256.Sum256([]byte("key-" + strconv.Itoa(i)))
	return hex.EncodeToString(sum[:])
}

// rawEntry reads the stored value of (runID, idempotencyKey) directly from
// the bucket.
func rawEntry(t *testing.T, js jetstream.JetStream, runID, idempotencyKey string) jetstream.KeyValueEntry {
	t.Helper()
	kv, err := js.KeyValue(ctx(t), registry.DefaultBucket)
	if err != nil {
		t.Fatalf("bind bucket: %v", err)
	}
	key, err := registry.Key(runID, idempotencyKey)
	if err != nil {
		t.Fatalf("key: %v", err)
	}
	e, err := kv.Get(ctx(t), key)
	if err != nil {
		t.Fatalf("kv get %s: %v", key, err)
	}
	return e
}
