// Package kubernetes holds the checks of the deployment files in
// deploy/kubernetes and deploy/systemd. It is its own Go module, so the
// Kubernetes API types stay out of the sidecar's dependency list.
package kubernetes

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
)

// repoRoot is the sidecar repository, two levels up.
const repoRoot = "../.."

// serveFlags is what `sidecar serve -h` says: each flag's environment
// variable and its default.
type serveFlags struct {
	defaults map[string]string // env name -> default ("" when none shown)
}

var flags *serveFlags

// sidecarBin is the sidecar binary the tests run.
var sidecarBin string

// TestMain builds the sidecar (or takes SIDECAR_TEST_BINARY; package
// sidecartest) and reads the flags of `sidecar serve -h` once for every
// test.
func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	bin, err := sidecartest.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sidecarBin = bin
	f, err := loadServeFlags(sidecarBin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "read the flags of sidecar serve:", err)
		return 1
	}
	flags = f
	return m.Run()
}

func loadServeFlags(bin string) (*serveFlags, error) {
	// Without SIDECAR_* in the environment, so that the defaults shown are
	// the built-in ones.
	cmd := exec.Command(bin, "serve", "-h")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SIDECAR_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, _ := cmd.CombinedOutput() // -h exits non-zero by design
	f, err := parseServeHelp(string(out))
	if err != nil {
		return nil, fmt.Errorf("%v; output was:\n%s", err, out)
	}
	return f, nil
}

var (
	flagLine    = regexp.MustCompile(`^\s+-([a-z0-9-]+)\b`)
	envInUsage  = regexp.MustCompile(`\(env (SIDECAR_[A-Z0-9_]+)\)`)
	defaultInfo = regexp.MustCompile(`\(default "?([^")]*)"?\)\s*$`)
)

// parseServeHelp reads the flag package's usage output: "  -name type"
// followed by an indented usage line carrying "(env SIDECAR_…)" and
// "(default …)".
func parseServeHelp(help string) (*serveFlags, error) {
	f := &serveFlags{defaults: map[string]string{}}
	var flag string
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		line := sc.Text()
		if m := flagLine.FindStringSubmatch(line); m != nil && !strings.HasPrefix(line, "    \t") {
			flag = m[1]
			continue
		}
		m := envInUsage.FindStringSubmatch(line)
		if m == nil || flag == "" {
			continue
		}
		if want := "SIDECAR_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_")); m[1] != want {
			return nil, fmt.Errorf("flag -%s documents env %s, want %s", flag, m[1], want)
		}
		def := ""
		if d := defaultInfo.FindStringSubmatch(line); d != nil {
			def = d[1]
		}
		f.defaults[m[1]] = def
		flag = ""
	}
	// The names scripts rely on (docs/operations.md, "Upgrading"); if they are missing the parsing is broken.
	for _, name := range []string{"SIDECAR_CONDUCTOR_URL", "SIDECAR_NATS_URL", "SIDECAR_DATA_DIR", "SIDECAR_LISTEN", "SIDECAR_DRAIN_TIMEOUT", "SIDECAR_SHUTDOWN_GRACE", "SIDECAR_WORKER_ID"} {
		if _, ok := f.defaults[name]; !ok {
			return nil, fmt.Errorf("serve -h does not list %s", name)
		}
	}
	return f, nil
}

// isFlag reports whether env is the variable of a flag of `sidecar serve`.
func (f *serveFlags) isFlag(env string) bool {
	_, ok := f.defaults[env]
	return ok
}

// shutdownGrace returns the grace period configured by value, or the
// built-in default when value is empty.
func (f *serveFlags) shutdownGrace(t *testing.T, value string) time.Duration {
	t.Helper()
	if value == "" {
		value = f.defaults["SIDECAR_SHUTDOWN_GRACE"]
	}
	d, err := time.ParseDuration(value)
	if err != nil {
		t.Fatalf("shutdown grace %q: %v", value, err)
	}
	return d
}

// stopBudget is how much longer than the shutdown grace a stop may take:
// interrupted commands get SIGKILL 10s after SIGTERM
// (taskworkers/exec.DefaultKillGrace), then tasks are handed back to
// Conductor and the API, drain controller and watcher close (5s each at
// most). docs/operations.md states the same rule.
const stopBudget = 60 * time.Second

var sidecarEnvName = regexp.MustCompile(`\bSIDECAR_[A-Z0-9_]+\b`)

// envNamesIn returns every SIDECAR_* name in text, comments included.
func envNamesIn(text string) []string {
	return sidecarEnvName.FindAllString(text, -1)
}

func TestParseServeHelp(t *testing.T) {
	help := "Usage: sidecar serve [flags]\n\nFlags:\n" +
		"  -data-dir string\n    \tembedded NATS store directory (env SIDECAR_DATA_DIR) (default \"./data\")\n" +
		"  -shutdown-grace value\n    \thow long (env SIDECAR_SHUTDOWN_GRACE) (default 30s)\n" +
		"  -nats-url string\n    \texternal NATS URL (env SIDECAR_NATS_URL)\n"
	t.Run("MissingNames", func(t *testing.T) {
		if _, err := parseServeHelp(help); err == nil {
			t.Fatal("got no error for a help text without SIDECAR_CONDUCTOR_URL")
		}
	})
	t.Run("OK", func(t *testing.T) {
		for _, n := range []string{"conductor-url", "listen", "drain-timeout", "worker-id"} {
			help += "  -" + n + " string\n    \tx (env " + "SIDECAR_" + strings.ToUpper(strings.ReplaceAll(n, "-", "_")) + ")\n"
		}
		f, err := parseServeHelp(help)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := f.defaults["SIDECAR_DATA_DIR"], "./data"; got != want {
			t.Errorf("data dir default: got %q want %q", got, want)
		}
		if got, want := f.defaults["SIDECAR_SHUTDOWN_GRACE"], "30s"; got != want {
			t.Errorf("shutdown grace default: got %q want %q", got, want)
		}
		if f.isFlag("SIDECAR_BOGUS") {
			t.Error("SIDECAR_BOGUS is a flag")
		}
	})
}
