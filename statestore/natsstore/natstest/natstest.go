// Package natstest starts a real embedded NATS server with JetStream for
// tests and benchmarks of the packages built on it, and stops it when the
// test ends.
package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// Start runs an embedded server with its store in a temporary directory,
// connects to it in-process, and returns the connection's JetStream and the
// server (to restart it). The server has no TCP listener and gives the
// sidecar's user the least privilege serve gives it. Both end with tb.
func Start(tb testing.TB) (jetstream.JetStream, *natsstore.Embedded) {
	tb.Helper()
	return StartIn(tb, tb.TempDir(), natsstore.EmbeddedConfig{})
}

// StartIn is Start with the store in dir and the rest of cfg (DataDir is
// set here). Set cfg.Listen ("127.0.0.1:0") and cfg.Password for a server
// that other processes reach through Embedded.URL.
func StartIn(tb testing.TB, dir string, cfg natsstore.EmbeddedConfig) (jetstream.JetStream, *natsstore.Embedded) {
	tb.Helper()
	cfg.DataDir = dir
	srv, err := natsstore.StartEmbedded(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Shutdown)
	return Connect(tb, srv), srv
}

// Connect opens another in-process connection to srv (a replica's own) and
// returns its JetStream; the connection is closed when tb ends.
func Connect(tb testing.TB, srv *natsstore.Embedded, opts ...jetstream.JetStreamOpt) jetstream.JetStream {
	tb.Helper()
	return connect(tb, srv, nil, opts...)
}

// connect is Connect with the connection's options.
func connect(tb testing.TB, srv *natsstore.Embedded, conn []nats.Option, opts ...jetstream.JetStreamOpt) jetstream.JetStream {
	tb.Helper()
	nc, err := srv.Connect(conn...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return js
}

// RequireNoRewrite fails tb unless js (connected as the sidecar's user)
// is refused every operation that could remove or rewrite the event log
// or a bucket: stream delete, purge, update, message delete, bucket
// delete. The stream and bucket must exist.
func RequireNoRewrite(tb testing.TB, js jetstream.JetStream, bucket string) {
	tb.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, natsstore.DefaultStream)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.DenyDelete, cfg.DenyPurge = false, false
	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"delete stream", func() error { return js.DeleteStream(ctx, natsstore.DefaultStream) }},
		{"purge stream", func() error { return st.Purge(ctx) }},
		{"delete message", func() error { return st.DeleteMsg(ctx, 1) }},
		{"update stream", func() error { _, err := js.UpdateStream(ctx, cfg); return err }},
		{"delete bucket " + bucket, func() error { return js.DeleteKeyValue(ctx, bucket) }},
	} {
		if err := op.do(); err == nil {
			tb.Errorf("%s as the sidecar's user: allowed", op.name)
		}
	}
}

// StallConsumers pauses every consumer of st on the server for an hour and
// returns how many: each keeps existing and delivers nothing, with no
// error to its client, as an overloaded server has left one.
func StallConsumers(tb testing.TB, st jetstream.Stream) int {
	tb.Helper()
	ctx := context.Background()
	n := 0
	for name := range st.ConsumerNames(ctx).Name() {
		if _, err := st.PauseConsumer(ctx, name, time.Now().Add(time.Hour)); err != nil {
			tb.Fatal(err)
		}
		n++
	}
	return n
}
