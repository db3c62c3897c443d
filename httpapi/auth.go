package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"go.yaml.in/yaml/v3"
)

// Roles a principal may hold. admin holds every other.
const (
	// RoleViewer reads runs, their events and /metrics.
	RoleViewer = "viewer"
	// RoleSubmitter starts runs.
	RoleSubmitter = "submitter"
	// RoleOperator pauses, resumes, cancels and retries.
	RoleOperator = "operator"
	// RoleAdmin may do everything.
	RoleAdmin = "admin"
)

var knownRoles = []string{RoleViewer, RoleSubmitter, RoleOperator, RoleAdmin}

// Scope limits a principal to the runs of a tenant, project and
// environment; an empty field matches any value.
type Scope struct {
	TenantID      string `yaml:"tenantId" json:"tenantId,omitempty"`
	ProjectID     string `yaml:"projectId" json:"projectId,omitempty"`
	EnvironmentID string `yaml:"environmentId" json:"environmentId,omitempty"`
}

// Allows reports whether a run of tenant, project and environment is in s.
func (s Scope) Allows(tenant, project, environment string) bool {
	return (s.TenantID == "" || s.TenantID == tenant) &&
		(s.ProjectID == "" || s.ProjectID == project) &&
		(s.EnvironmentID == "" || s.EnvironmentID == environment)
}

// Principal is an authenticated caller: its Name becomes the requestedBy
// of the control events it causes.
type Principal struct {
	Name  string
	Roles []string
	Scope Scope
}

// Can reports whether p holds role (admin holds every role).
func (p *Principal) Can(role string) bool {
	return slices.Contains(p.Roles, RoleAdmin) || slices.Contains(p.Roles, role)
}

// Authenticator finds the principal of a request. It returns
// ErrUnauthenticated (matched with errors.Is) when the request carries no
// valid credentials.
type Authenticator interface {
	Authenticate(r *http.Request) (*Principal, error)
}

// Credentials is an Authenticator over a tokens file: bearer tokens, kept
// only as SHA-256 hashes, and client-certificate common names (mTLS), each
// with roles and an optional scope. Reload swaps the file's content in
// atomically. It is safe for concurrent use.
//
// The file (YAML or JSON):
//
//	principals:
//	  - name: ci-bot                     # becomes requestedBy
//	    tokenSha256: 9f86d081...          # sha256 hex of the bearer token
//	    roles: [submitter, viewer]
//	    scope: {tenantId: acme}           # optional; a field left out matches any
//	  - name: ops
//	    certCommonName: ops.example.com   # a verified client certificate's CN
//	    roles: [operator, viewer]
type Credentials struct {
	path string
	set  atomic.Pointer[credentialSet]
}

type credentialSet struct {
	byHash map[[sha256.Size]byte]*Principal
	byCN   map[string]*Principal
}

type credentialFile struct {
	Principals []struct {
		Name           string    `yaml:"name"`
		TokenSHA256    string    `yaml:"tokenSha256"`
		CertCommonName string    `yaml:"certCommonName"`
		Roles          []string  `yaml:"roles"`
		Scope          yaml.Node `yaml:"scope"`
	} `yaml:"principals"`
}

