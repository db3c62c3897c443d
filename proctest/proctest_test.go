package proctest_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/proctest"
)

// envListen makes this test binary a server that listens on its value
// (TestHelperServer).
const envListen = "PROCTEST_LISTEN"

// TestHelperServer is the server process of the tests: it listens on
// $PROCTEST_LISTEN until it is killed.
func TestHelperServer(t *testing.T) {
	addr := os.Getenv(envListen)
	if addr == "" {
		t.Skip("the server process of TestStart")
	}
	fmt.Println("listening on", addr)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}

// fatalTB records a Fatalf instead of failing the test that runs it.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestStart(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		addr := proctest.FreeAddr(t)
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServer$")
		cmd.Env = append(os.Environ(), envListen+"="+addr)
		p := proctest.Start(t, cmd, proctest.Options{}, addr)
		if c, err := net.Dial("tcp", addr); err != nil {
			t.Fatalf("Start returned before the process listened: %v", err)
		} else {
			c.Close()
		}
		p.Stop()
		if !p.Exited() {
			t.Fatal("the process runs on after Stop")
		}
		if b, _ := os.ReadFile(p.Log); !strings.Contains(string(b), "listening on "+addr) {
			t.Fatalf("log %q lacks the process's output", b)
		}
	})
	t.Run("ExitsFirst", func(t *testing.T) {
		tb := &fatalTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			proctest.Start(tb, exec.Command("sh", "-c", "echo no config; exit 3"), proctest.Options{}, proctest.FreeAddr(t))
		}()
		<-done
		if !strings.Contains(tb.msg, "exited") || !strings.Contains(tb.msg, "no config") {
			t.Fatalf("failure %q, want the exit and the log's tail", tb.msg)
		}
	})
}
