package node

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// envWriteErrChild makes the test binary the child of
// TestNode_ReadyReportsAStreamThatRefusesWrites, with the data dir as its
// value.
const envWriteErrChild = "NODE_WRITE_ERROR_CHILD_DIR"

// TestNode_ReadyReportsAStreamThatRefusesWrites re-executes the test
// binary as a child whose files may not grow past 256 KiB (RLIMIT_FSIZE;
// Go ignores SIGXFSZ, so the write fails with EFBIG as a full disk fails
// with ENOSPC). Its node runs the embedded server; once a stream's file
// store failed a write, Ready must say not ready, naming the stream and
// the fix.
func TestNode_ReadyReportsAStreamThatRefusesWrites(t *testing.T) {
	if os.Getenv(envWriteErrChild) != "" {
		t.Skip("the child's own run")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNode_WriteErrorChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envWriteErrChild+"="+filepath.Join(t.TempDir(), "nats"))
	out, err := cmd.CombinedOutput()
	if bytes.Contains(out, []byte("--- SKIP: TestNode_WriteErrorChild")) {
		t.Skip("the child skipped: " + string(out))
	}
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestNode_WriteErrorChild")) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "Ready: ") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

// TestNode_WriteErrorChild is the child of
// TestNode_ReadyReportsAStreamThatRefusesWrites.
func TestNode_WriteErrorChild(t *testing.T) {
	dir := os.Getenv(envWriteErrChild)
	if dir == "" {
		t.Skip("run by TestNode_ReadyReportsAStreamThatRefusesWrites")
	}
	const limit = 256 << 10
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: limit, Max: limit}); err != nil {
		t.Fatal(err)
	}
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
	if err := n.Ready(ctx); err != nil {
		t.Fatalf("Ready of a node just opened: %v", err)
	}
	kv, err := n.js.KeyValue(ctx, "SIDECAR_MEMBERS")
	if err != nil {
		t.Fatal(err)
	}
	critical := func() bool { return logs.FilterMessageSnippet("Critical write error").Len() > 0 }
	val := bytes.Repeat([]byte("x"), 4096)
	// The server does not answer a write its file store failed: each put
	// waits at most a while, and the server's log says when it failed.
	for i := 0; i < 4*limit/len(val) && !critical(); i++ {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, _ = kv.Put(pctx, fmt.Sprintf("filler-%d", i%5), val)
		cancel()
	}
	for end := time.Now().Add(2 * time.Minute); !critical(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the server logged no critical write error past %d bytes", 4*limit)
		}
	}
	t.Logf("server: %s", logs.FilterMessageSnippet("Critical write error").All()[0].Message)
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
