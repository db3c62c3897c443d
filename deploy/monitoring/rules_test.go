package monitoring_test

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
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
	if !strings.Contains(out, "SUCCESS: 16 rules found") {
		t.Fatalf("promtool check rules: want 16 rules:\n%s", out)
	}
}

func TestAlertRules_UnitTests(t *testing.T) {
	out := promtool(t, filepath.Join(repoRoot, "deploy/prometheus"), "test", "rules", "alerts_test.yml")
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules:\n%s", out)
	}
	// Every alert has cases: one where it fires, one where it stays silent.
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/prometheus/alerts_test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	for _, r := range loadAlertRules(t) {
		if !fires[r.Alert] || !silent[r.Alert] {
			t.Errorf("%s: alerts_test.yml has a case where it fires: %v, where it stays silent: %v; want both", r.Alert, fires[r.Alert], silent[r.Alert])
		}
	}
}

func TestAlertRules_ExampleConfig(t *testing.T) {
	promtool(t, filepath.Join(repoRoot, "deploy/prometheus"), "check", "config", "prometheus.yml")
}

// TestAlertRules_Names checks that the rules file has exactly the alerts
// the sidecar's docs and log codes name, each with a severity and an
// absolute runbook_url (an Alertmanager receiver or a pager cannot resolve
// a relative one) to the alert's section of docs/operations.md.
func TestAlertRules_Names(t *testing.T) {
	rules := loadAlertRules(t)
	want := []string{"PAUSE_DRAIN_TIMEOUT", "PROJECTOR_LAG_HIGH", "INVALID_TRANSITION", "PROJECTOR_NON_CONTIGUOUS_FETCH_DETECTED", "PROJECTOR_SNAPSHOT_MISMATCH", "ENGINE_UNAVAILABLE", "WORKER_POLL_ERRORS", "STUCK_WORKFLOW", "TASK_WAITING_FOR_WORKER", "WORKFLOW_NOT_FOUND", "EVENT_BUS_DELIVERY_FAILED",
		"EVENT_BUS_STALLED", "ARCHIVE_FAILING", "DATA_DIR_FULL_PREDICTED", "SIDECAR_DOWN", "SIDECAR_ABSENT"}
	headings := operationsHeadings(t)
	if len(rules) != len(want) {
		t.Errorf("got %d alerts, want %d", len(rules), len(want))
	}
	for i, r := range rules {
		if i >= len(want) || r.Alert != want[i] {
			t.Errorf("alert %d: got %s, want %s", i, r.Alert, want[i])
		}
		if r.Labels["severity"] == "" {
			t.Errorf("%s: no severity label", r.Alert)
		}
		checkRunbookURL(t, r.Alert, r.Annotations["runbook_url"], headings)
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: summary and description annotations required", r.Alert)
		}
	}
}

// runbookBase is where the runbooks are published: docs/operations.md of
// the repository, whose module path is github.com/conductor-sidecar/sidecar.
const runbookBase = "https://github.com/conductor-sidecar/sidecar/blob/main/docs/operations.md"

// checkRunbookURL: u is runbookBase#<alert in lower case>, and that anchor
// is a heading of docs/operations.md.
func checkRunbookURL(t *testing.T, alert, u string, headings map[string]bool) {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil || !parsed.IsAbs() || parsed.Host == "" {
		t.Errorf("%s: runbook_url %q is not an absolute URL (%v)", alert, u, err)
		return
	}
	if got, want := u, runbookBase+"#"+strings.ToLower(alert); got != want {
		t.Errorf("%s: runbook_url %q, want %q", alert, got, want)
	}
	if !headings[parsed.Fragment] {
		t.Errorf("%s: docs/operations.md has no heading with anchor #%s", alert, parsed.Fragment)
	}
}

// operationsHeadings returns the anchors GitHub gives the headings of
// docs/operations.md (lower case, spaces to '-', punctuation dropped).
func operationsHeadings(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			h = strings.TrimSpace(strings.TrimLeft(h, "#"))
			out[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
		}
	}
	return out
}

// TestAlertRules_ReadmeTable: deploy/prometheus/README.md's table lists
// every alert of alerts.yml with its severity; an alert whose runbook says
// nothing is lost by waiting (a timed-out drain) does not page.
func TestAlertRules_ReadmeTable(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/prometheus/README.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^ *\\| `([A-Z_]+)` \\|.*\\| (page|warning) \\|$")
	readme := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		readme[m[1]] = m[2]
	}
	rules := loadAlertRules(t)
	if len(readme) != len(rules) {
		t.Errorf("README lists %d alerts, alerts.yml has %d", len(readme), len(rules))
	}
	for _, r := range rules {
		if got := readme[r.Alert]; got != r.Labels["severity"] {
			t.Errorf("%s: README says severity %q, alerts.yml %q", r.Alert, got, r.Labels["severity"])
		}
	}
	for _, r := range rules {
		if r.Alert == "PAUSE_DRAIN_TIMEOUT" && r.Labels["severity"] == "page" {
			t.Errorf("PAUSE_DRAIN_TIMEOUT pages; its runbook says nothing is lost by waiting: want warning")
		}
	}
}
