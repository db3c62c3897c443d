package httpapi_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"go.uber.org/zap/zaptest"
)

// heldConn is a keep-alive client connection of its own.
type heldConn struct {
	c net.Conn
	r *bufio.Reader
}

// dialHealthz opens a connection to addr and sends GET /healthz on it;
// it returns the connection and the answer's status and code.
func dialHealthz(t *testing.T, addr string) (*heldConn, int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := &heldConn{c: c, r: bufio.NewReader(c)}
	status, code := h.get(t)
	return h, status, code
}

// get sends GET /healthz and reads the answer (0 when the connection
// ended without one).
func (h *heldConn) get(t *testing.T) (int, string) {
	t.Helper()
	_ = h.c.SetDeadline(time.Now().Add(2 * time.Minute)) // a safety net: the answer comes at once
	if _, err := io.WriteString(h.c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		return 0, err.Error()
	}
	resp, err := http.ReadResponse(h.r, nil)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var body struct{ Code string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Code
}

// TestServer_ConnectionBound: with MaxConnections 2, two held keep-alive
// connections leave a third answered 503 TOO_MANY_CONNECTIONS and closed,
// never served; once they close, new connections are served, and the
// bound holds again after the churn.
func TestServer_ConnectionBound(t *testing.T) {
	const bound = 2
	reg := prometheus.NewRegistry()
	api := httpapi.NewServer(httpapi.Options{Log: memstore.New(statestore.ProjectorOptions{}), Control: &recordingControl{},
		Logger: zaptest.NewLogger(t), MaxConnections: bound, Registerer: reg})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api.Open(ln)
	t.Cleanup(func() { _ = api.Close(t.Context()) })
	addr := ln.Addr().String()
	var refusals float64 // the 503s this test saw
	dial := func() (*heldConn, int, string) {
		h, status, code := dialHealthz(t, addr)
		if code == httpapi.CodeTooManyConnections {
			refusals++
		}
		return h, status, code
	}

	hold := func() []*heldConn {
		var held []*heldConn
		for i := 0; i < bound; i++ {
			h, status, code := dial()
			if status != http.StatusOK {
				t.Fatalf("held connection %d of %d: %d %s, want 200", i+1, bound, status, code)
			}
			held = append(held, h)
		}
		return held
	}
	refused := func(when string) {
		h, status, code := dial()
		if status != http.StatusServiceUnavailable || code != httpapi.CodeTooManyConnections {
			t.Fatalf("%s: connection %d got %d %s, want 503 %s", when, bound+1, status, code, httpapi.CodeTooManyConnections)
		}
		// Closed: an end, or a reset when the close found the request
		// unread.
		if _, err := h.r.ReadByte(); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("%s: the refused connection stayed open (%v), want it closed", when, err)
		}
	}

	held := hold()
	refused("while the first are held")
	if open, most := metricValue(t, reg, "sidecar_api_connections_open"), metricValue(t, reg, "sidecar_api_connections_max"); open != bound || most != bound {
		t.Fatalf("sidecar_api_connections_open %v, _max %v with %d held, want %d and %d", open, most, bound, bound, bound)
	}
	for _, h := range held {
		if status, code := h.get(t); status != http.StatusOK {
			t.Fatalf("a held connection's next request: %d %s, want 200", status, code)
		}
		h.c.Close()
	}
	// The server sees the closes on its own time: wait for a connection
	// to be served, with a safety net of minutes.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		h, status, _ := dial()
		h.c.Close()
		if status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection served 2m after the held ones closed (last: %d)", status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for served := false; !served; { // the probe above closed too: wait until both places are free
		if time.Now().After(deadline) {
			t.Fatalf("%d connections not served at once 2m after the held ones closed", bound)
		}
		for _, h := range held {
			h.c.Close()
		}
		held, served = nil, true
		for i := 0; i < bound && served; i++ {
			h, status, _ := dial()
			held = append(held, h)
			served = status == http.StatusOK
		}
		if !served {
			time.Sleep(10 * time.Millisecond)
		}
	}
	refused("after the churn")
	if got := metricValue(t, reg, "sidecar_api_connections_refused_total"); got != refusals || got < 2 {
		t.Fatalf("sidecar_api_connections_refused_total = %v after %v refusals", got, refusals)
	}
}

// metricValue is the value of counter or gauge name of reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestMetricsServer_ConnectionBound: the metrics listener keeps its bound
// too: with one connection held, the next is answered 503
// TOO_MANY_CONNECTIONS.
func TestMetricsServer_ConnectionBound(t *testing.T) {
	m := httpapi.NewMetricsServer(prometheus.NewRegistry(), zaptest.NewLogger(t))
	m.MaxConnections = 1
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.Open(ln)
	t.Cleanup(func() { _ = m.Close(t.Context()) })
	if _, status, code := dialHealthz(t, ln.Addr().String()); status != http.StatusNotFound {
		t.Fatalf("the held connection: %d %s, want the metrics listener's 404", status, code)
	}
	if _, status, code := dialHealthz(t, ln.Addr().String()); status != http.StatusServiceUnavailable || code != httpapi.CodeTooManyConnections {
		t.Fatalf("the connection beyond the bound: %d %s, want 503 %s", status, code, httpapi.CodeTooManyConnections)
	}
}
