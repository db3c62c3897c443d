package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfig_MalformedPostgresURL: a --store or --retention-store URL
// that cannot be parsed is a configuration problem saying what is wrong,
// found before anything starts, with the password masked.
func TestConfig_MalformedPostgresURL(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"SSLMode", []string{"--store", "postgres://sidecar:hunter2@127.0.0.1:5432/sidecar?sslmode=bogus"}, "--store: cannot parse `postgres://sidecar:xxxxx@127.0.0.1:5432/sidecar?sslmode=bogus`: failed to configure TLS (sslmode is invalid)"},
		{"Port", []string{"--store", "postgresql://sidecar:hunter2@db:99999999/sidecar"}, "invalid port"},
		{"PoolSize", []string{"--store", "postgres://sidecar@db/sidecar?pool_max_conns=many"}, "cannot parse pool_max_conns"},
		{"RetentionStore", []string{"--store", "postgres://sidecar@db/sidecar", "--retain-finished", "1h", "--archive", "file:///a",
			"--retention-store", "postgres://sidecar_retention:hunter2@db/sidecar?sslmode=bogus"}, "--retention-store: cannot parse `postgres://sidecar_retention:xxxxx@db"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			cfg.registerFlags(fs)
			if err := fs.Parse(append([]string{"--data-dir", t.TempDir(), "--conductor-url", "http://127.0.0.1:8080/api"}, c.args...)); err != nil {
				t.Fatal(err)
			}
			err := cfg.Validate()
			var ve *ConfigValidationError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("%v: %v, want a configuration problem containing %q, the password masked", c.args, err, c.want)
			}
		})
	}
}

// TestMain_MalformedPostgresURL: migrate and verify with a --store URL
// that cannot be parsed exit 2 (usage: nothing was sent) with the reason,
// the password masked.
func TestMain_MalformedPostgresURL(t *testing.T) {
	for _, cmd := range []string{"migrate", "verify"} {
		code, _, stderr := run(t, cmd, "--store", "postgres://owner:hunter2@db/sidecar?sslmode=bogus")
		if code != exitUsage || !strings.Contains(stderr, "STORE_URL_INVALID: --store: cannot parse `postgres://owner:xxxxx@db/sidecar?sslmode=bogus`: failed to configure TLS") || strings.Contains(stderr, "hunter2") {
			t.Errorf("%s: exit %d %s, want exit %d STORE_URL_INVALID, the password masked", cmd, code, stderr, exitUsage)
		}
	}
}

// TestServe_Check: serve --check exits 0 on a valid configuration
// without starting anything (the data dir is not even made), 2 with the
// problems of an invalid one or an unreadable tokens file, and warns
// about a SIDECAR_ variable serve would ignore.
func TestServe_Check(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	base := []string{"serve", "--check", "--conductor-url", "http://conductor:8080/api", "--data-dir", dir, "--listen", "127.0.0.1:1"}
	t.Setenv("SIDECAR_CONCURENCY", "3")
	code, out, errOut := run(t, base...)
	if code != exitOK || !strings.Contains(out, "configuration valid") || !strings.Contains(errOut, "did you mean SIDECAR_CONCURRENCY?") {
		t.Fatalf("a valid configuration: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("serve --check made the data dir (%v)", err)
	}
	if code, _, errOut := run(t, append(base, "--store", "postgres://x@db/x?sslmode=bogus")...); code != exitUsage || !strings.Contains(errOut, "sslmode is invalid") {
		t.Fatalf("an invalid configuration: exit %d %s", code, errOut)
	}
	tokens := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(tokens, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, append(base, "--tokens-file", tokens)...); code != exitUsage || !strings.Contains(errOut, "--tokens-file") {
		t.Fatalf("a tokens file serve cannot read: exit %d %s", code, errOut)
	}
}
