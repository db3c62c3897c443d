package node

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// envWriteErrChild makes the test binary the child of
// TestNode_ReadyReportsAStreamThatRefusesWrites, with the data dir as its
// value.
const envWriteErrChild = "NODE_WRITE_ERROR_CHILD_DIR"

// TestNode_ReadyReportsAStreamThatRefusesWrites re-executes the test
// binary as a child whose files may not grow past natstest.WriteErrLimit
// (RLIMIT_FSIZE; Go ignores SIGXFSZ, so the write fails with EFBIG as a
// full disk fails with ENOSPC). Its node runs the embedded server; once a
// stream's file store failed a write, Ready must say not ready, naming
// the stream and the fix.
func TestNode_ReadyReportsAStreamThatRefusesWrites(t *testing.T) {
	natstest.RunWriteErrChild(t, "TestNode_WriteErrorChild", envWriteErrChild, "Ready: ")
}

// TestNode_WriteErrorChild is the child of
// TestNode_ReadyReportsAStreamThatRefusesWrites.
func TestNode_WriteErrorChild(t *testing.T) {
	ctx := context.Background()
	n, _, logs := openWriteErrChild(t, envWriteErrChild)
	if err := n.Ready(ctx); err != nil {
		t.Fatalf("Ready of a node just opened: %v", err)
	}
	kv, err := n.js.KeyValue(ctx, "SIDECAR_MEMBERS")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server: %s", natstest.FillUntilWriteError(t, kv, logs))
	err = n.Ready(ctx)
	if err == nil {
		t.Fatal("Ready = nil with a stream that refuses every write, want not ready")
	}
	t.Logf("Ready: %v", err)
	for _, want := range []string{"KV_SIDECAR_MEMBERS", "free space", "restart serve"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Ready = %q, want it to name %q", err, want)
		}
	}
}

// openWriteErrChild is the node of a write-error child (env names its data
// dir; natstest.WriteErrChild), open on an embedded server of its own, with
// its config and the log the server writes its critical write errors to.
func openWriteErrChild(t *testing.T, env string) (*Node, Config, *observer.ObservedLogs) {
	t.Helper()
	dir := natstest.WriteErrChild(t, env)
	ctx := context.Background()
	core, logs := observer.New(zap.InfoLevel)
	cfg := testConfig(t, "")
	cfg.NATSURLShown = ""
	cfg.Embedded = natsstore.EmbeddedConfig{DataDir: dir}
	n := New(cfg, zap.New(core), prometheus.NewRegistry())
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	return n, cfg, logs
}
