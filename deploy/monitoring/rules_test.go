package monitoring_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the module root, seen from this package's directory (go test
// runs a package's tests in its source directory).
const repoRoot = "../.."

// promDir is where deploy/prometheus/install.sh puts the binaries (Debian's
// prometheus package).
const promDir = "/usr/bin"

// tool returns the path of a Prometheus binary (prometheus, promtool) from
// PATH or promDir, or skips the test.
func tool(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := filepath.Join(promDir, name); isExecutable(p) {
		return p
	}
	t.Skipf("%s is not installed: run deploy/prometheus/install.sh (Debian's prometheus package) to run this test", name)
	return ""
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// promtool runs promtool with args in dir and fails the test, with its
// output, unless it exits 0.
func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(tool(t, "promtool"), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestAlertRules_Check(t *testing.T) {
	out := promtool(t, filepath.Join(repoRoot, "deploy/prometheus"), "check", "rules", "alerts.yml")
	if !strings.Contains(out, "SUCCESS: 7 rules found") {
		t.Fatalf("promtool check rules: want 7 rules:\n%s", out)
	}
}

func TestAlertRules_UnitTests(t *testing.T) {
	out := promtool(t, filepath.Join(repoRoot, "deploy/prometheus"), "test", "rules", "alerts_test.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules:\n%s", out)
	}
}

func TestAlertRules_ExampleConfig(t *testing.T) {
	promtool(t, filepath.Join(repoRoot, "deploy/prometheus"), "check", "config", "prometheus.yml")
}

// TestAlertRules_Names checks that the rules file has exactly the alerts
// the sidecar's docs and log codes name, each with a severity and a
// runbook anchor in docs/operations.md.
func TestAlertRules_Names(t *testing.T) {
	rules := loadAlertRules(t)
	want := []string{"PAUSE_DRAIN_TIMEOUT", "PROJECTOR_LAG_HIGH", "INVALID_TRANSITION", "ENGINE_UNAVAILABLE", "WORKER_POLL_ERRORS", "STUCK_WORKFLOW", "EVENT_BUS_DELIVERY_FAILED"}
	if len(rules) != len(want) {
		t.Fatalf("got %d alerts, want %d", len(rules), len(want))
	}
	for i, r := range rules {
		if r.Alert != want[i] {
			t.Errorf("alert %d: got %s, want %s", i, r.Alert, want[i])
		}
		if r.Labels["severity"] == "" {
			t.Errorf("%s: no severity label", r.Alert)
		}
		if got, want := r.Annotations["runbook_url"], "docs/operations.md#"+strings.ToLower(r.Alert); got != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, got, want)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: summary and description annotations required", r.Alert)
		}
	}
}
