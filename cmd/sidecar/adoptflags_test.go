package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/node"
)

func parseAdopt(t *testing.T, args ...string) (*Config, error) {
	t.Helper()
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.registerFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &cfg, cfg.Validate()
}

// TestConfig_Adopt: --adopt repeats, SIDECAR_ADOPT is comma-separated and
// replaced by the command line's --adopt; a bad value is a validation
// problem naming the flag; the node gets the parsed definitions and the
// adopted runs' identity.
func TestConfig_Adopt(t *testing.T) {
	cfg, err := parseAdopt(t, "--adopt", "orders", "--adopt", "billing:3", "--adopt-interval", "250ms", "--adopt-tenant-id", "acme")
	if err != nil {
		t.Fatal(err)
	}
	var nc node.Config
	cfg.Adopt.apply(&nc)
	want := []adapter.AdoptSpec{{Name: "orders"}, {Name: "billing", Version: 3}}
	if len(nc.Adopt.Specs) != 2 || nc.Adopt.Specs[0] != want[0] || nc.Adopt.Specs[1] != want[1] ||
		nc.Adopt.Interval != 250*time.Millisecond || nc.Adopt.Identity.TenantID != "acme" || nc.Adopt.Identity.ProjectID != "default" {
		t.Fatalf("node config %+v", nc.Adopt)
	}

	t.Setenv("SIDECAR_ADOPT", "a, b:2")
	if cfg, _ = parseAdopt(t); strings.Join(cfg.Adopt.Specs, "|") != "a|b:2" {
		t.Fatalf("from the environment: %q", cfg.Adopt.Specs)
	}
	if cfg, _ = parseAdopt(t, "--adopt", "c"); strings.Join(cfg.Adopt.Specs, "|") != "c" {
		t.Fatalf("--adopt should replace SIDECAR_ADOPT: %q", cfg.Adopt.Specs)
	}
	t.Setenv("SIDECAR_ADOPT", "")

	for _, bad := range []string{"orders:0", "orders:x", "a|b", ":1"} {
		_, err := parseAdopt(t, "--adopt", bad)
		var ve *ConfigValidationError
		if !errors.As(err, &ve) || !strings.Contains(err.Error(), "--adopt "+bad) {
			t.Fatalf("--adopt %s: %v, want a validation problem naming it", bad, err)
		}
	}

	// The failure policy: fail unless asked, pause reaches the node, and
	// anything else is refused.
	if nc.Adopt.OnStepFailure != "fail" {
		t.Fatalf("default --adopt-on-step-failure %q, want fail", nc.Adopt.OnStepFailure)
	}
	cfg, err = parseAdopt(t, "--adopt", "orders", "--adopt-on-step-failure", "pause")
	if err != nil {
		t.Fatal(err)
	}
	nc = node.Config{}
	cfg.Adopt.apply(&nc)
	if nc.Adopt.OnStepFailure != "pause" {
		t.Fatalf("--adopt-on-step-failure pause: node config %q", nc.Adopt.OnStepFailure)
	}
	_, err = parseAdopt(t, "--adopt", "orders", "--adopt-on-step-failure", "retry")
	var ve *ConfigValidationError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "--adopt-on-step-failure retry: want fail or pause") {
		t.Fatalf("--adopt-on-step-failure retry: %v, want a validation problem naming it", err)
	}

	// The task domain: none unless asked (every workflow of the
	// definition), given reaches the node, a malformed one is refused.
	if nc.Adopt.TaskDomain != "" {
		t.Fatalf("default --adopt-task-domain %q, want none", nc.Adopt.TaskDomain)
	}
	if cfg, err = parseAdopt(t, "--adopt", "orders", "--adopt-task-domain", "team-a"); err != nil {
		t.Fatal(err)
	}
	nc = node.Config{}
	cfg.Adopt.apply(&nc)
	if nc.Adopt.TaskDomain != "team-a" {
		t.Fatalf("--adopt-task-domain team-a: node config %q", nc.Adopt.TaskDomain)
	}
	_, err = parseAdopt(t, "--adopt", "orders", "--adopt-task-domain", "a*b")
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "--adopt-task-domain must not contain") {
		t.Fatalf("--adopt-task-domain a*b: %v, want a validation problem naming it", err)
	}
}
