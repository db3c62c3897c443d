package proctest_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/proctest"
)

// envHTTP makes this test binary an HTTP server that listens on its value
// (TestHelperHTTPServer).
const envHTTP = "PROCTEST_HTTP"

// TestHelperHTTPServer is the server process of TestFreeze: it answers
// every request on $PROCTEST_HTTP until it is killed.
func TestHelperHTTPServer(t *testing.T) {
	addr := os.Getenv(envHTTP)
	if addr == "" {
		t.Skip("the server process of TestFreeze")
	}
	t.Fatal(http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})))
}

// A process Freeze returned for answers nothing, even a request on a
// connection it has just answered on; thawed, it answers again. Repeated,
// on a busy machine: the kernel stops a process's threads after kill
// returns, later the busier the CPUs, and a thread still running then
// answers.
func TestFreeze(t *testing.T) {
	for range 3 * runtime.NumCPU() {
		busy := exec.Command("sh", "-c", "while :; do :; done")
		if err := proctest.StartTied(busy); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = busy.Process.Kill(); _ = busy.Wait() })
	}
	addr := proctest.FreeAddr(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHTTPServer$")
	cmd.Env = append(os.Environ(), envHTTP+"="+addr)
	p := proctest.Start(t, cmd, proctest.Options{}, addr)
	get := func(wait time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	for i := range 30 {
		if err := get(time.Minute); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		thaw := proctest.Freeze(t, p.Cmd.Process.Pid)
		if err := get(200 * time.Millisecond); err == nil {
			t.Fatalf("round %d: the frozen process answered", i)
		}
		thaw()
	}
}
