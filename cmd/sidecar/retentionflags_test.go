package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestConfig_Retention: retention is off by default; --retain-finished
// needs --archive (a file:/// URL), and on --nats-url the retention user's
// password file, and on PostgreSQL the retention role's URL
// (--retention-store, for PostgreSQL only); --retain-tenant takes
// TENANT=DURATION; Conductor's copy is removed unless --retain-conductor=false.
func TestConfig_Retention(t *testing.T) {
	if DefaultConfig().Retention.Finished != 0 {
		t.Fatal("retention is on by default")
	}
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
	}{
		{"Off", nil, true},
		{"OK", []string{"--retain-finished", "720h", "--archive", "file:///var/lib/sidecar/archive"}, true},
		{"PerTenant", []string{"--retain-finished", "720h", "--retain-tenant", "acme=24h,beta=1h", "--archive", "file:///a"}, true},
		{"NoArchive", []string{"--retain-finished", "720h"}, false},
		{"BadArchive", []string{"--retain-finished", "1h", "--archive", "/relative/or/plain"}, false},
		{"Negative", []string{"--retain-finished", "-1h", "--archive", "file:///a"}, false},
		{"TenantWithoutDefault", []string{"--retain-tenant", "acme=1h"}, false},
		{"BadTenant", []string{"--retain-finished", "1h", "--archive", "file:///a", "--retain-tenant", "acme"}, false},
		{"ZeroTenant", []string{"--retain-finished", "1h", "--archive", "file:///a", "--retain-tenant", "acme=0s"}, false},
		{"TenantTwice", []string{"--retain-finished", "1h", "--archive", "file:///a", "--retain-tenant", "acme=5s,acme=7s"}, false},
		{"TenantTwiceInTwoFlags", []string{"--retain-finished", "1h", "--archive", "file:///a", "--retain-tenant", "acme=5s", "--retain-tenant", "acme=7s"}, false},
		{"ExternalNATSNeedsRetentionUser", []string{"--retain-finished", "1h", "--archive", "file:///a", "--nats-url", "nats://127.0.0.1:4222", "--nats-insecure-no-auth"}, false},
		{"PostgresNeedsRetentionStore", []string{"--retain-finished", "1h", "--archive", "file:///a", "--store", "postgres://sidecar@127.0.0.1:1/sidecar"}, false},
		{"Postgres", []string{"--retain-finished", "1h", "--archive", "file:///a", "--store", "postgres://sidecar@127.0.0.1:1/sidecar", "--retention-store", "postgres://sidecar_retention@127.0.0.1:1/sidecar"}, true},
		{"PostgresBadRetentionStore", []string{"--retain-finished", "1h", "--archive", "file:///a", "--store", "postgres://sidecar@127.0.0.1:1/sidecar", "--retention-store", "nats://x"}, false},
		{"RetentionStoreOnJetStream", []string{"--retain-finished", "1h", "--archive", "file:///a", "--retention-store", "postgres://sidecar_retention@127.0.0.1:1/sidecar"}, false},
		{"KeepConductor", []string{"--retain-finished", "1h", "--archive", "file:///a", "--retain-conductor=false"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			cfg.registerFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := cfg.Validate()
			var ve *ConfigValidationError
			bad := errors.As(err, &ve) && (strings.Contains(err.Error(), "retain") || strings.Contains(err.Error(), "--archive"))
			if bad == tc.ok {
				t.Fatalf("%v: %v, want ok=%v", tc.args, err, tc.ok)
			}
		})
	}
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.registerFlags(fs)
	if err := fs.Parse([]string{"--retain-tenant", "acme=24h", "--retain-tenant", "beta=2h"}); err != nil {
		t.Fatal(err)
	}
	if cfg.Retention.PerTenant["acme"] != 24*time.Hour || cfg.Retention.PerTenant["beta"] != 2*time.Hour {
		t.Fatalf("got %v", cfg.Retention.PerTenant)
	}
	if !cfg.Retention.Conductor {
		t.Fatal("--retain-conductor is off by default, want on")
	}
	// A flag overrides the variable's value for the same tenant, as every
	// flag overrides its variable; the variable's other tenants stay.
	t.Setenv(envName("retain-tenant"), "acme=5s,beta=1h")
	cfg = DefaultConfig()
	fs = flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.registerFlags(fs)
	if err := fs.Parse([]string{"--retain-tenant", "acme=7s"}); err != nil {
		t.Fatal(err)
	}
	if cfg.Retention.PerTenant["acme"] != 7*time.Second || cfg.Retention.PerTenant["beta"] != time.Hour || len(cfg.Retention.bad) != 0 {
		t.Fatalf("variable acme=5s,beta=1h and flag acme=7s: %v, problems %v", cfg.Retention.PerTenant, cfg.Retention.bad)
	}
	cfg = DefaultConfig()
	fs = flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.registerFlags(fs)
	if err := fs.Parse([]string{"--retain-finished", "1h", "--archive", "file:///a", "--store", "postgres://sidecar@db/sidecar",
		"--retention-store", "postgres://sidecar_retention@db/sidecar", "--retain-conductor=false"}); err != nil {
		t.Fatal(err)
	}
	if r, err := cfg.Retention.node("", nil); err != nil || r.Store != "postgres://sidecar_retention@db/sidecar" || r.Conductor {
		t.Fatalf("node's retention: %+v %v, want the retention store and Conductor off", r, err)
	}
}

// TestConfig_RetentionPasswordOnTheEmbeddedListener: a replica whose
// embedded server other replicas share (--nats-listen) gives the retention
// user the password of --retention-nats-password-file, so that the others,
// on --nats-url with the same file, can run retention too.
func TestConfig_RetentionPasswordOnTheEmbeddedListener(t *testing.T) {
	dir := t.TempDir()
	pw, retPW := filepath.Join(dir, "nats.pw"), filepath.Join(dir, "retention.pw")
	os.WriteFile(pw, []byte("sidecar-pw\n"), 0o600)
	os.WriteFile(retPW, []byte("retention-pw\n"), 0o600)
	cfg, err := parseServe([]string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--nats-listen", "127.0.0.1:0", "--nats-password-file", pw,
		"--retain-finished", "1h", "--archive", "file:///a", "--retention-nats-password-file", retPW})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := cfg.node(zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	closeListeners(nc)
	if nc.Embedded.Password != "sidecar-pw" || nc.Embedded.RetentionPassword != "retention-pw" {
		t.Fatalf("embedded server's passwords: sidecar %q, retention %q; want the files'", nc.Embedded.Password, nc.Embedded.RetentionPassword)
	}
	// Without a listener nobody else connects: the flag has no use.
	if _, err := parseServe([]string{"--listen", "127.0.0.1:0", "--data-dir", dir,
		"--retain-finished", "1h", "--archive", "file:///a", "--retention-nats-password-file", retPW}); err == nil || !strings.Contains(err.Error(), "--retention-nats-password-file") {
		t.Fatalf("the flag without --nats-url or --nats-listen: %v, want it refused", err)
	}
}
