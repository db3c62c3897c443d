package main

import (
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/node"
)

// TestConfig_ProxyForwardAll: --conductor-proxy-forward-all, or
// SIDECAR_CONDUCTOR_PROXY_FORWARD_ALL=true, reaches the node; off by
// default.
func TestConfig_ProxyForwardAll(t *testing.T) {
	for _, c := range []struct {
		name string
		env  string
		args []string
		want bool
	}{
		{"Default", "", nil, false},
		{"Flag", "", []string{"--conductor-proxy-forward-all"}, true},
		{"Env", "true", nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("SIDECAR_CONDUCTOR_PROXY_FORWARD_ALL", c.env)
			cfg, err := parseAdopt(t, append([]string{"--conductor-proxy-listen", "127.0.0.1:0"}, c.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			var nc node.Config
			if err := cfg.Proxy.apply(&nc); err != nil {
				t.Fatal(err)
			}
			defer nc.ConductorProxy.Close()
			if nc.ConductorProxyForwardAll != c.want {
				t.Fatalf("node's ConductorProxyForwardAll %v, want %v", nc.ConductorProxyForwardAll, c.want)
			}
		})
	}
}

// TestConfig_ProxyMaxUpstreamConnections: the flag and its variable set
// the bound the node passes to the proxy (64 by default); fewer than 2,
// or not a number, is a problem naming the flag.
func TestConfig_ProxyMaxUpstreamConnections(t *testing.T) {
	for _, c := range []struct {
		name string
		env  string
		args []string
		want int
		bad  bool
	}{
		{"Default", "", nil, 64, false},
		{"Flag", "", []string{"--conductor-proxy-max-upstream-connections", "8"}, 8, false},
		{"Env", "200", nil, 200, false},
		{"TooFew", "", []string{"--conductor-proxy-max-upstream-connections", "1"}, 1, true},
		{"EnvNotANumber", "many", nil, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("SIDECAR_CONDUCTOR_PROXY_MAX_UPSTREAM_CONNECTIONS", c.env)
			}
			cfg, err := parseAdopt(t, append([]string{"--conductor-proxy-listen", "127.0.0.1:0"}, c.args...)...)
			if got := err != nil && strings.Contains(err.Error(), "--conductor-proxy-max-upstream-connections"); got != c.bad {
				t.Fatalf("Validate: %v, want a problem naming the flag: %v", err, c.bad)
			}
			if c.bad {
				return
			}
			var nc node.Config
			if err := cfg.Proxy.apply(&nc); err != nil {
				t.Fatal(err)
			}
			defer nc.ConductorProxy.Close()
			if nc.ConductorProxyMaxUpstream != c.want {
				t.Fatalf("node's ConductorProxyMaxUpstream %d, want %d", nc.ConductorProxyMaxUpstream, c.want)
			}
		})
	}
}

// TestConfig_ConductorMaxConcurrentCalls: the flag and its variable set
// the bound of serve's calls at Conductor the node gets (64 by default);
// fewer than 1, or not a number, is a problem naming the flag.
func TestConfig_ConductorMaxConcurrentCalls(t *testing.T) {
	for _, c := range []struct {
		name string
		env  string
		args []string
		want int
		bad  bool
	}{
		{"Default", "", nil, 64, false},
		{"Flag", "", []string{"--conductor-max-concurrent-calls", "16"}, 16, false},
		{"Env", "128", nil, 128, false},
		{"Zero", "", []string{"--conductor-max-concurrent-calls", "0"}, 0, true},
		{"EnvNotANumber", "lots", nil, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("SIDECAR_CONDUCTOR_MAX_CONCURRENT_CALLS", c.env)
			}
			cfg, err := parseAdopt(t, append([]string{"--listen", "127.0.0.1:0"}, c.args...)...)
			if got := err != nil && strings.Contains(err.Error(), "--conductor-max-concurrent-calls"); got != c.bad {
				t.Fatalf("Validate: %v, want a problem naming the flag: %v", err, c.bad)
			}
			if c.bad {
				return
			}
			nc, err := cfg.node(zap.NewNop(), nil)
			if err != nil {
				t.Fatal(err)
			}
			closeListeners(nc)
			if nc.ConductorMaxCalls != c.want {
				t.Fatalf("node's ConductorMaxCalls %d, want %d", nc.ConductorMaxCalls, c.want)
			}
		})
	}
}
