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
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	reg := prometheus.NewRegistry()
	e := newEnvOpts(t, envOpts{proxy: func(o *proxy.Options) { o.MaxConnections, o.Metrics = bound, proxy.NewMetrics(reg) }})
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
	// Counted, as the API's listener counts its own.
	if n := counterValue(t, reg, "sidecar_proxy_connections_refused_total"); n != 1 {
		t.Fatalf("sidecar_proxy_connections_refused_total %v after one refused connection, want 1", n)
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
// time, and every poll is answered. Then 24 workers each hang up 100 ms
// into their poll: the polls sent on go on until Conductor answers them
// (Conductor works on an abandoned poll until its timeout anyway), still
// at most 4 at once. Workers cannot hold more of the sidecar's
// descriptors and of Conductor's request threads than that.
func TestProxy_UpstreamConnectionsAreBounded(t *testing.T) {
	const bound, workers = 4, 24
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	now, most, cut := 0, 0, 0
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
				rp.ServeHTTP(w, r)
				mu.Lock()
				now--
				if r.Context().Err() != nil {
					cut++ // the proxy gave up on it before Conductor answered
				}
				mu.Unlock()
			}))
			t.Cleanup(srv.Close)
			return srv.URL + u.Path
		},
		proxy: func(o *proxy.Options) { o.MaxUpstreamConnections = bound; o.Metrics = proxy.NewMetrics(reg) },
	})
	var wg sync.WaitGroup
	var answered atomic.Int32
	codes := make(chan int, workers)
	for range workers {
		wg.Go(func() {
			defer answered.Add(1)
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
	// An update (of a task Conductor does not know: answered at once)
	// does not queue behind the polls: it has slots of its own.
	waitFor(t, "the polls to fill the proxy's slots", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return now > 0
	})
	// The metrics show the slots full and the polls waiting for one.
	if s, u := upstreamGauge(t, reg, "sidecar_proxy_upstream_slots", "poll"), upstreamGauge(t, reg, "sidecar_proxy_upstream_slots", "update"); s != 3 || u != 1 {
		t.Fatalf("sidecar_proxy_upstream_slots poll %v, update %v: want 3 and 1 (a quarter of %d for updates)", s, u, bound)
	}
	waitFor(t, "the metrics to show every poll slot taken and polls waiting", time.Minute, func() bool {
		return upstreamGauge(t, reg, "sidecar_proxy_upstream_requests", "poll") == 3 && upstreamGauge(t, reg, "sidecar_proxy_upstream_waiting", "poll") > 0
	})
	res, err := http.Post(e.url+"/tasks", "application/json", strings.NewReader(
		`{"taskId":"00000000-0000-4000-8000-000000000000","workflowInstanceId":"00000000-0000-4000-8000-000000000001","status":"COMPLETED"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if n := answered.Load(); n > workers/2 {
		t.Fatalf("the update was answered after %d of the %d polls: it queued behind them", n, workers)
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK && c != http.StatusNoContent {
			t.Fatalf("a poll answered %d, want 200 or 204 once a connection was free", c)
		}
	}
	mu.Lock()
	if most > bound || most == 0 {
		t.Fatalf("Conductor carried %d of the proxy's requests at once, want at most %d", most, bound)
	}
	most = 0
	mu.Unlock()

	hangUp := &http.Client{Timeout: 100 * time.Millisecond}
	for range workers {
		wg.Go(func() {
			if res, err := hangUp.Get(e.url + "/tasks/poll/batch/nobody_polls_" + e.tt + "?count=1&timeout=1000"); err == nil {
				res.Body.Close()
			}
		})
	}
	wg.Wait()
	waitFor(t, "the polls sent on to be answered", time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return now == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if most > bound || cut > 0 {
		t.Fatalf("after the workers hung up: %d at once (want at most %d), %d given up before Conductor answered (want 0: Conductor goes on with them)",
			most, bound, cut)
	}
	for _, name := range []string{"sidecar_proxy_upstream_requests", "sidecar_proxy_upstream_waiting"} {
		for _, kind := range []string{"poll", "update"} {
			if v := upstreamGauge(t, reg, name, kind); v != 0 {
				t.Errorf("%s{kind=%q} %v once every request was answered, want 0", name, kind, v)
			}
		}
	}
}

// upstreamGauge is the gauge name{kind} in reg (-1: not there).
func upstreamGauge(t *testing.T, reg *prometheus.Registry, name, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// counterValue is the value of the counter name in reg (-1: not there).
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}

// TestProxy_PollsOfOneTypeDoNotStarveAnother: 24 workers of one task type
// long-poll through a proxy with 3 places for polls, and wait in line for
// them; a worker of another type that polls then gets the next free
// place, not one behind every poll of the first type: the places go to
// the task types that wait in turn. In one line, every other task type's
// workers waited as long as the busiest type's queue took to drain.
func TestProxy_PollsOfOneTypeDoNotStarveAnother(t *testing.T) {
	const bound, workers = 4, 24
	reg := prometheus.NewRegistry()
	e := limitedEnv(t, reg, func(o *proxy.Options) { o.MaxUpstreamConnections = bound })
	var wg sync.WaitGroup
	var answered atomic.Int32
	for range workers {
		wg.Go(func() {
			defer answered.Add(1)
			// Nothing is queued for the type: Conductor holds each poll
			// for its timeout.
			if res, err := http.Get(e.url + "/tasks/poll/batch/busy_" + e.tt + "?count=1&timeout=500"); err == nil {
				res.Body.Close()
			}
		})
	}
	defer wg.Wait()
	waitFor(t, "the busy type's polls to take every place and wait for more", time.Minute, func() bool {
		return upstreamGauge(t, reg, "sidecar_proxy_upstream_requests", "poll") == 3 &&
			upstreamGauge(t, reg, "sidecar_proxy_upstream_waiting", "poll") >= workers/2
	})
	res, err := http.Get(e.url + "/tasks/poll/batch/quiet_" + e.tt + "?count=1&timeout=100")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if n := answered.Load(); n > workers/2 {
		t.Fatalf("the other type's poll was answered after %d of the busy type's %d polls: it waited behind them", n, workers)
	}
}
