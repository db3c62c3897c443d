package natstest

import (
	"net"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// ConnectDeaf is Connect through an in-process link that drops every
// write of the client once the returned switch is set: requests the
// server never gets, so no answer ever comes, while the connection looks
// alive (a server that died or stalled between a request and its answer,
// or a replica that does not answer a direct get it was given).
func ConnectDeaf(tb testing.TB, srv *natsstore.Embedded, opts ...jetstream.JetStreamOpt) (jetstream.JetStream, *atomic.Bool) {
	tb.Helper()
	link := &deafLink{srv: srv}
	return connect(tb, srv, []nats.Option{nats.InProcessServer(link)}, opts...), &link.deaf
}

type deafLink struct {
	srv  *natsstore.Embedded
	deaf atomic.Bool
}

func (l *deafLink) InProcessConn() (net.Conn, error) {
	c, err := l.srv.Server.InProcessConn()
	if err != nil {
		return nil, err
	}
	return &deafConn{Conn: c, deaf: &l.deaf}, nil
}

type deafConn struct {
	net.Conn
	deaf *atomic.Bool
}

func (c *deafConn) Write(b []byte) (int, error) {
	if c.deaf.Load() {
		return len(b), nil
	}
	return c.Conn.Write(b)
}
