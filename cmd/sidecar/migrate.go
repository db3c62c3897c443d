package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
)

// MigrateCommand applies the PostgreSQL schema's migrations as the owner
// of the log and grants the runtime role what serve needs, and the
// retention role what retention needs (docs/postgres.md, "Roles").
type MigrateCommand struct{ m *Main }

// Run implements "sidecar migrate".
func (c *MigrateCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("migrate", "migrate --store postgres://OWNER@host:port/database [--runtime-role ROLE] [--retention-role ROLE]")
	store := fs.String("store", envOr("SIDECAR_STORE", ""), "the PostgreSQL database of the log, as its owner (env SIDECAR_STORE; the password from PGPASSFILE or PGPASSWORD)")
	runtime := fs.String("runtime-role", "", "the role sidecar serve connects as: recorded, and granted what serve needs now and after every later migration")
	retentionRole := fs.String("retention-role", "", "the role retention removes finished runs as (serve --retention-store): recorded, and granted EXECUTE on remove_run alone, now and after every later migration")
	if err := parse(fs, args); err != nil {
		return err
	}
	if !strings.HasPrefix(*store, "postgres://") && !strings.HasPrefix(*store, "postgresql://") {
		return usageError(fs, "--store must be a PostgreSQL URL like postgres://sidecar_owner@db:5432/sidecar")
	}
	m, err := pgstore.Migrate(ctx, *store, pgstore.MigrateOptions{RuntimeRole: *runtime, RetentionRole: *retentionRole})
	if err != nil {
		return err
	}
	if m.From == m.To {
		fmt.Fprintf(c.m.Stdout, "schema at version %d: nothing to apply\n", m.To)
	} else {
		fmt.Fprintf(c.m.Stdout, "schema migrated from version %d to %d\n", m.From, m.To)
	}
	if m.RuntimeRole == "" {
		fmt.Fprintln(c.m.Stdout, "no runtime role: serve may connect as the owner (not for production: --runtime-role ROLE, docs/postgres.md)")
	} else {
		fmt.Fprintf(c.m.Stdout, "runtime role %s granted what serve needs\n", m.RuntimeRole)
	}
	if m.RetentionRole != "" {
		fmt.Fprintf(c.m.Stdout, "retention role %s granted what retention needs (remove_run)\n", m.RetentionRole)
	}
	return nil
}
