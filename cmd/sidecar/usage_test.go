package main

import (
	"strings"
	"testing"
)

// secretEnv are environment variables whose values are secrets, or URLs
// that carry one, each with a value that marks it.
var secretEnv = map[string]string{
	"SIDECAR_TOKEN":         "tok-s3cret-value",
	"SIDECAR_SERVER":        "http://admin:srv-s3cret@127.0.0.1:1",
	"SIDECAR_STORE":         "postgres://sidecar:pg-s3cret@127.0.0.1:1/sidecar",
	"SIDECAR_NATS_URL":      "nats://sidecar:nats-s3cret@127.0.0.1:1",
	"SIDECAR_CONDUCTOR_URL": "http://user:cond-s3cret@127.0.0.1:1/api",
}

// TestMain_UsageShowsNoSecret: no subcommand prints a secret from its
// environment (a token, a password in a URL) in its usage text, on -h or
// on a usage error, nor in a configuration error.
func TestMain_UsageShowsNoSecret(t *testing.T) {
	for k, v := range secretEnv {
		t.Setenv(k, v)
	}
	commands := [][]string{
		{"serve"}, {"run", "submit"}, {"status", "r1"}, {"runs"}, {"events", "r1"}, {"audit", "r1"},
		{"pause", "r1"}, {"resume", "r1"}, {"cancel", "r1"}, {"retry", "r1", "s1"},
		{"bus"}, {"bus", "deadletters"}, {"bus", "replay"}, {"archive", "verify"}, {"archive", "events"}, {"demo"}, {"key"}, {"token", "new"}, {"version"},
	}
	check := func(t *testing.T, args []string, out, errOut string) {
		t.Helper()
		if strings.Contains(out+errOut, "s3cret") {
			t.Fatalf("sidecar %s shows a secret:\n%s%s", strings.Join(args, " "), out, errOut)
		}
	}
	for _, cmd := range commands {
		name := strings.Join(cmd, " ")
		t.Run(name, func(t *testing.T) {
			// Asked-for help is output (stdout, exit 0); a bad flag a
			// usage error (stderr, exit 2).
			args := append(append([]string{}, cmd...), "-h")
			code, out, errOut := run(t, args...)
			if code != exitOK || !strings.Contains(out, "Usage: sidecar") {
				t.Fatalf("sidecar %s: exit %d, stdout %q; want exit 0 and the usage on stdout", strings.Join(args, " "), code, out)
			}
			check(t, args, out, errOut)
			args = append(append([]string{}, cmd...), "--no-such-flag")
			code, out, errOut = run(t, args...)
			if code != exitUsage || !strings.Contains(errOut, "Usage: sidecar") {
				t.Fatalf("sidecar %s: exit %d, stderr %q; want exit 2 and the usage", strings.Join(args, " "), code, errOut)
			}
			check(t, args, out, errOut)
		})
	}
	t.Run("NATS token as the URL's user", func(t *testing.T) {
		t.Setenv("SIDECAR_NATS_URL", "nats://nats-s3cret-token@127.0.0.1:1")
		code, out, errOut := run(t, "serve", "-h")
		if code != exitOK {
			t.Fatalf("serve -h: exit %d", code)
		}
		check(t, []string{"serve", "-h"}, out, errOut)
	})
	t.Run("webhook URL with credentials", func(t *testing.T) {
		t.Setenv("SIDECAR_BUS_SINK", "webhook:url=ftp://u:hook-s3cret@127.0.0.1:1/x,secret-file=/nonexistent")
		code, out, errOut := run(t, "serve", "--data-dir", t.TempDir(), "--drain-timeout", "0")
		if code != exitUsage || !strings.Contains(errOut, "--bus-sink") {
			t.Fatalf("serve: exit %d, stderr %q; want exit 2 naming --bus-sink", code, errOut)
		}
		check(t, []string{"serve"}, out, errOut)
	})
	t.Run("serve configuration error", func(t *testing.T) {
		t.Setenv("SIDECAR_CONDUCTOR_URL", "ftp://user:cond-s3cret@127.0.0.1:1/api")
		code, out, errOut := run(t, "serve")
		if code != exitUsage || !strings.Contains(errOut, "--conductor-url") {
			t.Fatalf("serve: exit %d, stderr %q; want exit 2 naming --conductor-url", code, errOut)
		}
		check(t, []string{"serve"}, out, errOut)
	})
	t.Run("server with credentials", func(t *testing.T) {
		code, out, errOut := run(t, "status", "r1")
		if code != exitUsage || !strings.Contains(errOut, "--token") {
			t.Fatalf("status: exit %d, stderr %q; want exit 2 naming --token", code, errOut)
		}
		check(t, []string{"status", "r1"}, out, errOut)
	})
	t.Run("client request error", func(t *testing.T) {
		t.Setenv("SIDECAR_SERVER", "http://127.0.0.1:1")
		code, out, errOut := run(t, "status", "r1")
		if code != exitUnavailable {
			t.Fatalf("status: exit %d, stderr %q; want exit 6 (nothing listens on the server: retry later)", code, errOut)
		}
		check(t, []string{"status", "r1"}, out, errOut)
	})
}

// TestMain_UsageErrorIsShort: a bad flag or argument prints the reason, the
// command's synopsis and how to see its flags, not every flag: the one
// line that says what is wrong stays on the screen. -h prints them all.
func TestMain_UsageErrorIsShort(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--concurrency", "bogus"},
		{"serve", "--no-such-flag"},
		{"serve", "stray"},
		{"runs", "--limit"},
		{"pause", "r1", "--no-such-flag"},
		{"archive", "verify", "--no-such-flag"},
		{"key", "--attempt", "two"},
	} {
		name := strings.Join(args, " ")
		t.Run(name, func(t *testing.T) {
			code, out, errOut := run(t, args...)
			if code != exitUsage || out != "" {
				t.Fatalf("exit %d, stdout %q; want exit 2 and nothing on stdout", code, out)
			}
			lines := strings.Split(strings.TrimSpace(errOut), "\n")
			if len(lines) > 4 || strings.Contains(errOut, "Flags:") {
				t.Fatalf("%d lines on stderr, want the reason and a hint:\n%s", len(lines), errOut)
			}
			if !strings.Contains(errOut, "Usage: sidecar "+args[0]) || !strings.Contains(errOut, " -h") {
				t.Fatalf("stderr %q: want the synopsis and the hint to run -h", errOut)
			}
		})
	}
	code, out, _ := run(t, "serve", "-h")
	if code != exitOK || !strings.Contains(out, "Flags:") || !strings.Contains(out, "-concurrency") {
		t.Fatalf("serve -h: exit %d, want every flag:\n%s", code, out)
	}
}

// TestMain_HelpOfACommandWithOneSubcommand: "run -h" and "token -h" show
// the flags of their only subcommand (run submit, token new).
func TestMain_HelpOfACommandWithOneSubcommand(t *testing.T) {
	for _, c := range []struct {
		args []string
		flag string
	}{{[]string{"run", "-h"}, "-run-request-id"}, {[]string{"run", "--help"}, "-run-request-id"}, {[]string{"token", "-h"}, "-roles"}} {
		code, out, errOut := run(t, c.args...)
		if code != exitOK || !strings.Contains(out+errOut, "Flags:") || !strings.Contains(out+errOut, c.flag) {
			t.Errorf("%v: exit %d, want its subcommand's flags:\n%s%s", c.args, code, out, errOut)
		}
	}
}
