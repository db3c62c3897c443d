package httpapi_test

import (
	"context"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// TestKVReplies_BoundFitsTheServersStorage: JetStream reserves a bounded
// stream's MaxBytes out of the server's storage when the stream is
// created, and refuses a bound larger than what is left. On a small
// volume (a server that may store 64 MiB) the default bound of 1 GiB
// must not keep serve from starting: the bucket is created with the
// largest bound that fits, and a warning says so.
func TestKVReplies_BoundFitsTheServersStorage(t *testing.T) {
	ctx := context.Background()
	const store = 64 << 20
	srv, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		JetStreamMaxStore: store, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(2 * time.Minute) {
		t.Fatal("nats-server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	if _, err := httpapi.OpenKVReplies(ctx, js, httpapi.KVRepliesOptions{TTL: time.Hour, Log: zap.New(core)}); err != nil {
		t.Fatalf("open the replies' bucket with the default bound on a server that stores %d bytes: %v", store, err)
	}
	got := repliesBytes(t, js).Config.MaxBytes
	if got <= 0 || got > store {
		t.Fatalf("the replies' bucket has the bound %d, want one that fits the server's %d bytes", got, store)
	}
	if logs.FilterMessageSnippet("fit").Len() != 1 {
		t.Errorf("warnings %v, want one saying the bound was lowered to fit the server's storage", logs.All())
	}
	// A restart opens the bucket it made, as it is: asking the server to
	// reserve a bound again, beside the one the bucket holds, was refused
	// (insufficient storage resources) and serve could not start again.
	if _, err := httpapi.OpenKVReplies(ctx, js, httpapi.KVRepliesOptions{TTL: time.Hour, Log: zap.New(core)}); err != nil {
		t.Fatalf("open the replies' bucket again, as a restart does: %v", err)
	}
	if again := repliesBytes(t, js).Config.MaxBytes; again != got {
		t.Fatalf("the bucket's bound went from %d to %d at a restart", got, again)
	}
}
