package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfig_RefusesReadableSecretFiles: a credential or token file that
// others (or a group not the sidecar's own) may read is refused at start
// with one line naming the file, its mode and the fix; the same file with
// mode 0600 (or 0400, or 0440 in the sidecar's own group: a Kubernetes
// Secret with fsGroup) is accepted.
func TestConfig_RefusesReadableSecretFiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		args func(file string) []string
		env  string // an environment variable naming the file instead
	}{
		{"nats-password-file", func(f string) []string {
			return []string{"--nats-listen", "127.0.0.1:0", "--nats-password-file", f}
		}, ""},
		{"nats-creds", func(f string) []string { return []string{"--nats-url", "nats://127.0.0.1:4222", "--nats-creds", f} }, ""},
		{"nats-nkey", func(f string) []string { return []string{"--nats-url", "nats://127.0.0.1:4222", "--nats-nkey", f} }, ""},
		{"nats-key", func(f string) []string {
			return []string{"--nats-url", "nats://127.0.0.1:4222", "--nats-cert", f + ".crt", "--nats-key", f}
		}, ""},
		{"tls-key", func(f string) []string { return []string{"--tls-cert", f + ".crt", "--tls-key", f} }, ""},
		{"tokens-file", func(f string) []string { return []string{"--tokens-file", f} }, ""},
		{"bus-sink secret-file", func(f string) []string {
			return []string{"--bus-sink", "webhook:url=https://hooks.example/x,secret-file=" + f}
		}, ""},
		{"PGPASSFILE", func(string) []string { return []string{"--store", "postgres://sidecar@127.0.0.1:5432/sidecar"} }, "PGPASSFILE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "secret")
			if err := os.WriteFile(file, []byte("s3cret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.env != "" {
				t.Setenv(tc.env, file)
			}
			for _, mode := range []os.FileMode{0o644, 0o604, 0o660, 0o620, 0o666} {
				if err := os.Chmod(file, mode); err != nil {
					t.Fatal(err)
				}
				_, err := parseServe(tc.args(file))
				want := []string{file, "mode 0" + strconvOct(mode), "chmod 600 " + file}
				if err == nil {
					t.Fatalf("mode %#o: accepted, want refused", mode)
				}
				for _, w := range want {
					if !strings.Contains(err.Error(), w) {
						t.Fatalf("mode %#o: %v; want it to name %q", mode, err, w)
					}
				}
			}
			for _, mode := range []os.FileMode{0o600, 0o400, 0o440} {
				if err := os.Chmod(file, mode); err != nil {
					t.Fatal(err)
				}
				if _, err := parseServe(tc.args(file)); err != nil && strings.Contains(err.Error(), file+" is mode") {
					t.Fatalf("mode %#o: %v, want accepted", mode, err)
				}
			}
		})
	}
	// Through the command: exit 2, nothing started (--drain-timeout 0 keeps
	// a serve that would accept the file from starting).
	file := filepath.Join(t.TempDir(), "nats.pw")
	if err := os.WriteFile(file, []byte("pw\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, "serve", "--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--nats-password-file", file, "--drain-timeout", "0")
	if code != exitUsage || !strings.Contains(errOut, "chmod 600 "+file) {
		t.Fatalf("serve: exit %d, stderr %q; want exit 2 naming chmod 600", code, errOut)
	}
}

func strconvOct(m os.FileMode) string {
	const digits = "01234567"
	p := uint32(m.Perm())
	return string([]byte{digits[p>>6&7], digits[p>>3&7], digits[p&7]})
}
