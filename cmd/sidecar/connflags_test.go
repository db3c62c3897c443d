package main

import (
	"flag"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// TestMaxConnections: the bound is a third of the descriptor limit less
// the reserve (half of a limit under 2,048); --max-connections may lower
// it, never raise it, and a bad value fails naming the fix.
func TestMaxConnections(t *testing.T) {
	for _, tc := range []struct {
		name   string
		flag   int
		nofile uint64
		want   int
		err    string
	}{
		{"Derived", 0, 20000, 6325, ""},
		{"DerivedSmallLimit", 0, 1024, 170, ""},
		{"Lowered", 500, 20000, 500, ""},
		{"AboveShare", 6326, 20000, 0, "give at most 6325, or raise the limit"},
		{"Negative", -1, 20000, 0, "give a positive number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := maxConnections(tc.flag, tc.nofile)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %d, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
			if nofile := tc.nofile; uint64(got)*connListeners+reserveOf(nofile) > nofile {
				t.Fatalf("%d listeners of %d each and the reserve %d exceed the limit %d", connListeners, got, reserveOf(nofile), nofile)
			}
		})
	}
	nofile, err := descriptorLimit()
	if err != nil || nofile == 0 {
		t.Fatalf("descriptorLimit: %d, %v", nofile, err)
	}
}

// TestAPIConfig_MaxConnections: the flag and its environment variable
// reach the API's options; the derived bound is this process's share; a
// SIDECAR_MAX_CONNECTIONS that is not a number fails naming it.
func TestAPIConfig_MaxConnections(t *testing.T) {
	nofile, err := descriptorLimit()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, env string
		args      []string
		want      int
		err       string
	}{
		{"Derived", "", nil, defaultMaxConnections(nofile), ""},
		{"Flag", "", []string{"--max-connections", "7"}, 7, ""},
		{"Env", "9", nil, 9, ""},
		{"EnvNotANumber", "many", nil, 0, `SIDECAR_MAX_CONNECTIONS="many": want a whole number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("SIDECAR_MAX_CONNECTIONS", tc.env)
			}
			var c apiConfig
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			c.registerFlags(fs, &envSettings{})
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			var o httpapi.Options
			err := c.apply(&o, zap.NewNop())
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("apply: %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil || o.MaxConnections != tc.want {
				t.Fatalf("apply: %v, MaxConnections %d; want %d", err, o.MaxConnections, tc.want)
			}
		})
	}
}

// TestEnvSettings_SayWhatTheyWant: a variable a flag refuses is a problem
// that says what the flag takes, not only "parse error".
func TestEnvSettings_SayWhatTheyWant(t *testing.T) {
	for _, tc := range []struct{ env, value, want string }{
		{"SIDECAR_VALIDATE_TRANSITIONS", "yes", "want true or false"},
		{"SIDECAR_DRAIN_TIMEOUT", "abc", "want a duration"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			c, err := parseServe(nil)
			if err == nil {
				err = c.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.env) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%s=%q: %v, want a problem saying %q", tc.env, tc.value, err, tc.want)
			}
		})
	}
}
