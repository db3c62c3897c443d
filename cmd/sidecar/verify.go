package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
)

// VerifyCommand recomputes the hash chain of the run event log on
// PostgreSQL and reports each run that does not verify
// (docs/postgres.md, "Tamper evidence").
type VerifyCommand struct{ m *Main }

// Run implements "sidecar verify". It returns an error (exit 1) when a
// run does not verify or the database cannot be read.
func (c *VerifyCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("verify", "verify --store postgres://user@host:port/database [-o json] [RUN_ID...]")
	store := fs.String("store", envOr("SIDECAR_STORE", ""), "the PostgreSQL database of the log (env SIDECAR_STORE; the password from PGPASSFILE or PGPASSWORD)")
	output := fs.String("o", "text", "output format: text or json")
	runs, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case !strings.HasPrefix(*store, "postgres://") && !strings.HasPrefix(*store, "postgresql://"):
		return usageError(fs, "--store must be a PostgreSQL URL like postgres://sidecar@db:5432/sidecar (the JetStream log keeps no hash chain)")
	case *output != "text" && *output != "json":
		return usageError(fs, "-o must be text or json")
	}
	v, err := pgstore.Verify(ctx, *store, runs)
	if err != nil {
		return err
	}
	if *output == "json" {
		if v.Broken == nil {
			v.Broken = []pgstore.Broken{}
		}
		if err := printJSON(c.m.Stdout, v); err != nil {
			return err
		}
	} else {
		for _, b := range v.Broken {
			at := ""
			if b.RunSeq > 0 {
				at = fmt.Sprintf(" runSeq %d", b.RunSeq)
			}
			fmt.Fprintf(c.m.Stdout, "BROKEN %s %s%s: %s\n", b.RunID, b.Code, at, b.Message)
		}
		fmt.Fprintf(c.m.Stdout, "verified %s, %s: %d broken\n", countOf(v.Runs, "run"), countOf(v.Records, "record"), len(v.Broken))
	}
	if len(v.Broken) > 0 {
		return fmt.Errorf("%d runs do not verify: the log was changed outside the sidecar; restore the database from a backup taken before the change, or see docs/postgres.md, \"Tamper evidence\"", len(v.Broken))
	}
	return nil
}
