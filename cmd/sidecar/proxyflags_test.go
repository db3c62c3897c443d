package main

import (
	"strconv"
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

// TestConfig_ConductorConnectionBounds: each bound of serve's requests
// at Conductor, set by its flag or its variable, reaches the node (64 by
// default); one below its least, or not a number, is a problem naming the
// flag.
func TestConfig_ConductorConnectionBounds(t *testing.T) {
	for _, b := range []struct {
		flag  string
		least int
		got   func(node.Config) int
	}{
		{"conductor-max-concurrent-calls", 1, func(nc node.Config) int { return nc.ConductorMaxCalls }},
		{"conductor-proxy-max-upstream-connections", 2, func(nc node.Config) int { return nc.ConductorProxyMaxUpstream }},
	} {
		for _, c := range []struct {
			name string
			env  string
			args []string
			want int
			bad  bool
		}{
			{"Default", "", nil, 64, false},
			{"Flag", "", []string{"--" + b.flag, "16"}, 16, false},
			{"Env", "128", nil, 128, false},
			{"TooFew", "", []string{"--" + b.flag, strconv.Itoa(b.least - 1)}, 0, true},
			{"EnvNotANumber", "lots", nil, 0, true},
		} {
			t.Run(b.flag+"/"+c.name, func(t *testing.T) {
				if c.env != "" {
					t.Setenv(envName(b.flag), c.env)
				}
				cfg, err := parseAdopt(t, append([]string{"--listen", "127.0.0.1:0", "--conductor-proxy-listen", "127.0.0.1:0"}, c.args...)...)
				if got := err != nil && strings.Contains(err.Error(), "--"+b.flag); got != c.bad {
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
				if got := b.got(nc); got != c.want {
					t.Fatalf("the node's bound %d, want %d", got, c.want)
				}
			})
		}
	}
}

// TestConfig_ProxyOnServesOwnAddress: a proxy address that is serve's own
// API or metrics address is a configuration problem naming it; before,
// serve started and then refused with ADDRESS_IN_USE, "another process
// listens there", which was itself.
func TestConfig_ProxyOnServesOwnAddress(t *testing.T) {
	for _, args := range [][]string{
		{"--listen", "127.0.0.1:19007", "--conductor-proxy-listen", "127.0.0.1:19007"},
		{"--metrics-listen", "127.0.0.1:19008", "--conductor-proxy-listen", "127.0.0.1:19008"},
	} {
		_, err := parseAdopt(t, args...)
		if err == nil || !strings.Contains(err.Error(), "is serve's own API or metrics address") {
			t.Fatalf("%v: %v, want the problem named", args, err)
		}
	}
}
