package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
)

// startServeUnprivileged is startServe for a serve whose command steps must
// not have CAP_SYS_PTRACE: run as root (a container), the test runs serve
// as nobody (65534), as a deployment runs it as its own user.
func startServeUnprivileged(t *testing.T, env []string, extra ...string) *proc {
	t.Helper()
	bin := sidecartest.Binary(t)
	dataDir := t.TempDir()
	addr := sidecartest.FreeAddr(t)
	args := append([]string{"serve", "--conductor-url", conductortest.URL(t), "--data-dir", filepath.Join(dataDir, "data"), "--listen", addr,
		"--worker-id", "e2e-" + filepath.Base(dataDir), "--task-domain", "e2e-" + filepath.Base(dataDir),
		"--log-format", "console", "--shutdown-grace", "5s"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	if os.Geteuid() == 0 {
		const nobody = 65534
		// nobody must reach the binary and the data dir (t.TempDir's root
		// is 0700).
		for _, dir := range []string{filepath.Dir(bin), filepath.Dir(dataDir), dataDir} {
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(dataDir, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		cmd.Dir = dataDir
		cmd.Env = append(cmd.Env, "HOME="+dataDir, "TMPDIR="+dataDir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	}
	s := sidecartest.StartProcess(t, cmd, addr)
	if err := s.WaitReady("/readyz", 2*time.Minute); err != nil { // a safety net: ready in seconds
		t.Fatal(err)
	}
	return newProc(s)
}

// TestE2E_CommandStepCannotReadServeSecrets: a command step runs as
// serve's user, as serve's child. It cannot read serve's environment
// through /proc/$PPID/environ (serve is not dumpable), and an env: secret
// resolves only variables --secret-env-allow names (default: none).
func TestE2E_CommandStepCannotReadServeSecrets(t *testing.T) {
	leak := uniq("parent-only-secret")
	p := startServeUnprivileged(t, []string{"E2E_PARENT_ONLY=" + leak, "E2E_ALLOWED_TOKEN=allowed-token-value"},
		"--secret-env-allow", "E2E_ALLOWED_*")
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	step := func(script, secrets string) string {
		s := `{"stepId":"s","executor":{"type":"command","argv":["sh","-c",` + q(script) + `]}`
		if secrets != "" {
			s += `,"secrets":` + secrets
		}
		return `{"planId":"` + uniq("e2e-environ") + `","planVersion":"1","steps":[` + s + `}]}`
	}
	cases := []struct{ name, plan, wantCode string }{
		// $PPID is serve (no shell between them); exit 3 if not, 4 if
		// its environ can be read.
		{"ParentEnviron", step(`grep -q sidecar /proc/$PPID/comm || exit 3; if cat /proc/$PPID/environ >/dev/null 2>&1; then echo readable; exit 4; fi`, ""), ""},
		{"AllowedEnvSecret", step(`test "$T" = allowed-token-value`, `[{"name":"T","ref":"env:E2E_ALLOWED_TOKEN"}]`), ""},
		{"OtherEnvSecret", step(`exit 0`, `[{"name":"T","ref":"env:E2E_PARENT_ONLY"}]`), "SECRET_REF_FORBIDDEN"},
	}
	runIDs := map[string]string{}
	for _, c := range cases {
		runIDs[c.name] = submit(t, p, mustPlan(t, c.plan), uniq("req")).RunID
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			requireOutcome(t, p, runIDs[c.name], c.wantCode, 2*time.Minute)
		})
	}
	b, _ := os.ReadFile(p.log.Name())
	if strings.Contains(string(b), leak) {
		t.Error("the sidecar log contains the parent-only secret")
	}
}
