// Package proctest runs the server a test needs as a process of its own
// (a binary or a script that the repo's deploy/local scripts build or
// ship): on free loopback ports, its output in a log file, ready once it
// listens on every address it was given, and stopped when the test ends.
// A failed test shows the end of the log.
package proctest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// ListenWithin is how long Start waits for a process to listen: a safety
// net for a loaded machine, not a budget. A process that exits first
// fails the test at once.
const ListenWithin = 5 * time.Minute

// logTail is how much of the log a failure shows.
const logTail = 4096

// FreeAddr returns a loopback address (127.0.0.1:port) with a port nobody
// listens on now and that FreeAddr has not returned before in this
// process: the kernel may hand a probed port out again once its listener
// is closed, and two servers of one test given the same port fail to
// start.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	given.mu.Lock()
	defer given.mu.Unlock()
	for i := range 1000 {
		// The kernel's pick first; once it repeats itself, a random port
		// below its ephemeral range, where it does not pick.
		probe := "127.0.0.1:0"
		if i > 0 {
			probe = fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000))
		}
		ln, err := net.Listen("tcp", probe)
		if err != nil {
			continue
		}
		addr := ln.Addr().String()
		ln.Close()
		if !given.addrs[addr] {
			given.addrs[addr] = true
			return addr
		}
	}
	tb.Fatal("no free loopback port that FreeAddr has not handed out")
	return ""
}

// given holds the addresses FreeAddr has handed out.
var given = struct {
	mu    sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// Options say how Start runs a process. The zero value works.
type Options struct {
	// Log is the file the process's output is appended to (default
	// "process.log" in a new tb.TempDir()). A process started again on the
	// same file keeps one log.
	Log string
	// Stop ends the process when the test ends, or when Process.Stop is
	// called (default: kill it). Start waits for the process to exit
	// after Stop returns.
	Stop func(p *Process)
}

// Process is a process Start started.
type Process struct {
	// Cmd is the started command; Cmd.ProcessState is set once it exited.
	Cmd *exec.Cmd
	// Log is the path of the process's output.
	Log  string
	opts Options
	done chan struct{}
}

// Start starts cmd (its Stdout and Stderr go to the log) and returns once
// it accepts TCP connections on every address of addrs. It fails tb with
// the end of the log when the process exits first or ListenWithin
// passes, and stops the process when tb ends. The process is SIGKILLed
// when the test process dies (StartTied).
func Start(tb testing.TB, cmd *exec.Cmd, opts Options, addrs ...string) *Process {
	tb.Helper()
	if opts.Log == "" {
		opts.Log = filepath.Join(tb.TempDir(), "process.log")
	}
	logf, err := os.OpenFile(opts.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := StartTied(cmd); err != nil {
		logf.Close()
		tb.Fatalf("start %s: %v", cmd.Path, err)
	}
	p := &Process{Cmd: cmd, Log: opts.Log, opts: opts, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	tb.Cleanup(func() {
		p.Stop()
		if tb.Failed() {
			tb.Logf("%s log (pid %d, tail):\n%s", filepath.Base(cmd.Path), cmd.Process.Pid, p.tail())
		}
	})
	deadline := time.Now().Add(ListenWithin)
	for _, addr := range addrs {
		for {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				conn.Close()
				break
			}
			if p.Exited() {
				tb.Fatalf("%s exited (%v) before it listened on %s:\n%s", filepath.Base(cmd.Path), cmd.ProcessState, addr, p.tail())
			}
			if time.Now().After(deadline) {
				tb.Fatalf("%s not listening on %s after %s:\n%s", filepath.Base(cmd.Path), addr, ListenWithin, p.tail())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return p
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process (Options.Stop, default kill) and waits until it
// exited. Stopping an ended process does nothing but wait.
func (p *Process) Stop() {
	if !p.Exited() {
		if p.opts.Stop != nil {
			p.opts.Stop(p)
		} else {
			_ = p.Cmd.Process.Kill()
		}
	}
	<-p.done
}

// tail is the end of the log.
func (p *Process) tail() string {
	b, _ := os.ReadFile(p.Log)
	if len(b) > logTail {
		b = b[len(b)-logTail:]
	}
	return string(b)
}
