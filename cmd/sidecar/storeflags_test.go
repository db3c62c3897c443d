package main

import (
	"errors"
	"flag"
	"io"
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
