package main

import (
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
)

// execConfig is what plans may reach: the command environment, the roots
// of file secrets and the addresses the http executor may call. Whoever
// may submit a plan may run code as the sidecar's user (docs/executors.md,
// "Trust model"); these settings bound what that code is handed.
type execConfig struct {
	// EnvAllow names the variables of serve's environment a command gets
	// (a trailing '*' matches a prefix). nil: exec.DefaultEnvAllow; empty:
	// none.
	EnvAllow []string
	// SecretEnvAllow names the variables of serve's environment env:
	// secrets may read (a trailing '*' matches a prefix). None: every env:
	// secret is refused (SECRET_REF_FORBIDDEN).
	SecretEnvAllow []string
	// SecretFileRoots are the directories file: secrets may be read from.
	// None: every file: secret is refused (SECRET_REF_FORBIDDEN).
	SecretFileRoots []string
	// HTTPAllow lists CIDRs and host[:port]s the http executor may reach
	// although they are loopback, link-local or private.
	HTTPAllow []string
}

// registerFlags binds the executor flags to fs.
func (c *execConfig) registerFlags(fs *flag.FlagSet, env *envSettings) {
	if c.EnvAllow == nil {
		c.EnvAllow = append([]string{}, exec.DefaultEnvAllow...)
	}
	list := func(p *[]string, name, usage string) {
		v := &listValue{p: p, fresh: true}
		fs.Var(v, name, usage+"; comma-separated or repeated (env "+envName(name)+")")
		if env.set(fs, name) {
			v.fresh = true // a flag replaces the environment's list
		}
	}
	list(&c.EnvAllow, "exec-env-allow", "variables of serve's environment that command steps get (NAME or PREFIX*; \"\" for none)")
	list(&c.SecretEnvAllow, "secret-env-allow", "variables of serve's environment that env: secrets may read (NAME or PREFIX*; default none: env: secrets are refused)")
	list(&c.SecretFileRoots, "secret-file-root", "directory file: secrets may be read from (default none: file: secrets are refused)")
	list(&c.HTTPAllow, "http-allow", "loopback/link-local/private destination http steps may reach: a CIDR (10.0.0.0/8) or host[:port] (default none; the sidecar's API, Conductor, pprof and NATS are never reachable)")
}

// validate returns the problems of the executor settings.
func (c *execConfig) validate() []string {
	var p []string
	for _, name := range c.EnvAllow {
		if err := exec.CheckEnvPattern(name); err != nil {
			p = append(p, fmt.Sprintf("--exec-env-allow %q: %v (want NAME or PREFIX*)", name, err))
		}
	}
	for _, name := range c.SecretEnvAllow {
		if err := exec.CheckEnvPattern(name); err != nil {
			p = append(p, fmt.Sprintf("--secret-env-allow %q: %v (want NAME or PREFIX*)", name, err))
		}
	}
	for _, root := range c.SecretFileRoots {
		if root == "" {
			p = append(p, "--secret-file-root: empty directory")
			continue
		}
		if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
			p = append(p, fmt.Sprintf("--secret-file-root %q: not a directory", root))
		}
	}
	for _, s := range c.HTTPAllow {
		if _, err := exec.ParseDestination(s); err != nil {
			p = append(p, fmt.Sprintf("--http-allow: %v (want a CIDR like 10.0.0.0/8 or host[:port])", err))
		}
	}
	return p
}

// apply sets the executor and secret options. apiAddr is the control API's
// bound address, conductorURL Conductor's and own the host:ports of the
// process's other listeners (pprof, NATS): the http executor must never
// reach any of them.
func (c *execConfig) apply(o *exec.Options, r *secrets.Resolver, apiAddr, conductorURL string, own ...string) error {
	allow := c.EnvAllow
	if allow == nil {
		allow = exec.DefaultEnvAllow
	}
	o.BaseEnv = exec.AllowEnv(allow)

	r.EnvAllow = append([]string(nil), c.SecretEnvAllow...)
	r.FileRoots = nil
	for _, root := range c.SecretFileRoots {
		abs, err := filepath.Abs(root)
		if err != nil {
			return fmt.Errorf("--secret-file-root %q: %w", root, err)
		}
		r.FileRoots = append(r.FileRoots, abs)
	}

	o.HTTPAllow = nil
	for _, s := range c.HTTPAllow {
		d, err := exec.ParseDestination(s)
		if err != nil {
			return fmt.Errorf("--http-allow: %w", err)
		}
		o.HTTPAllow = append(o.HTTPAllow, d)
	}

	api, err := exec.ParseDestination(apiAddr)
	if err != nil || api.Port == 0 {
		return fmt.Errorf("the API's address %q: want host:port (%v)", apiAddr, err)
	}
	u, err := url.Parse(conductorURL)
	if err != nil || u.Hostname() == "" {
		return fmt.Errorf("--conductor-url %q: no host", conductorURL)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	cond, err := exec.ParseDestination(net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return fmt.Errorf("--conductor-url %q: %w", conductorURL, err)
	}
	o.HTTPDeny = append(o.HTTPDeny, api, cond)
	for _, addr := range own {
		d, err := exec.ParseDestination(addr)
		if err != nil || d.Port == 0 {
			return fmt.Errorf("listener address %q: want host:port (%v)", addr, err)
		}
		o.HTTPDeny = append(o.HTTPDeny, d)
	}
	return nil
}

// natsHostPorts returns the host:port of every server of a --nats-url list
// (port 4222 when none is given).
func natsHostPorts(raw string) []string {
	var out []string
	us, _ := natsURLs(raw) // Validate refused a list that does not parse
	for _, u := range us {
		port := u.Port()
		if port == "" {
			port = "4222"
		}
		out = append(out, net.JoinHostPort(u.Hostname(), port))
	}
	return out
}

// listValue is a repeatable, comma-separated string list flag. The first
// Set after fresh replaces the list (the default or the environment's);
// later ones append. Set("") makes the list empty.
type listValue struct {
	p     *[]string
	fresh bool
}

func (l *listValue) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l *listValue) Set(s string) error {
	if l.fresh {
		*l.p, l.fresh = []string{}, false
	}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*l.p = append(*l.p, part)
		}
	}
	return nil
}
