package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
)

func parseExec(t *testing.T, args ...string) execConfig {
	t.Helper()
	var c execConfig
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.registerFlags(fs, &envSettings{})
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestExecConfig_Flags(t *testing.T) {
	t.Run("Defaults", func(t *testing.T) {
		c := parseExec(t)
		if !slices.Equal(c.EnvAllow, exec.DefaultEnvAllow) || c.SecretFileRoots != nil || c.HTTPAllow != nil {
			t.Fatalf("defaults %+v", c)
		}
	})
	t.Run("RepeatedAndCommaSeparated", func(t *testing.T) {
		c := parseExec(t, "--http-allow", "127.0.0.1/32, 10.0.0.0/8", "--http-allow", "api.internal:8443",
			"--exec-env-allow", "PATH", "--exec-env-allow", "CI_*", "--secret-file-root", "/a,/b")
		if want := []string{"127.0.0.1/32", "10.0.0.0/8", "api.internal:8443"}; !slices.Equal(c.HTTPAllow, want) {
			t.Errorf("http-allow %q want %q", c.HTTPAllow, want)
		}
		if want := []string{"PATH", "CI_*"}; !slices.Equal(c.EnvAllow, want) {
			t.Errorf("exec-env-allow %q want %q (a flag replaces the default)", c.EnvAllow, want)
		}
		if want := []string{"/a", "/b"}; !slices.Equal(c.SecretFileRoots, want) {
			t.Errorf("secret-file-root %q want %q", c.SecretFileRoots, want)
		}
	})
	t.Run("EmptyEnvAllow", func(t *testing.T) {
		if c := parseExec(t, "--exec-env-allow", ""); c.EnvAllow == nil || len(c.EnvAllow) != 0 {
			t.Errorf("got %q, want an empty (not nil) list", c.EnvAllow)
		}
	})
	t.Run("Environment", func(t *testing.T) {
		t.Setenv("SIDECAR_EXEC_ENV_ALLOW", "PATH,JAVA_*")
		t.Setenv("SIDECAR_SECRET_FILE_ROOT", "/run/secrets")
		t.Setenv("SIDECAR_HTTP_ALLOW", "10.0.0.0/8")
		c := parseExec(t, "--http-allow", "192.168.0.0/16")
		if !slices.Equal(c.EnvAllow, []string{"PATH", "JAVA_*"}) || !slices.Equal(c.SecretFileRoots, []string{"/run/secrets"}) {
			t.Errorf("from the environment: %+v", c)
		}
		if !slices.Equal(c.HTTPAllow, []string{"192.168.0.0/16"}) {
			t.Errorf("http-allow %q: a flag must replace the environment's list", c.HTTPAllow)
		}
	})
}

func TestExecConfig_Validate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ok := execConfig{EnvAllow: []string{"PATH", "LC_*"}, SecretFileRoots: []string{t.TempDir()}, HTTPAllow: []string{"127.0.0.1/32", "localhost:8080"}}
	if p := ok.validate(); len(p) != 0 {
		t.Fatalf("valid config: %q", p)
	}
	bad := execConfig{EnvAllow: []string{"A*B", "X=Y"}, SecretFileRoots: []string{file, "/no/such/dir", ""}, HTTPAllow: []string{"10.0.0.0/33", "http://x"}}
	p := bad.validate()
	if len(p) != 7 {
		t.Fatalf("got %d problems, want 7:\n%s", len(p), strings.Join(p, "\n"))
	}
}

