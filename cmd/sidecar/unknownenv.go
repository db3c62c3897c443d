package main

import (
	"flag"
	"strings"
)

// otherCommandsEnv are the SIDECAR_ variables of the CLI's other commands
// (the API client's, run's, archive's): set beside serve in a shell or a
// pod, they are not mistakes.
var otherCommandsEnv = map[string]bool{
	"SIDECAR_SERVER": true, "SIDECAR_TOKEN": true, "SIDECAR_CA_CERT": true, "SIDECAR_ARCHIVE": true,
	"SIDECAR_TENANT_ID": true, "SIDECAR_PROJECT_ID": true, "SIDECAR_ENVIRONMENT_ID": true,
}

// unknownSettings returns, for each variable of environ named SIDECAR_...
// that is no setting of serve (fs's flags) nor of another command, a line
// saying so, with the setting it is closest to when that is a slip of a
// letter or two: serve ignores such a variable, and a misspelt one would
// otherwise go unnoticed.
func unknownSettings(environ []string, fs *flag.FlagSet) []string {
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { known[envName(f.Name)] = true })
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "SIDECAR_") || strings.HasPrefix(name, "SIDECAR_TEST_") || known[name] || otherCommandsEnv[name] {
			continue
		}
		line := name + " is set, but is no setting of sidecar serve: it is ignored"
		best, dist := "", 3
		for k := range known {
			if d := editDistance(name, k); d < dist || (d == dist && k < best) {
				best, dist = k, d
			}
		}
		if best != "" {
			line += " (did you mean " + best + "?)"
		}
		out = append(out, line)
	}
	return out
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
