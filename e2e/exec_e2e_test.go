package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_ExecTrustBoundary runs plans that try to reach what a plan must
// not: serve's environment, files outside the secret roots, the sidecar's
// own API and Conductor. The settings come from the environment variables
// (SIDECAR_SECRET_FILE_ROOT, SIDECAR_HTTP_ALLOW), which also tests their
// fallback.
func TestE2E_ExecTrustBoundary(t *testing.T) {
	leak := "bb2-" + uniq("leak")
	t.Setenv("E2E_SERVE_SECRET_TOKEN", leak) // inherited by the sidecar process

	root, outsideDir := t.TempDir(), t.TempDir()
	inside := filepath.Join(root, "token")
	outside := filepath.Join(outsideDir, "shadow")
	if err := os.WriteFile(inside, []byte("inside-secret-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(outside, []byte("outside-secret-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SIDECAR_SECRET_FILE_ROOT", root)
	t.Setenv("SIDECAR_HTTP_ALLOW", "127.0.0.1/32")

	allowed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer allowed.Close()
	cu, err := url.Parse(conductortest.URL(t))
	if err != nil {
		t.Fatal(err)
	}

	addr := sidecartest.FreeAddr(t)
	p := startServe(t, t.TempDir(), addr)

	step := func(executor, secrets string) string {
		s := `{"stepId":"s","executor":` + executor
		if secrets != "" {
			s += `,"secrets":` + secrets
		}
		return `{"planId":"` + uniq("e2e-trust") + `","planVersion":"1","steps":[` + s + `}]}`
	}
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	cases := []struct {
		name     string
		plan     string
		wantCode string // "" : the run completes
	}{
		{"CleanEnvironment", step(`{"type":"command","argv":["sh","-c","if env | grep -q E2E_SERVE_SECRET_TOKEN; then echo leaked; exit 1; fi; test -n \"$PATH\""]}`, ""), ""},
		{"FileInsideRoot", step(`{"type":"command","argv":["sh","-c","test \"$T\" = inside-secret-value"]}`, `[{"name":"T","ref":`+q("file:"+inside)+`}]`), ""},
		{"FileOutsideRoot", step(`{"type":"noop"}`, `[{"name":"T","ref":`+q("file:"+outside)+`}]`), "SECRET_REF_FORBIDDEN"},
		{"FileDotDot", step(`{"type":"noop"}`, `[{"name":"T","ref":`+q("file:"+root+"/../"+filepath.Base(outsideDir)+"/shadow")+`}]`), "SECRET_REF_FORBIDDEN"},
		{"FileSymlinkOut", step(`{"type":"noop"}`, `[{"name":"T","ref":`+q("file:"+filepath.Join(root, "link"))+`}]`), "SECRET_REF_FORBIDDEN"},
		{"HTTPAllowed", step(`{"type":"http","method":"GET","url":`+q(allowed.URL+"/")+`}`, ""), ""},
		{"HTTPOwnAPI", step(`{"type":"http","method":"GET","url":`+q("http://"+addr+"/healthz")+`}`, ""), "HTTP_DESTINATION_FORBIDDEN"},
		{"HTTPOwnAPIByName", step(`{"type":"http","method":"GET","url":`+q("http://localhost:"+addr[strings.LastIndexByte(addr, ':')+1:]+"/healthz")+`}`, ""), "HTTP_DESTINATION_FORBIDDEN"},
		{"HTTPConductor", step(`{"type":"http","method":"GET","url":`+q("http://"+cu.Host+"/health")+`}`, ""), "HTTP_DESTINATION_FORBIDDEN"},
		{"HTTPMetadata", step(`{"type":"http","method":"GET","url":"http://169.254.169.254/latest/meta-data/"}`, ""), "HTTP_DESTINATION_FORBIDDEN"},
	}
	runIDs := map[string]string{}
	for i, c := range cases {
		runIDs[c.name] = submit(t, p, mustPlan(t, c.plan), fmt.Sprintf("req-%d", i)).RunID
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			failed := requireOutcome(t, p, runIDs[c.name], c.wantCode, 60*time.Second)
			if c.wantCode == "" {
				return
			}
			if strings.Contains(failed[0], `"retryable":true`) {
				t.Errorf("%s must not be retryable: %s", c.wantCode, failed[0])
			}
		})
	}
	b, _ := os.ReadFile(p.log.Name())
	for _, s := range []string{leak, "outside-secret-value"} {
		if strings.Contains(string(b), s) {
			t.Errorf("the sidecar log contains %q", s)
		}
	}
}

// requireOutcome waits for runID to end and fails t unless it COMPLETED
// (wantCode empty) or its first StepFailed carries wantCode. It returns
// the payloads of the run's StepFailed events.
func requireOutcome(t *testing.T, p *proc, runID, wantCode string, within time.Duration) []string {
	t.Helper()
	v := waitTerminal(t, p, runID, within)
	var failed []string
	for _, e := range allEvents(t, p, runID) {
		if e.EventType == statestore.StepFailed {
			failed = append(failed, string(e.Payload))
		}
	}
	if wantCode == "" {
		if v.Status != statestore.RunStatusCompleted {
			t.Fatalf("run %s, want COMPLETED; failures %v", v.Status, failed)
		}
		return failed
	}
	if len(failed) == 0 || !strings.Contains(failed[0], `"code":"`+wantCode+`"`) {
		t.Fatalf("run %s, step failures %v, want %s", v.Status, failed, wantCode)
	}
	return failed
}
