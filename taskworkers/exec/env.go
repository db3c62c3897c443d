package exec

import (
	"errors"
	"os"
	"strings"
)

// DefaultEnvAllow names the worker's environment variables a command gets
// by default (Options.BaseEnv): what programs need to find binaries, a
// home, a locale, a time zone and a temporary directory. A trailing '*'
// matches a prefix (LC_* is LC_ALL, LC_CTYPE, ...).
var DefaultEnvAllow = []string{"PATH", "HOME", "LANG", "LC_*", "TZ", "TMPDIR", "USER"}

// CheckEnvPattern reports whether p is a valid allowlist entry: a
// variable name, or a prefix followed by '*'. A lone "*" is valid and
// passes the whole environment (the behaviour before the allowlist).
func CheckEnvPattern(p string) error {
	name := strings.TrimSuffix(p, "*")
	switch {
	case p == "":
		return errors.New("empty name")
	case strings.ContainsAny(p, "=\x00"):
		return errors.New("contains '=' or NUL")
	case strings.Contains(name, "*"):
		return errors.New("'*' may only end a name (a prefix)")
	}
	return nil
}

// AllowEnv returns an Options.BaseEnv that gives a command the variables
// of the worker's current environment named by patterns (see
// CheckEnvPattern; invalid patterns match nothing). No pattern: an empty
// environment.
func AllowEnv(patterns []string) func() []string {
	patterns = append([]string(nil), patterns...)
	return func() []string { return FilterEnv(os.Environ(), patterns) }
}

// FilterEnv returns the NAME=value entries of environ whose name matches
// one of patterns, in environ's order.
func FilterEnv(environ, patterns []string) []string {
	out := make([]string, 0, len(patterns))
	for _, kv := range environ {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			continue
		}
		for _, p := range patterns {
			if envMatch(p, name) {
				out = append(out, kv)
				break
			}
		}
	}
	return out
}

func envMatch(pattern, name string) bool {
	if CheckEnvPattern(pattern) != nil {
		return false
	}
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(name, prefix)
	}
	return pattern == name
}
