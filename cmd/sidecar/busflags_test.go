package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServe_BusSinkPrefixOfTheSidecarsOwn: a nats sink whose subjects or
// stream would be the sidecar's own is refused with the configuration
// (exit 2, BUS_SINK_INVALID), before the data directory is touched.
func TestServe_BusSinkPrefixOfTheSidecarsOwn(t *testing.T) {
	for _, prefix := range []string{"sidecar", "SIDECAR", "kv_x", "a b"} {
		t.Run(prefix, func(t *testing.T) {
			dir := t.TempDir()
			code, _, errOut := run(t, "serve", "--data-dir", dir, "--bus-sink", "nats:prefix="+prefix)
			if code != exitUsage || !strings.Contains(errOut, "BUS_SINK_INVALID") || !strings.Contains(errOut, "--bus-sink") {
				t.Fatalf("exit %d, stderr %q; want exit 2 with BUS_SINK_INVALID", code, errOut)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Fatalf("the data dir holds %d entries after a refused configuration", len(entries))
			}
		})
	}
}

// TestServe_ListenAddresses: every listener's address is HOST:PORT with a
// port from 0 to 65535, checked with the configuration (exit 2 naming the
// flag), not found out when serve binds it after starting its store.
func TestServe_ListenAddresses(t *testing.T) {
	for _, tc := range []struct{ flag, addr string }{
		{"--listen", "127.0.0.1:99999"},
		{"--listen", "127.0.0.1:-1"},
		{"--listen", "127.0.0.1:http"},
		{"--metrics-listen", "127.0.0.1:70000"},
		{"--nats-listen", "127.0.0.1:65536"},
		{"--conductor-proxy-listen", "127.0.0.1:99999"},
		{"--conductor-proxy-listen", "nonsense"},
	} {
		t.Run(tc.flag+" "+tc.addr, func(t *testing.T) {
			dir := t.TempDir()
			args := []string{"serve", "--data-dir", dir, tc.flag, tc.addr}
			if tc.flag == "--nats-listen" {
				args = append(args, "--nats-password-file", writeSecret(t, "pw-0123456789abcdef"))
			}
			code, _, errOut := run(t, args...)
			if code != exitUsage || !strings.Contains(errOut, tc.flag+" \""+tc.addr+"\"") {
				t.Fatalf("exit %d, stderr %q; want exit 2 naming %s %q", code, errOut, tc.flag, tc.addr)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Fatalf("the data dir holds %d entries after a refused configuration", len(entries))
			}
		})
	}
}

// writeSecret writes s to a file only its owner reads, and returns its path.
func writeSecret(t *testing.T, s string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestServe_BusSinkSpecIsNotEchoed: a --bus-sink that does not parse (a
// comma inside the URL's query, a key given twice) is refused (exit 2,
// BUS_SINK_INVALID) without printing the URL, which may carry a
// credential: before, the whole value was printed, twice, token and all.
func TestServe_BusSinkSpecIsNotEchoed(t *testing.T) {
	secret := writeSecret(t, "0123456789abcdef-secret")
	for _, spec := range []string{
		"webhook:url=https://u:s3cretpw@hooks.example/h?token=TOPSECRET,x,secret-file=" + secret,
		"webhook:url=https://hooks.example/h?token=TOPSECRET,url=https://other.example/TOPSECRET,secret-file=" + secret,
	} {
		dir := t.TempDir()
		code, _, errOut := run(t, "serve", "--data-dir", dir, "--bus-sink", spec)
		if code != exitUsage || !strings.Contains(errOut, "BUS_SINK_INVALID") || strings.Contains(errOut, "TOPSECRET") || strings.Contains(errOut, "s3cretpw") {
			t.Fatalf("%s: exit %d, stderr %q; want exit 2 with BUS_SINK_INVALID, not showing the URL", spec, code, errOut)
		}
	}
}

// TestServe_BusSinkNameCheckedWithTheConfiguration: a sink name that
// cannot key its cursor is refused with the other settings (exit 2,
// BUS_SINK_INVALID), before the data directory is touched; before, serve
// found out after starting its store (exit 1).
func TestServe_BusSinkNameCheckedWithTheConfiguration(t *testing.T) {
	for _, name := range []string{"a.b", "a*", "a b"} {
		dir := t.TempDir()
		code, _, errOut := run(t, "serve", "--data-dir", dir, "--bus-sink", "nats:prefix=acme,name="+name)
		if code != exitUsage || !strings.Contains(errOut, "BUS_SINK_INVALID") {
			t.Fatalf("name=%s: exit %d, stderr %q; want exit 2 with BUS_SINK_INVALID", name, code, errOut)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Fatalf("name=%s: the data dir holds %d entries after a refused configuration", name, len(entries))
		}
	}
}

// TestServe_BusSinkSecretFileCheckedWithTheConfiguration: a webhook's
// secret file that cannot be read, or holds too short a key, is refused
// with the other settings (exit 2, BUS_SINK_INVALID), before the data
// directory is touched; before, serve found out after starting its store
// (exit 1, no code).
func TestServe_BusSinkSecretFileCheckedWithTheConfiguration(t *testing.T) {
	for name, file := range map[string]string{"missing": filepath.Join(t.TempDir(), "none"), "short": writeSecret(t, "short")} {
		dir := t.TempDir()
		code, _, errOut := run(t, "serve", "--data-dir", dir, "--bus-sink", "webhook:url=https://hooks.example/h,secret-file="+file)
		if code != exitUsage || !strings.Contains(errOut, "BUS_SINK_INVALID") {
			t.Fatalf("%s secret file: exit %d, stderr %q; want exit 2 with BUS_SINK_INVALID", name, code, errOut)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Fatalf("%s secret file: the data dir holds %d entries after a refused configuration", name, len(entries))
		}
	}
}
