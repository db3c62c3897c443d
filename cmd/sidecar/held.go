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
// Close ends only the current server's acceptance (Accept returns
// net.ErrClosed to it) and goes back to closing connections: a start
// attempt that failed after a server took the listener leaves it bound
// for the next attempt's server. release closes the socket.
type heldListener struct {
	ln    net.Listener
	conns chan net.Conn
	// refusing bounds the connections answered at once while starting;
	// beyond, a connection is closed without an answer.
	refusing chan struct{}
	mu       sync.Mutex
	// serving is closed by Close: the session of the server accepting
	// now, nil while none does.
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

// Accept returns the next connection for the server calling it; the first
// call after a Close begins a new server's session.
func (h *heldListener) Accept() (net.Conn, error) {
	h.mu.Lock()
	if h.serving == nil {
		h.serving = make(chan struct{})
	}
	serving := h.serving
	h.mu.Unlock()
	select {
	case c := <-h.conns:
		return c, nil
	case <-serving:
		return nil, net.ErrClosed
	case <-h.done:
		return nil, net.ErrClosed
	}
}

// Close ends the current server's session; the socket stays bound, and
// connections are closed at once again until another server accepts.
func (h *heldListener) Close() error {
	h.mu.Lock()
	if h.serving != nil {
		close(h.serving)
		h.serving = nil
	}
	h.mu.Unlock()
	return nil
}

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
