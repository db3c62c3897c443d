package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/httpapi"
)

// TestServe_NATSConnectionClosedForGood: when the server closes serve's
// NATS connection for good (here a real protocol error: a control line
// longer than the server's limit, sent on serve's own connection),
// /healthz stops answering 200, so a liveness probe restarts the process,
// and serve ends with an error naming the cause, so a supervisor restarts
// it. Before, /healthz stayed 200 and serve kept running, cut off its
// store: every read, start and control answered 503 until someone noticed.
func TestServe_NATSConnectionClosedForGood(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ConductorURL = conductortest.URL(t)
	dir := t.TempDir()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Listen = "127.0.0.1:0"
	cfg.WorkerID = "natsloss-" + filepath.Base(dir)
	cfg.TaskDomain = cfg.WorkerID
	cfg.ShutdownGrace = 5 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, err := startSidecar(ctx, cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.close(context.Background()) })
	healthz := func() (int, string) {
		resp, err := http.Get("http://" + sc.addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct{ Code string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body.Code
	}
	if code, _ := healthz(); code != http.StatusOK {
		t.Fatalf("/healthz of a healthy sidecar: %d", code)
	}

	_ = sc.nc.Publish(strings.Repeat("x", 5000), nil) // the server answers -ERR and closes the connection
	deadline := time.Now().Add(time.Minute)
	for !sc.nc.IsClosed() {
		if time.Now().After(deadline) {
			t.Fatalf("the server did not close the connection: %v", sc.nc.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, apiCode := healthz(); code != http.StatusServiceUnavailable || apiCode != httpapi.CodeNotLive {
		t.Errorf("/healthz with the NATS connection closed for good: %d %s, want 503 %s", code, apiCode, httpapi.CodeNotLive)
	}
	errc := make(chan error, 1)
	go func() { errc <- sc.serveUntil(ctx, nil) }()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "maximum control line exceeded") {
			t.Errorf("serve ended with %v, want the cause (maximum control line exceeded)", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("serve kept running with its NATS connection closed for good")
	}
}

// TestServe_NATSAsyncErrorsLoggedBounded: the errors the NATS server
// sends serve's connection asynchronously (here 50 real permission
// violations) reach serve's logger, once a minute per kind of error, not
// 50 unstructured lines on stderr (nats.go's default) that no log
// pipeline parses.
func TestServe_NATSAsyncErrorsLoggedBounded(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ConductorURL = conductortest.URL(t)
	dir := t.TempDir()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Listen = "127.0.0.1:0"
	cfg.WorkerID = "natserr-" + filepath.Base(dir)
	cfg.TaskDomain = cfg.WorkerID
	core, logs := observer.New(zap.WarnLevel)
	sc, err := startSidecar(context.Background(), cfg, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.close(context.Background()) })
	for range 50 {
		_ = sc.nc.Publish("$JS.API.STREAM.PURGE.SIDECAR_EVENTS", nil) // denied to the sidecar's user
	}
	if err := sc.nc.FlushTimeout(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for logs.FilterMessageSnippet("NATS reported an error").Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the rest arrive right behind the first
	// One from the server's log (embedded), one from the connection's.
	n := 0
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "Violation") || strings.Contains(fmt.Sprint(e.ContextMap()), "Violation") {
			n++
		}
	}
	if n > 2 {
		t.Fatalf("%d log lines for 50 permission violations, want at most 2 (bounded): %v", n, logs.All())
	}
	if c := logs.FilterMessageSnippet("NATS reported an error").Len(); c != 1 {
		t.Fatalf("%d lines from serve's connection for 50 permission violations, want 1", c)
	}
}
