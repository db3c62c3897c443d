package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
)

// TestServe_APIAuthentication drives the binary: a non-loopback --listen
// without a tokens file is refused; with one, the API wants a token of
// the right role, the CLI sends --token, the principal is the requestedBy
// of the pause in the log, and SIGHUP reloads the file.
func TestServe_APIAuthentication(t *testing.T) {
	t.Run("OpenListenerRefused", func(t *testing.T) {
		_, port, _ := strings.Cut(sidecartest.FreeAddr(t), ":")
		line := lastLine(serveMustRefuse(t, 15*time.Second, "--data-dir", t.TempDir(), "--listen", "0.0.0.0:"+port))
		if !strings.Contains(line, "no authentication") || !strings.Contains(line, "--tokens-file") {
			t.Fatalf("refusal does not say why and how to fix it: %q", line)
		}
	})

	dir := t.TempDir()
	opsToken, opsEntry := newToken(t, "oncall-alice", "operator,viewer,submitter")
	tokens := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokens, []byte("principals:\n"+opsEntry), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--tokens-file", tokens)
	if resp, err := http.Get("http://" + p.addr + "/v1/runs/x"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET without a token: %v %v, want 401", resp, err)
	}
	p.client.Token = opsToken
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-auth")+`","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"sleep","seconds":2}}]}`)
	run := submit(t, p, pl, uniq("auth"))
	out, err := exec.Command(sidecartest.Binary(t), "pause", run.RunID, "--server", "http://"+p.addr, "--token", opsToken).CombinedOutput()
	if err != nil {
		t.Fatalf("sidecar pause --token: %v\n%s", err, out)
	}
	var by string
	for _, ev := range allEvents(t, p, run.RunID) {
		if ev.EventType == "RunPaused" {
			var pay struct{ RequestedBy string }
			_ = json.Unmarshal(ev.Payload, &pay)
			by = pay.RequestedBy
		}
	}
	if by != "oncall-alice" {
		t.Fatalf("RunPaused requestedBy %q, want the token's principal oncall-alice", by)
	}

	// SIGHUP: a new token works, the removed one no longer does.
	newTok, newEntry := newToken(t, "oncall-bob", "viewer")
	if err := os.WriteFile(tokens, []byte("principals:\n"+newEntry), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := httpapi.NewClient("http://" + p.addr)
		c.Token = newTok
		_, errNew := c.Run(context.Background(), run.RunID)
		_, errOld := p.client.Run(context.Background(), run.RunID)
		if errNew == nil && errOld != nil && strings.Contains(errOld.Error(), "UNAUTHENTICATED") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGHUP: new token %v, old token %v", errNew, errOld)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
