package main

import (
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/node"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// retentionConfig is retention: how long finished runs stay in hot state
// and the archive they go to (docs/retention.md).
type retentionConfig struct {
	Finished  time.Duration
	PerTenant map[string]time.Duration
	Archive   string
	// KeyFile holds the keys manifests are signed with (archive.LoadKeys).
	KeyFile string
	// PasswordFile holds natsstore.RetentionUser's password on --nats-url.
	PasswordFile string
	// Store is the PostgreSQL URL of the retention role, with --store
	// postgres://.
	Store string
	// Conductor also removes a removed run's workflow from Conductor.
	Conductor bool
	bad       []string // --retain-tenant values that do not parse, or name a tenant twice
	// fromEnv are the tenants SIDECAR_RETAIN_TENANT set: a --retain-tenant
	// of the same tenant overrides them, as a flag overrides its variable.
	fromEnv map[string]bool
}

func (c *retentionConfig) registerFlags(fs *flag.FlagSet, env *envSettings) {
	fs.Var(&durationValue{&c.Finished}, "retain-finished", "remove a finished run from hot state this long after its last record, once it is archived to --archive (0: keep every run; state grows without bound) (env "+envName("retain-finished")+")")
	env.set(fs, "retain-finished")
	fs.Var(&tenantRetention{c}, "retain-tenant", "TENANT=DURATION: --retain-finished for one tenantId (repeat, or comma separated) (env "+envName("retain-tenant")+")")
	if env.set(fs, "retain-tenant") {
		c.fromEnv = map[string]bool{}
		for tenant := range c.PerTenant {
			c.fromEnv[tenant] = true
		}
	}
	stringFlag(fs, &c.Archive, "archive", "where finished runs are archived before they leave hot state: file:///dir or s3://bucket/prefix")
	stringFlag(fs, &c.KeyFile, "archive-key-file", "file of keys (one a line, at least 32 bytes each, e.g. openssl rand -hex 32) the first of which signs every archive manifest written, so that archive verify can tell them from manifests added by anyone else with write access to --archive; the others check manifests signed before a rotation")
	stringFlag(fs, &c.Store, "retention-store", "with --store postgres:// and --retain-finished: postgres://RETENTION_ROLE@host:port/database, the role that may remove finished runs (docs/postgres.md, Retention; password from PGPASSFILE or PGPASSWORD)")
	fs.BoolVar(&c.Conductor, "retain-conductor", envOr(envName("retain-conductor"), "true") == "true", "with --retain-finished: also remove a removed run's workflow from Conductor (env "+envName("retain-conductor")+")")
	stringFlag(fs, &c.PasswordFile, "retention-nats-password-file", "with --nats-url and --retain-finished: file with the password of NATS user "+natsstore.RetentionUser+", the only one that may remove runs (deploy/nats/sidecar.conf)")
}

// natsListen is the embedded server's --nats-listen, whose retention user
// other replicas connect as with --retention-nats-password-file.
func (c *retentionConfig) validate(postgres bool, natsURL, natsListen string) []string {
	p := append([]string(nil), c.bad...)
	if c.Finished < 0 {
		p = append(p, "--retain-finished must be >= 0 (0: keep every run)")
	}
	if c.Finished == 0 {
		if len(c.PerTenant) > 0 || c.Archive != "" || c.KeyFile != "" || c.PasswordFile != "" || c.Store != "" {
			p = append(p, "--retain-tenant, --archive, --archive-key-file, --retention-store and --retention-nats-password-file need --retain-finished")
		}
		return p
	}
	if c.Archive == "" {
		p = append(p, "--retain-finished needs --archive: runs leave hot state only once archived")
	} else if _, err := archive.ParseURL(c.Archive); err != nil {
		p = append(p, "--archive: "+err.Error())
	}
	if c.KeyFile != "" {
		if _, err := archive.LoadKeys(c.KeyFile); err != nil {
			p = append(p, "--archive-key-file: "+err.Error())
		}
	}
	switch {
	case postgres && c.Store == "":
		p = append(p, "--retain-finished with --store postgres:// needs --retention-store postgres://RETENTION_ROLE@host:port/database, the role that may remove runs (docs/postgres.md, Retention)")
	case postgres && !strings.HasPrefix(c.Store, "postgres://") && !strings.HasPrefix(c.Store, "postgresql://"):
		p = append(p, "--retention-store "+redactURL(c.Store)+": want postgres://RETENTION_ROLE@host:port/database (for --retain-finished)")
	case postgres:
		p = appendURLProblem(p, c.Store, "--retention-store")
	case !postgres && c.Store != "":
		p = append(p, "--retention-store is for --store postgres:// (with --retain-finished); on JetStream retention uses the NATS user "+natsstore.RetentionUser)
	}
	if natsURL != "" && c.PasswordFile == "" {
		p = append(p, "--retain-finished with --nats-url needs --retention-nats-password-file (user "+natsstore.RetentionUser+")")
	}
	if natsURL == "" && natsListen == "" && c.PasswordFile != "" {
		p = append(p, "--retention-nats-password-file is for --nats-url (the retention user's password there) or --nats-listen (the password this replica's embedded server gives that user, for replicas sharing it); the embedded server without a listener makes its own")
	}
	return p
}

// node is retention's part of the node's configuration; base are the
// options of the sidecar's own connection to --nats-url (TLS), to which
// the retention user's credentials are added.
func (c *retentionConfig) node(natsURL string, base []nats.Option) (node.Retention, error) {
	r := node.Retention{Finished: c.Finished, PerTenant: c.PerTenant, Archive: c.Archive, Store: c.Store, Conductor: c.Conductor}
	if c.KeyFile != "" {
		ks, err := archive.LoadKeys(c.KeyFile)
		if err != nil {
			return r, fmt.Errorf("--archive-key-file: %w", err)
		}
		r.ArchiveKeys = ks
	}
	if c.Finished == 0 || natsURL == "" {
		return r, nil
	}
	pw, err := (&natsConfig{PasswordFile: c.PasswordFile}).password()
	if err != nil {
		return r, fmt.Errorf("--retention-nats-password-file: %w", err)
	}
	r.NATSOptions = append(append([]nats.Option(nil), base...), nats.UserInfo(natsstore.RetentionUser, pw))
	return r, nil
}

// tenantRetention is --retain-tenant: TENANT=DURATION, repeatable.
type tenantRetention struct{ c *retentionConfig }

func (t *tenantRetention) String() string {
	if t.c == nil {
		return ""
	}
	var parts []string
	for k, v := range t.c.PerTenant {
		parts = append(parts, k+"="+v.String())
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (t *tenantRetention) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		tenant, dur, ok := strings.Cut(part, "=")
		d, err := time.ParseDuration(dur)
		if !ok || tenant == "" || err != nil || d <= 0 {
			t.c.bad = append(t.c.bad, fmt.Sprintf("--retain-tenant %q: want TENANT=DURATION with a positive duration, e.g. acme=720h", part))
			continue
		}
		if t.c.PerTenant == nil {
			t.c.PerTenant = map[string]time.Duration{}
		}
		if _, twice := t.c.PerTenant[tenant]; twice && !t.c.fromEnv[tenant] {
			t.c.bad = append(t.c.bad, fmt.Sprintf("--retain-tenant names tenant %q twice: give each tenant one duration", tenant))
			continue
		}
		delete(t.c.fromEnv, tenant)
		t.c.PerTenant[tenant] = d
	}
	return nil
}
