package main

import (
	"errors"
	"strings"
	"testing"
)

// TestConfig_MetricsListen: --metrics-listen (env SIDECAR_METRICS_LISTEN)
// is off by default, takes host:port on any interface (it serves only
// /metrics), and is refused when it is not host:port or is --listen's
// own address.
func TestConfig_MetricsListen(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"", true}, {"0.0.0.0:9787", true}, {":9787", true}, {"127.0.0.1:9787", true}, {"[::]:9787", true},
		{"9787", false}, {"0.0.0.0", false}, {"127.0.0.1:8787", false},
	} {
		cfg := DefaultConfig()
		cfg.API.MetricsListen = tc.addr
		err := cfg.Validate()
		var ve *ConfigValidationError
		bad := errors.As(err, &ve) && strings.Contains(err.Error(), "--metrics-listen")
		if bad == tc.ok {
			t.Errorf("--metrics-listen %q: %v, want ok=%v", tc.addr, err, tc.ok)
		}
	}
	if DefaultConfig().API.MetricsListen != "" {
		t.Error("--metrics-listen is on by default")
	}
}
