// Package natstest starts a real embedded NATS server with JetStream for
// tests and benchmarks of the packages built on it, and stops it when the
// test ends.
package natstest

import (
	"testing"

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
	nc, err := srv.Connect()
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
