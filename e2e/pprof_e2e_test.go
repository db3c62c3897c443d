package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
)

// TestE2E_HTTPStepCannotReachOwnListeners: with every loopback address
// allowed (--http-allow 127.0.0.0/8), an http step still cannot reach the
// sidecar's pprof listener or its embedded NATS listener: they are always
// denied, like the API and Conductor. Another loopback server is reached.
func TestE2E_HTTPStepCannotReachOwnListeners(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "nats.pw")
	if err := os.WriteFile(pw, []byte("e2e-nats-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	allowed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer allowed.Close()
	pprofAddr, natsAddr := sidecartest.FreeAddr(t), sidecartest.FreeAddr(t)
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--http-allow", "127.0.0.0/8", "--pprof-listen", pprofAddr,
		"--nats-listen", natsAddr, "--nats-password-file", pw)
	// The listeners are up: pprof answers the test itself.
	if resp, err := http.Get("http://" + pprofAddr + "/debug/pprof/cmdline"); err != nil {
		t.Fatalf("pprof not listening: %v", err)
	} else {
		resp.Body.Close()
	}
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	cases := []struct{ name, url, wantCode string }{
		{"Allowed", allowed.URL + "/", ""},
		{"Pprof", "http://" + pprofAddr + "/debug/pprof/cmdline", "HTTP_DESTINATION_FORBIDDEN"},
		{"PprofByName", "http://localhost:" + pprofAddr[strings.LastIndexByte(pprofAddr, ':')+1:] + "/debug/pprof/", "HTTP_DESTINATION_FORBIDDEN"},
		{"NATS", "http://" + natsAddr + "/", "HTTP_DESTINATION_FORBIDDEN"},
	}
	runIDs := map[string]string{}
	for i, c := range cases {
		pl := mustPlan(t, `{"planId":"`+uniq("e2e-listeners")+`","planVersion":"1","steps":[{"stepId":"s","executor":{"type":"http","method":"GET","url":`+q(c.url)+`}}]}`)
		runIDs[c.name] = submit(t, p, pl, fmt.Sprintf("req-%d", i)).RunID
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			requireOutcome(t, p, runIDs[c.name], c.wantCode, 2*time.Minute)
		})
	}
}