// LoadCredentials reads the tokens file at path. Every problem of the file
// is reported, with the principal it is in.
func LoadCredentials(path string) (*Credentials, error) {
	c := &Credentials{path: path}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload reads the file again. On any error the credentials in use stay
// as they were.
func (c *Credentials) Reload() error {
	set, err := readCredentials(c.path)
	if err != nil {
		return err
	}
	c.set.Store(set)
	return nil
}

// Len is the number of principals in use.
func (c *Credentials) Len() int {
	s := c.set.Load()
	return len(s.byHash) + len(s.byCN)
}

func readCredentials(path string) (*credentialSet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	var f credentialFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) { // EOF: empty, reported below
		return nil, fmt.Errorf("tokens file %s: %w\n  want a list under principals: (each entry as sidecar token new prints it; docs/security.md, \"The tokens file\")", path, err)
	}
	set := &credentialSet{byHash: map[[sha256.Size]byte]*Principal{}, byCN: map[string]*Principal{}}
	var problems []string
	names := map[string]bool{}
	for i, e := range f.Principals {
		where := fmt.Sprintf("principals[%d] (%s)", i, e.Name)
		if e.Name == "" {
			problems = append(problems, fmt.Sprintf("principals[%d]: name is required", i))
		}
		if names[e.Name] {
			problems = append(problems, where+": name appears twice")
		}
		names[e.Name] = true
		if len(e.Roles) == 0 {
			problems = append(problems, where+": roles are required")
		}
		for _, r := range e.Roles {
			if !slices.Contains(knownRoles, r) {
				problems = append(problems, fmt.Sprintf("%s: unknown role %q (want %s)", where, r, strings.Join(knownRoles, ", ")))
			}
		}
		scope, sproblems := scopeOf(&e.Scope)
		for _, sp := range sproblems {
			problems = append(problems, where+": "+sp)
		}
		p := &Principal{Name: e.Name, Roles: e.Roles, Scope: scope}
		switch {
		case e.TokenSHA256 != "" && e.CertCommonName != "":
			problems = append(problems, where+": give tokenSha256 or certCommonName, not both")
		case e.TokenSHA256 != "":
			b, err := hex.DecodeString(strings.ToLower(e.TokenSHA256))
			if err != nil || len(b) != sha256.Size {
				problems = append(problems, where+": tokenSha256 must be 64 hex digits (sidecar token new prints one)")
				continue
			}
			var h [sha256.Size]byte
			copy(h[:], b)
			if set.byHash[h] != nil {
				problems = append(problems, where+": the same token hash is given twice")
			}
			set.byHash[h] = p
		case e.CertCommonName != "":
			if set.byCN[e.CertCommonName] != nil {
				problems = append(problems, where+": the same certCommonName is given twice")
			}
			set.byCN[e.CertCommonName] = p
		default:
			problems = append(problems, where+": give tokenSha256 or certCommonName")
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("tokens file %s:\n  %s", path, strings.Join(problems, "\n  "))
	}
	if len(set.byHash)+len(set.byCN) == 0 {
		return nil, fmt.Errorf("tokens file %s names no principal", path)
	}
	return set, nil
}

// scopeOf reads a principal's scope: none (the key left out) is every
// tenant; a scope given must name at least one field, each a value. A
// scope or field given empty (null, "", a template's unset value) is
// refused rather than read as "any": it was meant to restrict.
func scopeOf(n *yaml.Node) (Scope, []string) {
	const hint = "leave scope out for a principal of every tenant, or name tenantId, projectId or environmentId"
	var s Scope
	switch {
	case n.Kind == 0:
		return s, nil
	case n.Kind != yaml.MappingNode:
		if n.Kind == yaml.ScalarNode && (n.Tag == "!!null" || n.Value == "") {
			return s, []string{"scope is empty: " + hint}
		}
		return s, []string{"scope must be a mapping: " + hint}
	case len(n.Content) == 0:
		return s, []string{"scope names no field: " + hint}
	}
	var problems []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		var field *string
		switch k.Value {
		case "tenantId":
			field = &s.TenantID
		case "projectId":
			field = &s.ProjectID
		case "environmentId":
			field = &s.EnvironmentID
		default:
			problems = append(problems, fmt.Sprintf("scope: unknown field %q (want tenantId, projectId or environmentId)", k.Value))
			continue
		}
		if v.Kind != yaml.ScalarNode || v.Tag == "!!null" || v.Value == "" {
			problems = append(problems, fmt.Sprintf("scope.%s is empty: name one, or leave the field out to match any", k.Value))
			continue
		}
		*field = v.Value
	}
	return s, problems
}

// HashToken is the tokenSha256 of a bearer token.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// Authenticate implements Authenticator: a verified client certificate
// whose common name is listed, else an "Authorization: Bearer" token whose
// hash is listed.
func (c *Credentials) Authenticate(r *http.Request) (*Principal, error) {
	set := c.set.Load()
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		if p := set.byCN[r.TLS.VerifiedChains[0][0].Subject.CommonName]; p != nil {
			return p, nil
		}
	}
	auth := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return nil, ErrUnauthenticated
	}
	// The map is keyed by the token's hash: a lookup's timing depends on
	// the hash of the guess, which tells nothing about a stored token.
	if p := set.byHash[sha256.Sum256([]byte(strings.TrimSpace(token)))]; p != nil {
		return p, nil
	}
	return nil, ErrUnauthenticated
}

type principalKey struct{}

// PrincipalFrom returns the authenticated principal of a request's
// context, or nil when the API runs without authentication.
func PrincipalFrom(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

// requestedBy is who a control event is recorded as requested by: the
// authenticated principal; without authentication, what the caller says
// (local use), or "anonymous".
func requestedBy(ctx context.Context, claimed string) (string, error) {
	if err := checkOptionalIDs(false, [2]string{"requestedBy", claimed}); err != nil {
		return "", err
	}
	p := PrincipalFrom(ctx)
	switch {
	case p == nil && claimed != "":
		return claimed, nil
	case p == nil:
		return "anonymous", nil
	case claimed != "" && claimed != p.Name:
		return "", badRequest("requestedBy", fmt.Sprintf("requestedBy is taken from your credentials (%s); leave it out", p.Name))
	}
	return p.Name, nil
}
