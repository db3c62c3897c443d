package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestHeldListener: a listener serve holds answers 503 NOT_READY at once
// while no server accepts from it; a server serves it; a server's Close
// (a failed start attempt's) leaves it bound, answering 503 again, and
// the next server serves it; release frees the port.
func TestHeldListener(t *testing.T) {
	ln, err := listenHeld("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := ln.(*heldListener)
	defer h.release()
	url := "http://" + ln.Addr().String() + "/healthz"
	client := &http.Client{Timeout: 3 * time.Second}
	get := func(t *testing.T) (int, string) {
		t.Helper()
		res, err := client.Get(url)
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	starting := func(t *testing.T) {
		t.Helper()
		if code, body := get(t); code != http.StatusServiceUnavailable || !strings.Contains(body, `"NOT_READY"`) {
			t.Fatalf("no server: %d %s, want 503 NOT_READY", code, body)
		}
	}
	serve := func(t *testing.T, answer string) *http.Server {
		t.Helper()
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, answer) })}
		sess := h.Session()
		go func() { _ = srv.Serve(sess) }()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if code, body := get(t); code == http.StatusOK && body == answer {
				return srv
			}
			if time.Now().After(deadline) {
				t.Fatalf("the server answering %q never served", answer)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	starting(t)
	first := serve(t, "first")
	if err := first.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	starting(t)
	second := serve(t, "second")
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	starting(t)
	if err := h.release(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the port still takes connections after release")
	}
}

// TestHeldListener_SessionEndedBeforeItsServerAccepts: a server whose
// session was ended before its first Accept (serve stopping, or a start
// attempt failing, while the server's goroutine starts) returns at once
// instead of taking a new session and blocking forever, and so does its
// Shutdown; the socket stays bound and answers 503.
func TestHeldListener_SessionEndedBeforeItsServerAccepts(t *testing.T) {
	ln, err := listenHeld("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := ln.(*heldListener)
	defer h.release()
	sess := h.Session()
	if err := sess.Close(); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler()}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sess) }()
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Fatal("Serve of an ended session still accepting after 5 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	res, err := (&http.Client{Timeout: 3 * time.Second}).Get("http://" + ln.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("after the session ended: %d, want 503", res.StatusCode)
	}
}
