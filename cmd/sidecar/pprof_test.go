package main

import (
	"errors"
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
