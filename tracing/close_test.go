package tracing_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/tracing"
)

// TestTracer_CloseWithAHungCollector: a collector that takes connections
// and never answers costs a shutdown at most tracing.FlushTimeout, not the
// whole shutdown's budget, and is no error of the shutdown: the spans still
// buffered are dropped with one warning (the run event log has what they
// showed).
func TestTracer_CloseWithAHungCollector(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var (
		mu   sync.Mutex
		held []net.Conn
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+ln.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tracing.ProtocolHTTP)
	cfg, err := tracing.ConfigFromEnv(func(k string) string { return getenv(k) })
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	tr, err := tracing.New(context.Background(), cfg, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/runs/r1/pause", nil)
	req.SetPathValue("runId", "r1")
	_, q := tr.BeginRequest(req, "/v1/runs/{runId}/pause")
	q.End(http.StatusOK, "")

	// The shutdown's budget is longer than the flush's.
	ctx, cancel := context.WithTimeout(context.Background(), 4*tracing.FlushTimeout)
	defer cancel()
	began := time.Now()
	if err := tr.Close(ctx); err != nil {
		t.Fatalf("Close with a hung collector: %v, want nil (spans dropped, not a failed shutdown)", err)
	}
	if took := time.Since(began); took > 2*tracing.FlushTimeout {
		t.Fatalf("Close took %s, want about tracing.FlushTimeout (%s)", took, tracing.FlushTimeout)
	}
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "not exported") {
			return
		}
	}
	t.Fatalf("no warning about the spans not exported: %v", logs.All())
}
