package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// TokenCommand makes API tokens for the tokens file.
type TokenCommand struct{ m *Main }

// Run implements "sidecar token new --name N --roles R": a fresh random
// bearer token on stdout's first line, and the tokens-file entry (with its
// SHA-256 only) after it. The token itself is shown once and stored
// nowhere.
func (c *TokenCommand) Run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] != "new" && helpRequested(args) {
		args = append([]string{"new"}, args...) // "token -h": new's flags
	}
	if len(args) == 0 || args[0] != "new" {
		fmt.Fprintln(c.m.Stderr, "usage: sidecar token new --name NAME --roles ROLE[,ROLE] [--tenant-id T] [--project-id P] [--environment-id E]")
		return errUsage
	}
	fs := c.m.newFlagSet("token new", "token new --name NAME --roles ROLE[,ROLE]")
	name := fs.String("name", "", "principal name: the requestedBy of its control events (required)")
	roles := fs.String("roles", "", "comma-separated roles: viewer, submitter, operator, admin (required)")
	tenant := fs.String("tenant-id", "", "scope: only runs of this tenant")
	project := fs.String("project-id", "", "scope: only runs of this project")
	env := fs.String("environment-id", "", "scope: only runs of this environment")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if *name == "" || *roles == "" {
		return usageError(fs, "--name and --roles are required")
	}
	// Only the roles serve accepts: an entry it would refuse is no entry.
	known := []string{httpapi.RoleViewer, httpapi.RoleSubmitter, httpapi.RoleOperator, httpapi.RoleAdmin}
	var list []string
	for _, r := range strings.Split(*roles, ",") {
		r = strings.TrimSpace(r)
		if !slices.Contains(known, r) {
			return usageError(fs, "--roles: unknown role %q (want %s)", r, strings.Join(known, ", "))
		}
		list = append(list, r)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	token := base64.RawURLEncoding.EncodeToString(b)
	entry := fmt.Sprintf("  - name: %q\n    tokenSha256: %s\n    roles: [%s]\n", *name, httpapi.HashToken(token), strings.Join(list, ", "))
	// Only the fields asked for: serve refuses an empty one (a field left
	// out matches any).
	var scope []string
	for _, f := range []struct{ key, value string }{{"tenantId", *tenant}, {"projectId", *project}, {"environmentId", *env}} {
		if f.value != "" {
			scope = append(scope, fmt.Sprintf("%s: %q", f.key, f.value))
		}
	}
	if len(scope) > 0 {
		entry += "    scope: {" + strings.Join(scope, ", ") + "}\n"
	}
	_, err := fmt.Fprintf(c.m.Stdout, "%s\n# add under principals: in the tokens file, then send SIGHUP to serve:\n%s", token, entry)
	return err
}
