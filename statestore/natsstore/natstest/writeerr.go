package natstest

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

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// WriteErrLimit is the RLIMIT_FSIZE of a write-error child (WriteErrChild):
// no file it writes may grow past it, so a stream's message block fails its
// write with EFBIG (Go ignores SIGXFSZ), as a full disk fails it with
// ENOSPC.
const WriteErrLimit = 256 << 10

// RunWriteErrChild re-executes the test binary to run only the test child,
// with env set to a new data directory: the child calls WriteErrChild. It
// skips tb when the child skipped, fails it unless the child passed, and
// logs the lines of the child's output that contain marker (what the
// child found, for the parent's log).
func RunWriteErrChild(tb testing.TB, child, env, marker string) {
	tb.Helper()
	for _, l := range strings.Split(runWriteErrChild(tb, child, env), "\n") {
		if strings.Contains(l, marker) {
			tb.Log(strings.TrimSpace(l))
		}
	}
}

// runWriteErrChild runs the child and returns its output.
func runWriteErrChild(tb testing.TB, child, env string) string {
	tb.Helper()
	if os.Getenv(env) != "" {
		tb.Skip("the child's own run")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+child+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+filepath.Join(tb.TempDir(), "nats"))
	out, err := cmd.CombinedOutput()
	if bytes.Contains(out, []byte("--- SKIP: "+child)) {
		tb.Skip("the child skipped: " + string(out))
	}
	if err != nil || !bytes.Contains(out, []byte("--- PASS: "+child)) {
		tb.Fatalf("child: %v\n%s", err, out)
	}
	return string(out)
}

// WriteErrChild is the child's side of RunWriteErrChild: it skips tb
// unless the test binary runs as that child, limits the size of every
// file the process writes to WriteErrLimit, and returns the data
// directory to start the embedded server in.
func WriteErrChild(tb testing.TB, env string) string {
	tb.Helper()
	dir := os.Getenv(env)
	if dir == "" {
		tb.Skip("run by its parent test, as a child process")
	}
	lim := syscall.Rlimit{Cur: WriteErrLimit, Max: WriteErrLimit}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// FillUntilWriteError puts values into kv until the server's log (logs,
// the embedded server's logger's) says the file store of kv's stream
// failed a write, and returns that line. The server does not answer a
// write its file store failed: each put waits at most 10 s.
func FillUntilWriteError(tb testing.TB, kv jetstream.KeyValue, logs *observer.ObservedLogs) string {
	tb.Helper()
	return FillStreamUntilWriteError(tb, "KV_"+kv.Bucket(), logs, func(ctx context.Context, i int, val []byte) {
		_, _ = kv.Put(ctx, fmt.Sprintf("filler-%d", i%5), val)
	})
}

// FillStreamUntilWriteError calls put with values of 4 KiB (i counting
// the calls) until the server's log (logs) says the file store of stream
// failed a write, and returns that line. Each put gets a context that
// ends after 10 s: the server does not answer a write its file store
// failed.
func FillStreamUntilWriteError(tb testing.TB, stream string, logs *observer.ObservedLogs, put func(ctx context.Context, i int, val []byte)) string {
	tb.Helper()
	line := "Filestore [" + stream + "] Critical write error"
	critical := func() bool { return logs.FilterMessageSnippet(line).Len() > 0 }
	val := bytes.Repeat([]byte("x"), 4096)
	for i := 0; i < 4*WriteErrLimit/len(val) && !critical(); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		put(ctx, i, val)
		cancel()
	}
	for end := time.Now().Add(2 * time.Minute); !critical(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			tb.Fatalf("the server logged no critical write error of stream %s past %d bytes", stream, 4*WriteErrLimit)
		}
	}
	return logs.FilterMessageSnippet(line).All()[0].Message
}

// StartWriteErrChild is the embedded server of a write-error child
// (WriteErrChild with env), started in the child's data dir with its
// errors logged to logs (where FillUntilWriteError finds the server's
// critical write error), and a connection to it whose requests wait at
// most 5 s: what a refused write would wait without a fast path.
func StartWriteErrChild(tb testing.TB, env string) (jetstream.JetStream, *natsstore.Embedded, *observer.ObservedLogs) {
	tb.Helper()
	dir := WriteErrChild(tb, env)
	core, logs := observer.New(zap.ErrorLevel)
	_, srv := StartIn(tb, dir, natsstore.EmbeddedConfig{Logger: zap.New(core)})
	return Connect(tb, srv, jetstream.WithDefaultTimeout(5*time.Second)), srv, logs
}
