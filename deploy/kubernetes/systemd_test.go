package kubernetes

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	unitFile = "../systemd/sidecar.service"
	envFile  = "../systemd/sidecar.env"
)

// unit is a parsed systemd unit file: section -> key -> values in order.
type unit map[string]map[string][]string

func (u unit) get(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// parseUnit reads the INI subset systemd unit files use: [Section],
// Key=Value, comments with # or ;, repeated keys, no continuation lines
// (this test refuses them to stay simple).
func parseUnit(text string) (unit, error) {
	u := unit{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case strings.HasSuffix(line, "\\"):
			return nil, fmt.Errorf("line %d: continuation lines are not supported here", n)
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				return nil, fmt.Errorf("line %d: want Key=Value inside a section: %q", n, line)
			}
			k = strings.TrimSpace(k)
			u[section][k] = append(u[section][k], strings.TrimSpace(v))
		}
	}
	return u, sc.Err()
}

// parseEnvFile reads KEY=VALUE lines; # starts a comment line.
func parseEnvFile(text string) (map[string]string, error) {
	env := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: want KEY=VALUE: %q", n, line)
		}
		if _, dup := env[k]; dup {
			return nil, fmt.Errorf("line %d: %s set twice", n, k)
		}
		env[k] = v
	}
	return env, sc.Err()
}

