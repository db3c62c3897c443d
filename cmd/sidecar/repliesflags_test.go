package main

import (
	"os"
	"strings"
	"testing"
)

// TestConfig_ControlRepliesMaxMiB: --control-replies-max-mib (or its
// environment variable) is 16 to 1048576 MiB, 1024 by default; a value out
// of range or not a number is refused in one line naming the flag.
func TestConfig_ControlRepliesMaxMiB(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
		want int64 // bytes; 0: refused
	}{
		{"", nil, 1 << 30},
		{"", []string{"--control-replies-max-mib", "64"}, 64 << 20},
		{"256", nil, 256 << 20},
		{"", []string{"--control-replies-max-mib", "15"}, 0},
		{"", []string{"--control-replies-max-mib", "1048577"}, 0},
		{"many", nil, 0},
	} {
		if tc.env != "" {
			t.Setenv("SIDECAR_CONTROL_REPLIES_MAX_MIB", tc.env)
		}
		cfg, err := parseServe(tc.args)
		switch {
		case tc.want == 0 && (err == nil || !strings.Contains(err.Error(), "--control-replies-max-mib")):
			t.Errorf("env %q args %v: %v; want it refused naming the flag", tc.env, tc.args, err)
		case tc.want != 0 && (err != nil || int64(cfg.ControlRepliesMaxMiB)<<20 != tc.want):
			t.Errorf("env %q args %v: %d MiB, %v; want %d bytes", tc.env, tc.args, cfg.ControlRepliesMaxMiB, err, tc.want)
		}
		os.Unsetenv("SIDECAR_CONTROL_REPLIES_MAX_MIB")
	}
}
