package natsstore_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// envWriteErrChild makes the test binary the child of
// TestEmbedded_WriteErrorIsNotReady, with the data dir as its value.
const envWriteErrChild = "NATSSTORE_WRITE_ERROR_CHILD_DIR"

// writeErrLimit is the child's RLIMIT_FSIZE: no file it writes may grow
// past it, so a stream's message block fails its write with EFBIG (Go
// ignores SIGXFSZ), as a full disk fails it with ENOSPC.
const writeErrLimit = 256 << 10

// TestEmbedded_WriteErrorIsNotReady re-executes the test binary as a
// child whose files may not grow past writeErrLimit: its embedded
// server's file store fails a write for real, and keeps that error until
// it restarts. The child checks that Check then refuses readiness and
// says which stream, why, and what to do.
func TestEmbedded_WriteErrorIsNotReady(t *testing.T) {
	if os.Getenv(envWriteErrChild) != "" {
		t.Skip("the child's own run")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestEmbedded_WriteErrorChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envWriteErrChild+"="+filepath.Join(t.TempDir(), "nats"))
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestEmbedded_WriteErrorChild")) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "Check: ") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

// TestEmbedded_WriteErrorChild is the child of
// TestEmbedded_WriteErrorIsNotReady.
func TestEmbedded_WriteErrorChild(t *testing.T) {
	dir := os.Getenv(envWriteErrChild)
	if dir == "" {
		t.Skip("run by TestEmbedded_WriteErrorIsNotReady")
	}
	lim := syscall.Rlimit{Cur: writeErrLimit, Max: writeErrLimit}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	core, logs := observer.New(zap.ErrorLevel)
	js, srv := natstest.StartIn(t, dir, natsstore.EmbeddedConfig{Logger: zap.New(core)})
	if err := srv.Check(); err != nil {
		t.Fatalf("a fresh server is not ready: %v", err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "SIDECAR_RUNS"})
	if err != nil {
		t.Fatal(err)
	}
	val := bytes.Repeat([]byte("x"), 4096)
	critical := func() bool {
		return logs.FilterMessageSnippet("Critical write error").Len() > 0
	}
	// The server does not answer a write its file store failed: each put
	// waits at most a while, and the server's log says when it failed.
	for i := 0; i < 4*writeErrLimit/len(val) && !critical(); i++ {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, _ = kv.Put(pctx, "run"+strings.Repeat("x", i%7), val)
		cancel()
	}
	for end := time.Now().Add(2 * time.Minute); !critical(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the server logged no critical write error past %d bytes", 4*writeErrLimit)
		}
	}
	t.Logf("server: %s", logs.FilterMessageSnippet("Critical write error").All()[0].Message)
	err = srv.Check()
	if err == nil {
		t.Fatal("Check = nil with a stream that refuses every write, want not ready")
	}
	t.Logf("Check: %v", err)
	for _, want := range []string{"KV_SIDECAR_RUNS", "file too large", "restart"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Check = %q, want it to name %q", err, want)
		}
	}
}