func TestExecConfig_Apply(t *testing.T) {
	t.Setenv("SIDECAR_TEST_SERVE_ONLY", "x")
	root := t.TempDir()
	c := execConfig{EnvAllow: []string{"PATH"}, SecretFileRoots: []string{root}, HTTPAllow: []string{"127.0.0.1/32"}}
	var o exec.Options
	var r secrets.Resolver
	if err := c.apply(&o, &r, "127.0.0.1:8787", "https://conductor.internal/api"); err != nil {
		t.Fatal(err)
	}
	env := o.BaseEnv()
	if len(env) != 1 || !strings.HasPrefix(env[0], "PATH=") {
		t.Errorf("BaseEnv %q, want only PATH", env)
	}
	if !slices.Equal(r.FileRoots, []string{root}) {
		t.Errorf("FileRoots %q", r.FileRoots)
	}
	if len(o.HTTPAllow) != 1 || o.HTTPAllow[0].String() != "127.0.0.1/32" {
		t.Errorf("HTTPAllow %v", o.HTTPAllow)
	}
	var deny []string
	for _, d := range o.HTTPDeny {
		deny = append(deny, d.String())
	}
	if want := []string{"127.0.0.1:8787", "conductor.internal:443"}; !slices.Equal(deny, want) {
		t.Errorf("HTTPDeny %q, want %q", deny, want)
	}

	var zero execConfig // a Config not built by registerFlags
	if err := zero.apply(&o, &r, "[::]:8787", "http://localhost:8080/api"); err != nil {
		t.Fatal(err)
	}
	if env := o.BaseEnv(); !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) ||
		slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "SIDECAR_TEST_SERVE_ONLY=") }) {
		t.Errorf("zero config BaseEnv %q, want the default allowlist", env)
	}
	if r.FileRoots != nil {
		t.Errorf("zero config FileRoots %q, want none", r.FileRoots)
	}
	if err := zero.apply(&o, &r, "not-an-address", "http://localhost:8080/api"); err == nil {
		t.Error("apply accepted an API address without a port")
	}
}

// TestExecConfig_ApplyDeniesOwnListeners: the process's other listeners
// (pprof, NATS) join the always-denied destinations.
func TestExecConfig_ApplyDeniesOwnListeners(t *testing.T) {
	var c execConfig
	var o exec.Options
	var r secrets.Resolver
	own := append([]string{"127.0.0.1:6060", "127.0.0.1:4222"}, natsHostPorts("nats://nats-a,nats://nats-b:4333,nats-c:4444")...)
	if err := c.apply(&o, &r, "127.0.0.1:8787", "http://localhost:8080/api", own...); err != nil {
		t.Fatal(err)
	}
	var deny []string
	for _, d := range o.HTTPDeny {
		deny = append(deny, d.String())
	}
	want := []string{"127.0.0.1:8787", "localhost:8080", "127.0.0.1:6060", "127.0.0.1:4222", "nats-a:4222", "nats-b:4333", "nats-c:4444"}
	if !slices.Equal(deny, want) {
		t.Errorf("HTTPDeny %q, want %q", deny, want)
	}
}

// TestExecConfig_SecretEnvAllow: --secret-env-allow (env
// SIDECAR_SECRET_ENV_ALLOW) is empty by default, which refuses every env:
// secret; its patterns are NAME or PREFIX*.
func TestExecConfig_SecretEnvAllow(t *testing.T) {
	var r secrets.Resolver
	var o exec.Options
	c := parseExec(t)
	if err := c.apply(&o, &r, "127.0.0.1:8787", "http://localhost:8080/api"); err != nil {
		t.Fatal(err)
	}
	if len(r.EnvAllow) != 0 {
		t.Errorf("default EnvAllow %q, want none", r.EnvAllow)
	}
	c = parseExec(t, "--secret-env-allow", "CI_TOKEN,DEPLOY_*")
	if err := c.apply(&o, &r, "127.0.0.1:8787", "http://localhost:8080/api"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"CI_TOKEN", "DEPLOY_*"}; !slices.Equal(r.EnvAllow, want) {
		t.Errorf("EnvAllow %q, want %q", r.EnvAllow, want)
	}
	t.Setenv("SIDECAR_SECRET_ENV_ALLOW", "FROM_ENV")
	if c = parseExec(t); !slices.Equal(c.SecretEnvAllow, []string{"FROM_ENV"}) {
		t.Errorf("from the environment: %q", c.SecretEnvAllow)
	}
	bad := parseExec(t, "--secret-env-allow", "A*B")
	if p := bad.validate(); len(p) != 1 || !strings.Contains(p[0], "--secret-env-allow") {
		t.Errorf("problems %q, want one naming --secret-env-allow", p)
	}
}
