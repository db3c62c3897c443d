// Package sidecartest runs the sidecar binary for tests, as an operator
// would: it builds the binary once per test process, starts "sidecar serve"
// with an address and a data directory of its own, stops it by its pid, and
// runs the client subcommands. The end-to-end tests (e2e/), the live
// monitoring test (deploy/monitoring) and the deployment checks
// (deploy/kubernetes) share it.
//
// It imports only the standard library and adapter/conductortest, so a test
// module of its own (deploy/kubernetes) can use it without taking on the
// sidecar's dependencies. A test talks to a serve's API with
// httpapi.NewClient(s.URL()).
//
// Environment:
//
//   - SIDECAR_TEST_BINARY names a prebuilt binary to run instead of
//     building one: run a new test against an older build to see it fail
//     on the code before a fix.
//   - SIDECAR_TEST_CONDUCTOR_URL is the Conductor a serve talks to
//     (package conductortest); without it the tests that need one skip.
//   - SIDECAR_TEST_LOG_LINES is how much of a serve's log a failed test
//     shows (default 60 lines).
package sidecartest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/proctest"
)

// Environment variables the package reads.
const (
	EnvBinary   = "SIDECAR_TEST_BINARY"
	EnvLogLines = "SIDECAR_TEST_LOG_LINES"
)

// The exit codes of the sidecar's subcommands (sidecar -h).
const (
	ExitOK           = 0
	ExitError        = 1
	ExitUsage        = 2
	ExitDrainTimeout = 3 // pause --wait: the drain timed out (PAUSE_DRAIN_TIMEOUT)
	ExitNotFound     = 4 // the API answered 404
	ExitConflict     = 5 // the API answered 409: the run's state refuses the action
	ExitUnavailable  = 6 // the sidecar or Conductor did not answer: retry later
	ExitDenied       = 7 // the API refused the caller (401, 403)
)

var built struct {
	once sync.Once
	path string
	err  error
}

// Build returns the path of the sidecar binary: SIDECAR_TEST_BINARY when
// set, else a binary built once per process from this repository's
// cmd/sidecar into a temporary directory. It is for TestMain, where there
// is no testing.TB; tests call Binary.
func Build() (string, error) {
	if bin := os.Getenv(EnvBinary); bin != "" {
		return filepath.Abs(bin)
	}
	built.once.Do(func() {
		root, err := repoRoot()
		if err != nil {
			built.err = err
			return
		}
		dir, err := os.MkdirTemp("", "sidecar-test-bin")
		if err != nil {
			built.err = err
			return
		}
		path := filepath.Join(dir, "sidecar")
		cmd := exec.Command("go", "build", "-o", path, "./cmd/sidecar")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build ./cmd/sidecar: %v\n%s", err, out)
			return
		}
		built.path = path
	})
	return built.path, built.err
}

// Binary is Build for a test: it fails tb when the binary cannot be built.
func Binary(tb testing.TB) string {
	tb.Helper()
	bin, err := Build()
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

// repoRoot is the directory of the sidecar's go.mod, two levels above this
// file. It is found from the source, not the working directory, so the
// binary builds the same from any test package and from the nested test
// modules under deploy/.
func repoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("sidecartest: cannot locate its own source file")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..")
	if _, err := os.Stat(filepath.Join(root, "cmd", "sidecar")); err != nil {
		return "", fmt.Errorf("sidecartest: no cmd/sidecar under %s: %w", root, err)
	}
	return root, nil
}

// FreeAddr returns a loopback address with a port nobody listens on now.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return proctest.FreeAddr(tb)
}

// Options say how Start runs "sidecar serve". The zero value runs it on
// the test Conductor with a data directory, an address, a worker id and a
// task domain of its own.
type Options struct {
	// ConductorURL is --conductor-url; empty means the test Conductor
	// (conductortest.URL: the test skips when none is configured).
	ConductorURL string
	// DataDir is --data-dir; empty means a new tb.TempDir(). Pass the same
	// one to restart a serve on its log.
	DataDir string
	// Addr is --listen; empty means FreeAddr.
	Addr string
	// Name is the worker id and the task domain: each serve polls a task
	// domain of its own, so tasks of other tests' sidecars on the same
	// Conductor never reach it. Empty means "e2e-", the data directory's
	// base name and a hash of its whole path (TempDir's base names, such as
	// 001, repeat across test processes sharing one Conductor).
	Name string
	// Args come after the defaults; a repeated flag overrides its default.
	Args []string
	// Env is the process's environment; nil means this process's.
	Env []string
	// Probe is the path polled until it answers 200 (default /readyz; a
	// serve that cannot reach Conductor is live but never ready:
	// /healthz).
	Probe string
	// ReadyWithin bounds the wait for Probe (default 2m: a safety net, not
	// a budget; a restart may first end the commands a killed serve left).
	ReadyWithin time.Duration
}

// Serve is a running "sidecar serve" (or another process a test started
// with StartProcess).
type Serve struct {
	Cmd  *exec.Cmd
	Addr string
	// Log is the file the process writes its stdout and stderr to
	// (Log.Name() is its path).
	Log *os.File

	done chan struct{} // closed once the process has ended and Cmd.ProcessState is set
}

