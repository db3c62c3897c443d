package exec_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/artifacts"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// env is a started embedded NATS server with an artifact store.
type env struct {
	srv   *natsstore.Embedded
	store *artifacts.Store
}

func startStore(t testing.TB) *env {
	t.Helper()
	js, srv := natstest.Start(t)
	st, err := artifacts.Open(context.Background(), js, artifacts.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &env{srv: srv, store: st}
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Sync() error { return nil }

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testLogger logs to t and, at debug level as JSON, to the returned buffer.
func testLogger(t testing.TB) (*zap.Logger, *syncBuffer) {
	buf := &syncBuffer{}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewDevelopmentEncoderConfig()), buf, zap.DebugLevel)
	l := zaptest.NewLogger(t, zaptest.Level(zap.DebugLevel), zaptest.WrapOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewTee(c, core)
	})))
	return l, buf
}

var stepSeq atomic.Int64

// execution returns an Execution of spec with the test's name as run id
// and a fresh step id.
func execution(t testing.TB, spec plan.ExecutorSpec) taskworkers.Execution {
	return taskworkers.Execution{RunID: t.Name(), StepID: fmt.Sprintf("step-%d", stepSeq.Add(1)),
		LogicalAttemptID: 1, EngineAttemptID: 1, Spec: spec}
}

func cmd(argv ...string) plan.ExecutorSpec {
	return plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: argv}
}

func sh(script string) plan.ExecutorSpec { return cmd("sh", "-c", script) }

// artifact reads the artifact of kind from res back from the store and
// checks its sha256 and size against the reference.
func artifact(t *testing.T, st *artifacts.Store, res taskworkers.Result, kind string) []byte {
	t.Helper()
	for _, ref := range res.Artifacts {
		if ref.Kind != kind {
			continue
		}
		rc, got, err := st.Get(context.Background(), ref.URI)
		if err != nil {
			t.Fatalf("get %s: %v", ref.URI, err)
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if ref.SHA256 != hex.EncodeToString(sum[:]) || ref.SizeBytes != int64(len(b)) {
			t.Fatalf("ref %+v does not describe the %d stored bytes", ref, len(b))
		}
		if got != ref {
			t.Fatalf("stored ref %+v, result ref %+v", got, ref)
		}
		return b
	}
	t.Fatalf("no %s artifact in %+v", kind, res.Artifacts)
	return nil
}

func wantErr(t *testing.T, res taskworkers.Result, code string, retryable bool) *statestore.StepError {
	t.Helper()
	if res.Err == nil {
		t.Fatalf("got success (output %v), want %s", res.Output, code)
	}
	if res.Err.Code != code || res.Err.Retryable != retryable {
		t.Fatalf("got %s retryable=%v (%s), want %s retryable=%v", res.Err.Code, res.Err.Retryable, res.Err.Message, code, retryable)
	}
	return res.Err
}

func wantOK(t *testing.T, res taskworkers.Result, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("executor error: %v", err)
	}
	if res.Err != nil {
		t.Fatalf("step failed: %+v (output %v)", res.Err, res.Output)
	}
}

// waitFile waits until path exists.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s did not appear", path)
}

// processGone reports whether pid no longer runs (absent, or a zombie
// nobody has reaped yet).
func processGone(pid string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X')
}

func newRegistry(t testing.TB, st *artifacts.Store, opts exec.Options) *exec.Registry {
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	if st != nil {
		opts.Artifacts = st
	}
	return exec.New(opts)
}

// allowLoopback lets the http executor reach the tests' httptest servers
// on 127.0.0.1, which the destination guard refuses by default.
var allowLoopback = []exec.Destination{{Prefix: netip.MustParsePrefix("127.0.0.1/32")}}
