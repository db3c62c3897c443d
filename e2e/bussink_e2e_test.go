package e2e

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/proctest"
)

// TestServe_RefusesWebhookToItself: a webhook sink whose URL reaches the
// sidecar's own API (by its address, by localhost, by 0.0.0.0) is refused
// at start with one line naming the sink and the fix; serve never becomes
// ready.
func TestServe_RefusesWebhookToItself(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "hook.key")
	if err := os.WriteFile(secret, []byte("whsec-test-secret-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := sidecartest.FreeAddr(t)
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	for _, url := range []string{"http://" + addr + "/v1/runs", "http://localhost:" + port + "/hook?token=abc", "http://0.0.0.0:" + port + "/"} {
		t.Run(url, func(t *testing.T) {
			var out bytes.Buffer
			cmd := exec.Command(sidecartest.Binary(t), "serve", "--conductor-url", conductortest.URL(t), "--data-dir", t.TempDir(),
				"--listen", addr, "--log-format", "console", "--bus-sink", "webhook:name=self,url="+url+",secret-file="+secret)
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := proctest.StartTied(cmd); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			deadline := time.After(2 * time.Minute) // a safety net: the refusal comes at once
			for {
				select {
				case <-exited:
					if cmd.ProcessState.ExitCode() == 0 || !strings.Contains(out.String(), "--bus-sink self") ||
						!strings.Contains(out.String(), "own API") {
						t.Fatalf("serve exited %d; want a refusal naming the sink and the API:\n%s", cmd.ProcessState.ExitCode(), out.String())
					}
					if strings.Contains(out.String(), "token=abc") {
						t.Fatalf("the refusal shows the URL's query:\n%s", out.String())
					}
					return
				case <-deadline:
					_ = cmd.Process.Kill()
					t.Fatalf("serve neither exited nor became ready:\n%s", out.String())
				case <-time.After(100 * time.Millisecond):
				}
				if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						_ = cmd.Process.Kill()
						<-exited
						t.Fatalf("serve started with a webhook sink that delivers to its own API")
					}
				}
			}
		})
	}
}