// Start runs "sidecar serve" and waits until it answers Probe with 200. The
// process is stopped (SIGTERM, by its pid) when the test ends, and a failed
// test shows the end of its log.
func Start(tb testing.TB, o Options) *Serve {
	tb.Helper()
	if o.ConductorURL == "" {
		o.ConductorURL = conductortest.URL(tb)
	}
	if o.DataDir == "" {
		o.DataDir = tb.TempDir()
	}
	if o.Addr == "" {
		o.Addr = FreeAddr(tb)
	}
	if o.Name == "" {
		h := fnv.New32a()
		h.Write([]byte(o.DataDir))
		o.Name = fmt.Sprintf("e2e-%s-%08x", filepath.Base(o.DataDir), h.Sum32())
	}
	if o.Probe == "" {
		o.Probe = "/readyz"
	}
	if o.ReadyWithin == 0 {
		o.ReadyWithin = 2 * time.Minute
	}
	args := append([]string{"serve", "--conductor-url", o.ConductorURL, "--data-dir", o.DataDir, "--listen", o.Addr,
		"--worker-id", o.Name, "--task-domain", o.Name,
		"--log-format", "console", "--shutdown-grace", "5s"}, o.Args...)
	cmd := exec.Command(Binary(tb), args...)
	cmd.Env = o.Env
	s := StartProcess(tb, cmd, o.Addr)
	if err := s.WaitReady(o.Probe, o.ReadyWithin); err != nil {
		tb.Fatal(err)
	}
	return s
}

// StartProcess starts cmd, which listens on addr, with its stdout and
// stderr in a log file of its own, and registers its stop (SIGTERM) for
// the end of the test (and its SIGKILL, should the test process die:
// proctest.StartTied); a failed test shows the end of the log. It does not
// wait for the process to be ready (WaitReady does). It is Start for a
// process built by hand: serve with flags, credentials or an environment
// Start does not give, or another server a test needs.
func StartProcess(tb testing.TB, cmd *exec.Cmd, addr string) *Serve {
	tb.Helper()
	what := filepath.Base(cmd.Path) + " " + addr
	logf, err := os.Create(filepath.Join(tb.TempDir(), "process.log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := proctest.StartTied(cmd); err != nil {
		logf.Close()
		tb.Fatalf("start %s: %v", what, err)
	}
	s := &Serve{Cmd: cmd, Addr: addr, Log: logf, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(s.done)
	}()
	tb.Cleanup(func() {
		s.Stop(syscall.SIGTERM)
		if tb.Failed() {
			b, _ := os.ReadFile(logf.Name())
			tb.Logf("%s log (pid %d):\n%s", what, cmd.Process.Pid, Tail(string(b), LogLines()))
		}
	})
	return s
}

// URL is the base URL of the serve's API.
func (s *Serve) URL() string { return "http://" + s.Addr }

// Exited reports whether the process has ended.
func (s *Serve) Exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Stop sends sig to the process and waits until it has ended; after a
// minute it kills it. Cmd.ProcessState is set when Stop returns. Stopping
// an ended process does nothing.
func (s *Serve) Stop(sig syscall.Signal) {
	if s.Exited() {
		return
	}
	_ = s.Cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(time.Minute):
		_ = s.Cmd.Process.Kill()
		<-s.done
	}
}

// WaitReady polls path until it answers 200. It returns an error with the
// end of the log when the process ends first or within has passed.
func (s *Serve) WaitReady(path string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(s.URL() + path)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if s.Exited() {
			b, _ := os.ReadFile(s.Log.Name())
			return fmt.Errorf("%s %s exited (%v) before %s answered 200:\n%s", filepath.Base(s.Cmd.Path), s.Addr, s.Cmd.ProcessState, path, Tail(string(b), 40))
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(s.Log.Name())
			return fmt.Errorf("%s %s: %s not 200 after %s:\n%s", filepath.Base(s.Cmd.Path), s.Addr, path, within, Tail(string(b), 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Main runs a subcommand of the sidecar binary, as a user would in a shell,
// with the given streams (nil: discarded).
type Main struct {
	Stdout io.Writer
	Stderr io.Writer
}

// Run runs "sidecar args..." and returns its exit code. When ctx ends
// first, the process gets SIGINT (as on Ctrl-C) and Run returns the code it
// then exits with. A binary that cannot be built or started is exit code
// -1, with the reason on Stderr.
func (m *Main) Run(ctx context.Context, args []string) int {
	stderr := m.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	bin, err := Build()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return -1
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = m.Stdout, m.Stderr
	if err := proctest.StartTied(cmd); err != nil {
		fmt.Fprintln(stderr, err)
		return -1
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = cmd.Process.Signal(os.Interrupt)
		case <-done:
		}
	}()
	_ = cmd.Wait()
	close(done)
	return cmd.ProcessState.ExitCode()
}

// Run runs "sidecar args..." and returns its exit code, stdout and stderr.
func Run(tb testing.TB, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	Binary(tb) // a build failure fails the test, not just the command
	var out, errb strings.Builder
	code = (&Main{Stdout: &out, Stderr: &errb}).Run(context.Background(), args)
	return code, out.String(), errb.String()
}

// WaitFor polls ok every 100ms until it is true, and fails tb, naming
// what, when within has passed.
func WaitFor(tb testing.TB, what string, within time.Duration, ok func() bool) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// LogLines is how much of a process's log a failed test shows
// (SIDECAR_TEST_LOG_LINES, default 60).
func LogLines() int {
	if n, err := strconv.Atoi(os.Getenv(EnvLogLines)); err == nil && n > 0 {
		return n
	}
	return 60
}
