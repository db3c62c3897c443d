// Package natstest starts a real embedded NATS server with JetStream for
// tests and benchmarks of the packages built on it, and stops it when the
// test ends.
package natstest

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// Start runs an embedded server on a random loopback port with its store in
// a temporary directory, connects to it, and returns the connection's
// JetStream and the server (for its ClientURL, or to restart it). Both end
// with tb.
func Start(tb testing.TB) (jetstream.JetStream, *server.Server) {
	tb.Helper()
	return StartIn(tb, tb.TempDir(), natsstore.EmbeddedConfig{})
}

// StartIn is Start with the store in dir and the rest of cfg (DataDir and
// Port are set here).
func StartIn(tb testing.TB, dir string, cfg natsstore.EmbeddedConfig) (jetstream.JetStream, *server.Server) {
	tb.Helper()
	cfg.DataDir, cfg.Port = dir, -1
	srv, err := natsstore.StartEmbedded(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return Connect(tb, srv), srv
}

// Connect opens another in-process connection to srv (a replica's own) and
// returns its JetStream; the connection is closed when tb ends.
func Connect(tb testing.TB, srv *server.Server, opts ...jetstream.JetStreamOpt) jetstream.JetStream {
	tb.Helper()
	nc, err := natsstore.ConnectEmbedded(srv)
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
