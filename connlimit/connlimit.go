// Package connlimit bounds the connections a listener keeps open, so that
// clients holding connections (keep-alive, slow or idle ones) cannot take
// every file descriptor of the process: its outgoing connections and its
// files need some too.
//
// A connection beyond the bound is accepted and refused at once (an
// answer the listener's owner chooses, then closed) rather than left in
// the kernel's backlog: a client learns why at once instead of waiting
// out its timeout, and a probe or a load balancer sees an answer. The
// bound counts connections from Accept until their Close.
package connlimit

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// refuseWrite bounds the write of a refusal. A new connection's send
// buffer is empty, so the write does not wait in practice; the bound
// keeps Accept from ever waiting on a client.
const refuseWrite = 100 * time.Millisecond

// Options configure a Listener.
type Options struct {
	// Max is the most connections open at once (0 or less: no bound).
	Max int
	// Refusal, when set, is written to a connection beyond Max before it
	// is closed (for plain HTTP, a complete 503 answer with
	// "Connection: close"). Nil closes it without a word, as a TLS
	// listener must (its clients expect a handshake).
	Refusal []byte
	// OnRefuse, when set, is called for each connection refused (for a
	// metric). It must not block.
	OnRefuse func()
}

// Listener is a net.Listener that keeps at most Options.Max connections
// open. It is safe for concurrent use.
type Listener struct {
	net.Listener
	opts Options
	open atomic.Int64
}

// New returns ln bounded by opts.
func New(ln net.Listener, opts Options) *Listener {
	return &Listener{Listener: ln, opts: opts}
}

// Open is the number of connections open now.
func (l *Listener) Open() int { return int(l.open.Load()) }

// Accept returns the next connection within the bound; connections
// beyond it are refused (Options.Refusal) while Accept waits for the
// next.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.open.Add(1); l.opts.Max <= 0 || n <= int64(l.opts.Max) {
			return &conn{Conn: c, l: l}, nil
		}
		l.open.Add(-1)
		l.refuse(c)
	}
}

// refuse answers c with the refusal, if any, and closes it at once: a
// refused connection holds no descriptor beyond Accept. (A client whose
// request arrives after the close gets a reset; on Linux it still reads
// the answer it received before.)
func (l *Listener) refuse(c net.Conn) {
	if l.opts.OnRefuse != nil {
		l.opts.OnRefuse()
	}
	if l.opts.Refusal != nil {
		_ = c.SetWriteDeadline(time.Now().Add(refuseWrite))
		_, _ = c.Write(l.opts.Refusal)
	}
	_ = c.Close()
}

// conn gives its place back on its first Close.
type conn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
	return err
}

// CloseWrite half-closes a TCP connection, as net/http does before
// closing one it answered with an error.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
