package node

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
)

// testConfig is a node on the NATS server at natsURL with every optional
// component on: a bus sink and admission limits.
func testConfig(t *testing.T, natsURL string) Config {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	id := "nodetest-" + filepath.Base(t.TempDir())
	return Config{
		ConductorURL: conductortest.URL(t), NATSURL: natsURL, NATSURLShown: natsURL, Replicas: 1,
		API: ln, Own: []string{ln.Addr().String()}, Secrets: &secrets.Resolver{},
		DrainTimeout: time.Minute, WorkerID: id, TaskDomain: id, PollersPerType: 1,
		Concurrency: map[string]int{plan.ExecutorNoop: 1},
		Bus:         Bus{MaxAttempts: 8, Sinks: []Sink{{NATS: &eventbus.NATSSinkConfig{Name: "nats", Prefix: "nodetest"}}}},
		Admission:   Admission{Limits: admission.Limits{Global: 100}, Policy: admission.Queue, Delay: time.Minute},
	}
}

// TestNode_ReadyReportsEveryStream: every stream a component keeps its
// state in reaches the guard behind Ready, each named by the component
// that opens it: deleted by an administrator, each one turns Ready into
// an error naming it.
func TestNode_ReadyReportsEveryStream(t *testing.T) {
	admin, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-admin-pw", Permissions: natsstore.AllPermissions})
	n := New(testConfig(t, srv.URL()), zaptest.NewLogger(t), prometheus.NewRegistry())
	ctx := context.Background()
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	if err := n.Ready(ctx); err != nil {
		t.Fatalf("Ready of a node just opened: %v", err)
	}
	want := []string{"KV_SIDECAR_ADMISSION", "KV_SIDECAR_ALERTS", "KV_SIDECAR_CONTROL_REPLIES", "KV_SIDECAR_EVENTBUS", "KV_SIDECAR_EVENTBUS_DLQ",
		"KV_SIDECAR_EVENT_IDS", "KV_SIDECAR_LOG_STATE", "KV_SIDECAR_MEMBERS", "KV_SIDECAR_PAUSES", "KV_SIDECAR_RUNLIST", "KV_SIDECAR_RUNS", "KV_SIDECAR_SNAPSHOTS",
		"OBJ_SIDECAR_ARTIFACTS", natsstore.DefaultStream}
	if got := slices.Sorted(slices.Values(n.streams())); !slices.Equal(got, want) {
		t.Fatalf("streams of the open components:\n got %q\nwant %q", got, want)
	}
	// The guard reports the first deleted stream in name order, so they
	// are deleted from the last; the event stream is the log's own check.
	for _, name := range slices.Backward(want[:len(want)-1]) {
		if err := admin.DeleteStream(ctx, name); err != nil {
			t.Fatal(err)
		}
		if err := n.Ready(ctx); err == nil || !strings.Contains(err.Error(), name+" was deleted") {
			t.Fatalf("Ready after %s was deleted: %v, want an error naming it", name, err)
		}
	}
}

// TestNode_FailedOpenClosesWhatItOpened: an Open that fails on a later
// component closes the ones it opened (here the NATS connection, the
// first) and leaves the API's listener to the caller, unserved.
func TestNode_FailedOpenClosesWhatItOpened(t *testing.T) {
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	cfg.Admission.Policy = "no-such-policy" // admission.Open refuses it, after the log, the run index, members and the list
	n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
	if err := n.Open(context.Background()); err == nil {
		t.Fatal("Open with an unknown admission policy succeeded")
	}
	if nc := n.Conn(); nc == nil || !nc.IsClosed() {
		t.Fatal("the NATS connection of a failed Open is not closed")
	}
	if err := n.Live(); err != nil {
		t.Fatalf("Live of a node closed on purpose: %v", err)
	}
	// The listener is still bound and served by no one: it can be closed
	// once, by its owner.
	if err := cfg.API.Close(); err != nil {
		t.Fatalf("the API listener after a failed Open: %v, want it open for the caller", err)
	}
}

// TestNode_RunIndexMissingBesideALog: a start whose run index is gone
// (its stream deleted while serve was stopped) beside a log that holds
// records refuses with STORE_DAMAGED instead of serving with an empty
// index; --accept-new-nats-state starts anyway.
func TestNode_RunIndexMissingBesideALog(t *testing.T) {
	admin, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-index-pw", Permissions: natsstore.AllPermissions})
	ctx := context.Background()
	n := New(testConfig(t, srv.URL()), zaptest.NewLogger(t), prometheus.NewRegistry())
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.store.Append(ctx, storetest.Event("run-before", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.DeleteStream(ctx, "KV_"+adapter.DefaultRunsBucket); err != nil {
		t.Fatal(err)
	}

	again := New(testConfig(t, srv.URL()), zaptest.NewLogger(t), prometheus.NewRegistry())
	err := again.Open(ctx)
	if err == nil {
		_ = again.Close(ctx)
	}
	if !errors.Is(err, statestore.ErrDamaged) || !strings.Contains(err.Error(), "KV_"+adapter.DefaultRunsBucket) {
		t.Fatalf("Open with the run index gone beside a log of records: %v, want STORE_DAMAGED naming the run index", err)
	}

	cfg := testConfig(t, srv.URL())
	cfg.AcceptNewNATSState = true
	accepted := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
	if err := accepted.Open(ctx); err != nil {
		t.Fatalf("Open with --accept-new-nats-state: %v", err)
	}
	_ = accepted.Close(ctx)
}
