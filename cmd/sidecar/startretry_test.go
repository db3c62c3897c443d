package main

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// TestConfig_NATSStartTimeout: the flag and its variable set the bound;
// a negative one is refused in one line.
func TestConfig_NATSStartTimeout(t *testing.T) {
	m := &Main{Stdout: io.Discard, Stderr: io.Discard}
	for _, c := range []struct {
		name string
		env  string
		args []string
		want time.Duration
		bad  bool
	}{
		{"Default", "", nil, 2 * time.Minute, false},
		{"Flag", "", []string{"--nats-start-timeout", "45s"}, 45 * time.Second, false},
		{"Env", "10m", nil, 10 * time.Minute, false},
		{"Off", "", []string{"--nats-start-timeout", "0"}, 0, false},
		{"Negative", "", []string{"--nats-start-timeout", "-1s"}, -time.Second, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("SIDECAR_NATS_START_TIMEOUT", c.env)
			}
			cfg := DefaultConfig()
			fs := m.newFlagSet("serve", "serve [flags]")
			cfg.registerFlags(fs)
			if err := parse(fs, c.args); err != nil {
				t.Fatal(err)
			}
			if cfg.NATSStartTimeout != c.want {
				t.Fatalf("NATSStartTimeout %s, want %s", cfg.NATSStartTimeout, c.want)
			}
			var ve *ConfigValidationError
			err := cfg.Validate()
			if got := errors.As(err, &ve) && strings.Contains(err.Error(), "--nats-start-timeout"); got != c.bad {
				t.Fatalf("Validate: %v, want a problem naming the flag: %v", err, c.bad)
			}
		})
	}
}
