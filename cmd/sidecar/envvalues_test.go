package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

// TestConfig_BadEnvironmentValues: a value in a SIDECAR_* variable that
// the flag it sets refuses stops the start (Validate), naming the
// variable, as the same value on the command line does; it is never
// dropped for the default. Booleans take what the command line takes
// (1, true, TRUE, ...).
func TestConfig_BadEnvironmentValues(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"SIDECAR_DRAIN_TIMEOUT", "abc", ""},
		{"SIDECAR_SYNC_INTERVAL", "xyz", ""},
		{"SIDECAR_CONCURRENCY", "bogus", ""},
		{"SIDECAR_VALIDATE_TRANSITIONS", "maybe", ""},
		{"SIDECAR_CONSOLE_SECURE_COOKIE", "yes", ""},
		{"SIDECAR_ADMISSION_DELAY", "soon", ""},
		{"SIDECAR_ADOPT_INTERVAL", "often", ""},
		{"SIDECAR_RETAIN_FINISHED", "forever", ""},
		{"SIDECAR_RETAIN_TENANT", "acme", "--retain-tenant"},
		{"SIDECAR_BUS_SINK", "carrier-pigeon:x=1", ""},
		{"SIDECAR_API_MAX_REQUESTS_PER_PRINCIPAL", "lots", ""},
		{"SIDECAR_CONDUCTOR_MAX_TASK_OUTPUT_KIB", "big", ""},
		{"SIDECAR_CONDUCTOR_MAX_TASK_OUTPUT_KIB", "0", "--conductor-max-task-output-kib"},
		{"SIDECAR_API_MAX_REQUESTS_PER_PRINCIPAL", "-1", "--api-max-requests-per-principal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			_, err := parseEnvServe(t)
			var ve *ConfigValidationError
			want := tc.name
			if tc.want != "" {
				want = tc.want
			}
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), want) {
				t.Fatalf("%s=%s: %v, want a validation error naming the variable", tc.name, tc.value, err)
			}
		})
	}
	t.Run("BooleansAsOnTheCommandLine", func(t *testing.T) {
		t.Setenv("SIDECAR_CONSOLE_SECURE_COOKIE", "1")
		t.Setenv("SIDECAR_VALIDATE_TRANSITIONS", "TRUE")
		cfg, err := parseEnvServe(t)
		if err != nil {
			t.Fatal(err)
		}
		if !cfg.API.ConsoleSecureCookie || !cfg.ValidateWrites {
			t.Fatalf("SIDECAR_CONSOLE_SECURE_COOKIE=1, SIDECAR_VALIDATE_TRANSITIONS=TRUE: secure cookie %v, validate %v; want both on",
				cfg.API.ConsoleSecureCookie, cfg.ValidateWrites)
		}
	})
}

// parseEnvServe parses serve's flags with no arguments (the environment
// alone) and validates them.
func parseEnvServe(t *testing.T) (Config, error) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.API.InsecureNoAuth = true
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.registerFlags(fs)
	if err := fs.Parse(nil); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// TestConfig_ListenNotAnAddress: a --listen that is no HOST:PORT is named
// as such, not as an address off loopback that needs a tokens file.
func TestConfig_ListenNotAnAddress(t *testing.T) {
	for _, listen := range []string{"nonsense", "127.0.0.1", "localhost:"} {
		_, err := parseServe([]string{"--listen", listen})
		if err == nil || !strings.Contains(err.Error(), "want HOST:PORT") || strings.Contains(err.Error(), "tokens-file") {
			t.Errorf("--listen %q: %v, want it named as no HOST:PORT, without the tokens file's advice", listen, err)
		}
	}
}