// parseTimespan reads the systemd time spans this unit uses: a number with
// an optional unit, e.g. "90", "90s", "2min", "1min 30s".
func parseTimespan(s string) (time.Duration, error) {
	var total time.Duration
	for _, part := range strings.Fields(s) {
		part = strings.Replace(part, "min", "m", 1)
		if strings.Trim(part, "0123456789") == "" {
			part += "s" // a bare number is seconds
		}
		d, err := time.ParseDuration(part)
		if err != nil {
			return 0, fmt.Errorf("time span %q: %w", s, err)
		}
		total += d
	}
	if total == 0 {
		return 0, fmt.Errorf("time span %q: empty or zero", s)
	}
	return total, nil
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestSystemdUnit(t *testing.T) {
	u, err := parseUnit(readFile(t, unitFile))
	if err != nil {
		t.Fatal(err)
	}
	env, err := parseEnvFile(readFile(t, envFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []struct{ section, key, want string }{
		{"Service", "Type", "simple"}, // the sidecar does not speak sd_notify
		{"Service", "ExecStart", "/usr/local/bin/sidecar serve"},
		{"Service", "User", "sidecar"},
		{"Service", "StateDirectory", "sidecar"},
		{"Service", "KillSignal", "SIGTERM"},
		// SIGTERM to the sidecar only: it lets running command steps finish.
		{"Service", "KillMode", "mixed"},
		{"Service", "Restart", "on-failure"},
		{"Service", "NoNewPrivileges", "yes"},
		{"Service", "ProtectSystem", "strict"},
		{"Service", "PrivateTmp", "yes"},
		{"Unit", "After", "network-online.target"},
		{"Install", "WantedBy", "multi-user.target"},
	} {
		if got := u.get(kv.section, kv.key); got != kv.want {
			t.Errorf("[%s] %s: got %q want %q", kv.section, kv.key, got, kv.want)
		}
	}
	t.Run("EnvironmentFile", func(t *testing.T) {
		if got, want := u.get("Service", "EnvironmentFile"), "/etc/sidecar/sidecar.env"; got != want {
			t.Errorf("EnvironmentFile: got %q want %q (where sidecar.env is installed)", got, want)
		}
		for k := range env {
			if !flags.isFlag(k) {
				t.Errorf("%s sets %s, which is no flag of sidecar serve", envFile, k)
			}
		}
		for _, name := range envNamesIn(readFile(t, envFile) + readFile(t, unitFile)) {
			if !flags.isFlag(name) {
				t.Errorf("%s is named in deploy/systemd but is no flag of sidecar serve", name)
			}
		}
	})
	// The settings a reader looks for in the env file are there, as
	// commented examples (each a flag of serve, checked above).
	t.Run("NamesProxyAdoptionRetention", func(t *testing.T) {
		named := envNamesIn(readFile(t, envFile))
		for _, want := range []string{"SIDECAR_CONDUCTOR_PROXY_LISTEN", "SIDECAR_ADOPT", "SIDECAR_ADOPT_INTERVAL",
			"SIDECAR_RETAIN_FINISHED", "SIDECAR_ARCHIVE", "SIDECAR_RETENTION_STORE", "SIDECAR_RETENTION_NATS_PASSWORD_FILE"} {
			if !slices.Contains(named, want) {
				t.Errorf("%s does not name %s", envFile, want)
			}
		}
	})
	t.Run("DataDirIsStateDirectory", func(t *testing.T) {
		state := "/var/lib/" + u.get("Service", "StateDirectory")
		if got := env["SIDECAR_DATA_DIR"]; got != state {
			t.Errorf("SIDECAR_DATA_DIR %q: want the StateDirectory %s", got, state)
		}
		if rw := u[("Service")]["ReadWritePaths"]; !strings.Contains(strings.Join(rw, " "), state) {
			t.Errorf("ReadWritePaths %v: want %s", rw, state)
		}
	})
	// If the sidecar dies (kill -9, OOM), what its command steps started
	// must not outlive it: systemd kills the rest of the unit's control
	// group before Restart= starts the sidecar again (mixed: SIGKILL;
	// control-group: SIGTERM, then SIGKILL after TimeoutStopSec). KillMode=process or none would leave them running
	// beside the next try of their step.
	t.Run("CrashLeavesNoStepRunning", func(t *testing.T) {
		if mode := u.get("Service", "KillMode"); mode != "mixed" && mode != "control-group" {
			t.Errorf("KillMode=%s: want mixed or control-group, so that systemd kills the steps a dead sidecar left", mode)
		}
		if v := u.get("Service", "SendSIGKILL"); v != "" && v != "yes" {
			t.Errorf("SendSIGKILL=%s: want yes (the default), or a step that ignores SIGTERM outlives the sidecar", v)
		}
		if _, err := parseTimespan(u.get("Service", "TimeoutStopSec")); err != nil {
			t.Errorf("TimeoutStopSec: want a finite time span, after which systemd sends SIGKILL: %v", err)
		}
	})
	t.Run("StopTimeout", func(t *testing.T) {
		stop, err := parseTimespan(u.get("Service", "TimeoutStopSec"))
		if err != nil {
			t.Fatal(err)
		}
		grace := flags.shutdownGrace(t, env["SIDECAR_SHUTDOWN_GRACE"])
		if stop < grace+stopBudget {
			t.Errorf("TimeoutStopSec %v: want >= shutdown grace %v + %v", stop, grace, stopBudget)
		}
	})
}

// TestSystemdUnit_Verify runs systemd-analyze verify on the unit, with
// ExecStart pointing at a built sidecar (verify requires the binary to
// exist). Any message is a failure: verify exits 0 on unknown keys.
func TestSystemdUnit_Verify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed; TestSystemdUnit checked the unit's content")
	}
	bin, err := filepath.Abs(sidecarBin)
	if err != nil {
		t.Fatal(err)
	}
	text := readFile(t, unitFile)
	if !strings.Contains(text, "ExecStart=/usr/local/bin/sidecar ") {
		t.Fatal("ExecStart does not run /usr/local/bin/sidecar")
	}
	text = strings.ReplaceAll(text, "ExecStart=/usr/local/bin/sidecar ", "ExecStart="+bin+" ")
	check := func(t *testing.T, text string) string {
		path := filepath.Join(t.TempDir(), "sidecar.service")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("%v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	t.Run("OK", func(t *testing.T) {
		if msg := check(t, text); msg != "" {
			t.Errorf("systemd-analyze verify: %s", msg)
		}
	})
	// The check can fail: a misspelt key is reported.
	t.Run("UnknownKey", func(t *testing.T) {
		if msg := check(t, strings.Replace(text, "\nKillMode=mixed\n", "\nKillMood=mixed\n", 1)); !strings.Contains(msg, "KillMood") {
			t.Errorf("systemd-analyze verify did not report an unknown key: %q", msg)
		}
	})
}

func TestParseTimespan(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{{"90", 90 * time.Second}, {"90s", 90 * time.Second}, {"2min", 2 * time.Minute}, {"1min 30s", 90 * time.Second}} {
		if got, err := parseTimespan(tc.in); err != nil || got != tc.want {
			t.Errorf("parseTimespan(%q): got %v, %v want %v", tc.in, got, err, tc.want)
		}
	}
	if _, err := parseTimespan("infinity"); err == nil {
		t.Error("parseTimespan(infinity): got no error")
	}
}
