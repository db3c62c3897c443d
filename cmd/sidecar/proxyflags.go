package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/conductor-sidecar/sidecar/node"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// proxyConfig is the task proxy: Conductor's API for outside workers
// (docs/workers.md, "Bring your own workers").
type proxyConfig struct {
	// Listen is the proxy's address (empty: no proxy).
	Listen string
	// TokenFile holds the tokens a worker must present, one per line
	// (empty: none required).
	TokenFile string
	// NoAuth allows a non-loopback Listen without TokenFile: Conductor's
	// own authentication, or the network, keeps workers apart.
	NoAuth bool
	// ForwardAll forwards Conductor's whole API, not only the calls
	// workers make: a proxy token then grants every tenant's workflows.
	ForwardAll bool
	// MaxUpstream bounds the proxy's connections to Conductor (polls and
	// updates at Conductor at once); 0 after a bad environment value.
	MaxUpstream int
	// MaxTaskOutputKiB is Conductor's maxTaskOutputPayloadSizeThreshold:
	// a larger output is recorded as the failure Conductor makes of it.
	MaxTaskOutputKiB int
}

func (c *proxyConfig) registerFlags(fs *flag.FlagSet, env *envSettings) {
	stringFlag(fs, &c.Listen, "conductor-proxy-listen", "serve Conductor's API for outside workers on this address (the task proxy; empty: off)")
	stringFlag(fs, &c.TokenFile, "conductor-proxy-token-file", "file of the tokens the task proxy requires, one per line (header "+"X-Sidecar-Proxy-Token, or the URL's first path segment)")
	boolFlag(fs, env, &c.NoAuth, "conductor-proxy-no-auth", "allow a non-loopback --conductor-proxy-listen without --conductor-proxy-token-file")
	c.registerLimitFlags(fs, env)
	boolFlag(fs, env, &c.ForwardAll, "conductor-proxy-forward-all", "forward Conductor's whole API through the task proxy, not only the calls workers make (the proxy token then grants Conductor's whole API, every tenant)")
	fs.Var(&intValue{&c.MaxUpstream}, "conductor-proxy-max-upstream-connections", "connections of the task proxy to Conductor, so its workers' polls and updates at Conductor at once, a quarter kept for updates (at least 2; each takes one of Conductor's request threads); more polls wait at the proxy (sidecar_proxy_upstream_waiting) (env "+envName("conductor-proxy-max-upstream-connections")+")")
	if v, ok := os.LookupEnv(envName("conductor-proxy-max-upstream-connections")); ok {
		if fs.Set("conductor-proxy-max-upstream-connections", v) != nil {
			c.MaxUpstream = 0 // validate names it
		}
	}
}

func (c *proxyConfig) registerLimitFlags(fs *flag.FlagSet, env *envSettings) {
	fs.Var(&intValue{&c.MaxTaskOutputKiB}, "conductor-max-task-output-kib", "Conductor's conductor.app.maxTaskOutputPayloadSizeThreshold (KB): a COMPLETED update through the task proxy whose output is larger is recorded as the failure Conductor makes of it (FAILED_WITH_TERMINAL_ERROR); give Conductor's value if it is not the default (env "+envName("conductor-max-task-output-kib")+")")
	env.set(fs, "conductor-max-task-output-kib")
}

func (c *proxyConfig) validate(listen, metricsListen string) []string {
	var p []string
	if c.Listen != "" {
		if msg := listenProblem("--conductor-proxy-listen", c.Listen, "127.0.0.1:8788"); msg != "" {
			p = append(p, msg)
		} else if c.Listen == listen || c.Listen == metricsListen {
			p = append(p, "--conductor-proxy-listen "+c.Listen+" is serve's own API or metrics address: give the proxy a port of its own")
		}
	}
	if c.Listen != "" && c.TokenFile == "" && !c.NoAuth && !loopbackListen(c.Listen) {
		p = append(p, "--conductor-proxy-listen "+c.Listen+" is not loopback: give --conductor-proxy-token-file, or --conductor-proxy-no-auth when Conductor's own authentication or the network keeps workers apart")
	}
	if c.MaxTaskOutputKiB < 1 {
		p = append(p, fmt.Sprintf("--conductor-max-task-output-kib %d: want Conductor's maxTaskOutputPayloadSizeThreshold in KB (default %d)", c.MaxTaskOutputKiB, proxy.DefaultMaxTaskOutputBytes>>10))
	}
	if c.MaxUpstream < 2 {
		p = append(p, fmt.Sprintf("--conductor-proxy-max-upstream-connections %d: want a whole number of at least 2 (polls and updates each need one; default %d)", c.MaxUpstream, proxy.DefaultMaxUpstreamConnections))
	}
	return p
}

// apply binds the proxy's listener and reads its tokens into nc.
func (c *proxyConfig) apply(nc *node.Config) error {
	if c.Listen == "" {
		return nil
	}
	if c.TokenFile != "" {
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return fmt.Errorf("--conductor-proxy-token-file: %w", err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				nc.ConductorProxyTokens = append(nc.ConductorProxyTokens, l)
			}
		}
		if len(nc.ConductorProxyTokens) == 0 {
			return fmt.Errorf("--conductor-proxy-token-file %s holds no token", c.TokenFile)
		}
	}
	ln, err := listenHeld(c.Listen)
	if err != nil {
		return listenFailed("--conductor-proxy-listen", c.Listen, err)
	}
	nc.ConductorProxy = ln
	nc.ConductorProxyForwardAll = c.ForwardAll
	nc.ConductorProxyMaxUpstream = c.MaxUpstream
	nc.ConductorProxyMaxTaskOutput = int64(c.MaxTaskOutputKiB) << 10
	return nil
}
