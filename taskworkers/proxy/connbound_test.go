package proxy_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// TestProxy_ConnectionBound: with MaxConnections 2, two workers holding
// keep-alive connections leave a third connection answered 503
// TOO_MANY_CONNECTIONS and closed, never forwarded; once they close, a
// new connection is served. Clients that hold connections cannot take
// the descriptors the sidecar's own connections to Conductor and its
// store need.
func TestProxy_ConnectionBound(t *testing.T) {
	const bound = 2
	e := newEnvOpts(t, envOpts{proxy: func(o *proxy.Options) { o.MaxConnections = bound }})
	u, err := url.Parse(e.url)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() (net.Conn, *bufio.Reader, int, string) {
		t.Helper()
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		r := bufio.NewReader(c)
		status, code := getHealth(t, c, r)
		return c, r, status, code
	}
	var held []net.Conn
	for i := 0; i < bound; i++ {
		c, _, status, code := dial()
		if status != http.StatusOK {
			t.Fatalf("held connection %d of %d: %d %s, want 200 (Conductor's health, forwarded)", i+1, bound, status, code)
		}
		held = append(held, c)
	}
	_, r, status, code := dial()
	if status != http.StatusServiceUnavailable || code != proxy.CodeTooManyConnections {
		t.Fatalf("connection %d while %d are held: %d %q, want 503 %s", bound+1, bound, status, code, proxy.CodeTooManyConnections)
	}
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the refused connection stayed open (%v), want it closed", err)
	}
	for _, c := range held {
		c.Close()
	}
	// The server sees the closes on its own time: a safety net of minutes.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		c, _, status, code := dial()
		c.Close()
		if status == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the held connections closed: %d %s, want 200", status, code)
		}
	}
}

// getHealth sends GET /health (forwarded to Conductor's) on c and reads
// the answer's status and code (0 when the connection ended without one).
func getHealth(t *testing.T, c net.Conn, r *bufio.Reader) (int, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		return 0, err.Error()
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var body struct{ Code string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Code
}

// TestProxy_UpstreamConnectionsAreBounded: 24 workers long-poll at once
// through a proxy whose MaxUpstreamConnections is 4; Conductor (behind a
// front that counts the requests it carries at once) sees at most 4 at a
// time, and every poll is answered. Workers cannot hold more of the
// sidecar's descriptors and of Conductor's request threads than that.
func TestProxy_UpstreamConnectionsAreBounded(t *testing.T) {
	const bound, workers = 4, 24
	var mu sync.Mutex
	now, most := 0, 0
	e := newEnvOpts(t, envOpts{
		proxyConductor: func(curl string) string {
			u, err := url.Parse(curl)
			if err != nil {
				t.Fatal(err)
			}
			rp := conductortest.ReverseProxy(t, u)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				now++
				most = max(most, now)
				mu.Unlock()
				defer func() {
					mu.Lock()
					now--
					mu.Unlock()
				}()
				rp.ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			return srv.URL + u.Path
		},
		proxy: func(o *proxy.Options) { o.MaxUpstreamConnections = bound },
	})
	var wg sync.WaitGroup
	codes := make(chan int, workers)
	for range workers {
		wg.Go(func() {
			// Nothing is queued for the type: Conductor holds each poll
			// for its timeout.
			res, err := http.Get(e.url + "/tasks/poll/batch/nobody_polls_" + e.tt + "?count=1&timeout=500")
			if err != nil {
				codes <- 0
				return
			}
			res.Body.Close()
			codes <- res.StatusCode
		})
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK && c != http.StatusNoContent {
			t.Fatalf("a poll answered %d, want 200 or 204 once a connection was free", c)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if most > bound || most == 0 {
		t.Fatalf("Conductor carried %d of the proxy's requests at once, want at most %d", most, bound)
	}
}
