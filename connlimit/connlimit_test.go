package connlimit_test

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/connlimit"
)

// TestListener_RefusedWithoutAnswer: with no Refusal (a TLS listener), a
// connection beyond the bound is closed without a byte, counted by
// OnRefuse, while the held one stays open; Close of the held one frees
// its place.
func TestListener_RefusedWithoutAnswer(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int64
	ln := connlimit.New(raw, connlimit.Options{Max: 1, OnRefuse: func() { refused.Add(1) }})
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(2 * time.Minute)) // a safety net
		return c
	}
	first := dial()
	held := <-accepted
	second := dial()
	if n, err := second.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("the connection beyond the bound: read %d, %v; want closed without a byte", n, err)
	}
	if got := refused.Load(); got != 1 {
		t.Fatalf("OnRefuse called %d times, want 1", got)
	}
	if got := ln.Open(); got != 1 {
		t.Fatalf("Open() = %d with one held, want 1", got)
	}
	held.Close()
	held.Close() // a second Close gives back nothing more
	if got := ln.Open(); got != 0 {
		t.Fatalf("Open() = %d after the held one closed (twice), want 0", got)
	}
	first.Close()
	third := dial()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(2 * time.Minute):
		t.Fatal("no connection accepted after the held one closed")
	}
	third.Close()
	if got := refused.Load(); got != 1 {
		t.Fatalf("OnRefuse called %d times after the place was freed, want 1", got)
	}
}
