package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// heldListener is a listener serve binds before it starts (so that a port
// in use fails the start at once, and so that no http step can be pointed
// at it) and keeps for the whole process. Until a server accepts from it,
// its own loop accepts each connection, reads the request's head, answers
// 503 NOT_READY (starting) and closes it: a client or a probe that reaches
// serve while it starts (waiting for the NATS cluster, for minutes at
// worst) fails at once, instead of waiting in the kernel's queue and being
// served, request and all, long after it gave up. A TLS client's
// connection is closed at once (its handshake fails).
//
// A server accepts from a Session of it, one per server (each start
// attempt's): the Session's Close ends that server's acceptance only
// (its Accept returns net.ErrClosed, then and ever after) and the
// listener goes back to answering 503, so that a start attempt that
// failed after a server took the listener leaves it bound for the next
// attempt's server. release closes the socket.
type heldListener struct {
	ln    net.Listener
	conns chan net.Conn
	// refusing bounds the connections answered at once while starting;
	// beyond, a connection is closed without an answer.
	refusing chan struct{}
	mu       sync.Mutex
	// serving is closed when the session of the server accepting now
	// ends; nil while none does.
	serving chan struct{}
	done    chan struct{} // closed by release
	once    sync.Once
}

// listenHeld binds addr (TCP) and holds it.
func listenHeld(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return holdListener(ln), nil
}

// holdListener starts refusing on ln until a server accepts from it.
func holdListener(ln net.Listener) *heldListener {
	h := &heldListener{ln: ln, conns: make(chan net.Conn), refusing: make(chan struct{}, maxRefusing), done: make(chan struct{})}
	go h.loop()
	return h
}

// loop accepts every connection: handed to the server accepting from h,
// or closed while none does.
func (h *heldListener) loop() {
	wait := 5 * time.Millisecond
	for {
		c, err := h.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, say: as net/http does, a short wait,
			// doubled up to a second, and the next accept.
			select {
			case <-time.After(wait):
			case <-h.done:
				return
			}
			wait = min(2*wait, time.Second)
			continue
		}
		wait = 5 * time.Millisecond
		h.mu.Lock()
		serving := h.serving
		h.mu.Unlock()
		if serving == nil {
			select {
			case h.refusing <- struct{}{}:
				go func() {
					defer func() { <-h.refusing }()
					refuseStarting(c)
				}()
			default:
				_ = c.Close()
			}
			continue
		}
		select {
		case h.conns <- c:
		case <-serving:
			_ = c.Close()
		case <-h.done:
			_ = c.Close()
			return
		}
	}
}

// Session returns the listener one server accepts from: from its first
// Accept until its Close, the connections h accepts go to it (before,
// they are still answered 503: the node serves its API only once every
// component opened). A Session ended before its server's first Accept (a
// shutdown racing the server's start) is ended for good: its Accept
// returns net.ErrClosed, never a connection.
func (h *heldListener) Session() net.Listener {
	return &heldSession{h: h, closed: make(chan struct{})}
}

// Accept is refused: a server accepts from a Session.
func (h *heldListener) Accept() (net.Conn, error) {
	return nil, errors.New("heldListener: a server accepts from a Session of it")
}

// Close ends the session of the server accepting now, if any; the socket
// stays bound (release closes it).
func (h *heldListener) Close() error {
	h.mu.Lock()
	serving := h.serving
	h.mu.Unlock()
	if serving != nil {
		h.endSession(serving)
	}
	return nil
}

// endSession ends the session whose channel is closed.
func (h *heldListener) endSession(closed chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-closed:
	default:
		close(closed)
	}
	if h.serving == closed {
		h.serving = nil
	}
}

// heldSession is one server's view of a heldListener.
type heldSession struct {
	h      *heldListener
	closed chan struct{}
}

// begin makes this session the one the listener's connections go to,
// unless it or the listener ended; it reports whether it is. Its
// server's first Accept begins it; so does serve once the node opened,
// so that a connection arriving between the node's start of its server
// and that server's first Accept waits for the Accept instead of being
// answered "starting".
func (s *heldSession) begin() bool {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	select {
	case <-s.closed:
		return false
	case <-s.h.done:
		return false
	default:
		s.h.serving = s.closed // this session serves from now on
		return true
	}
}

// Accept returns the next connection, or net.ErrClosed once the session
// or the listener ended.
func (s *heldSession) Accept() (net.Conn, error) {
	if !s.begin() {
		return nil, net.ErrClosed
	}
	select {
	case c := <-s.h.conns:
		return c, nil
	case <-s.closed:
		return nil, net.ErrClosed
	case <-s.h.done:
		return nil, net.ErrClosed
	}
}

// Close ends this session only: the socket stays bound, answering 503
// until another Session.
func (s *heldSession) Close() error {
	s.h.endSession(s.closed)
	return nil
}

// Addr is the bound address.
func (s *heldSession) Addr() net.Addr { return s.h.Addr() }

// Addr is the bound address.
func (h *heldListener) Addr() net.Addr { return h.ln.Addr() }

// release closes the socket: serve is done with it.
func (h *heldListener) release() error {
	var err error
	h.once.Do(func() {
		close(h.done)
		_ = h.Close()
		err = h.ln.Close()
	})
	return err
}

// starting is the answer to a connection made while serve starts.
var starting = func() []byte {
	body, _ := json.Marshal(map[string]string{"code": httpapi.CodeNotReady,
		"message": "sidecar serve is starting (opening its store, or waiting for the NATS cluster); try again shortly"})
	return []byte(fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s", len(body), body))
}()

// maxRefusing bounds the connections answered at once while starting.
const maxRefusing = 64

// refuseStarting reads the head of c's request (an HTTP client takes an
// answer that comes before its request for a broken connection), answers
// starting and closes c, all within a second. A TLS handshake is closed
// at once.
func refuseStarting(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	var head []byte
	buf := make([]byte, 2048)
	for !bytes.Contains(head, []byte("\r\n\r\n")) && len(head) < 16<<10 {
		n, err := c.Read(buf)
		head = append(head, buf[:n]...)
		if len(head) > 0 && head[0] == 0x16 { // a TLS handshake record
			return
		}
		if err != nil {
			break
		}
	}
	_, _ = c.Write(starting)
}
