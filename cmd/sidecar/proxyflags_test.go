package main

import (
	"testing"

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
