package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"testing"
)

// TestConfig_PprofListenIsLoopbackOnly: profiles expose the process's
// memory, so --pprof-listen takes loopback addresses only.
func TestConfig_PprofListenIsLoopbackOnly(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"", true}, {"127.0.0.1:6060", true}, {"localhost:6060", true}, {"[::1]:6060", true},
		{"0.0.0.0:6060", false}, {":6060", false}, {"10.0.0.5:6060", false}, {"6060", false},
	} {
		cfg := DefaultConfig()
		cfg.API.InsecureNoAuth = true
		cfg.PprofListen = tc.addr
		err := cfg.Validate()
		var ve *ConfigValidationError
		bad := errors.As(err, &ve) && strings.Contains(err.Error(), "--pprof-listen")
		if bad == tc.ok {
			t.Errorf("--pprof-listen %q: %v, want ok=%v", tc.addr, err, tc.ok)
		}
	}
}

// TestConfig_PollersPerType: --pollers-per-type (env
// SIDECAR_POLLERS_PER_TYPE) is 1 by default and 1 to 64; a value that is
// not a number, in the flag or the environment, is refused.
func TestConfig_PollersPerType(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
		want int // 0: refused
	}{
		{"", nil, 1},
		{"", []string{"--pollers-per-type", "4"}, 4},
		{"8", nil, 8},
		{"8", []string{"--pollers-per-type", "2"}, 2},
		{"", []string{"--pollers-per-type", "0"}, 0},
		{"", []string{"--pollers-per-type", "65"}, 0},
		{"four", nil, 0},
	} {
		if tc.env != "" {
			t.Setenv("SIDECAR_POLLERS_PER_TYPE", tc.env)
		}
		cfg, err := parseServe(tc.args)
		if tc.want == 0 {
			if err == nil {
				t.Errorf("env %q args %v: accepted (%d), want refused", tc.env, tc.args, cfg.PollersPerType)
			}
		} else if err != nil || cfg.PollersPerType != tc.want {
			t.Errorf("env %q args %v: %d, %v; want %d", tc.env, tc.args, cfg.PollersPerType, err, tc.want)
		}
		os.Unsetenv("SIDECAR_POLLERS_PER_TYPE")
	}
}

// TestConfig_NATSReplicas: --nats-replicas is 1 to 5, and more than 1
// only with --nats-url (the embedded server is one node).
func TestConfig_NATSReplicas(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{nil, true},
		{[]string{"--nats-replicas", "3"}, false},
		{[]string{"--nats-replicas", "3", "--nats-url", "nats://127.0.0.1:4222"}, true},
		{[]string{"--nats-replicas", "6", "--nats-url", "nats://127.0.0.1:4222"}, false},
		{[]string{"--nats-replicas", "0"}, false},
	} {
		_, err := parseServe(tc.args)
		if (err == nil) != tc.ok {
			t.Errorf("%v: %v, want ok=%v", tc.args, err, tc.ok)
		}
	}
}

// parseServe is serve's configuration from args (and SIDECAR_* in the
// environment), validated, with the API's authentication off.
func parseServe(args []string) (Config, error) {
	cfg := DefaultConfig()
	cfg.API.InsecureNoAuth = true
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.registerFlags(fs)
	err := fs.Parse(args)
	if err == nil {
		err = cfg.Validate()
	}
	return cfg, err
}
