package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/httpapi"
)

// RunCommand submits a plan as a new run: "sidecar run submit PLAN_FILE".
type RunCommand struct{ m *Main }

// Run implements "sidecar run".
func (c *RunCommand) Run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] != "submit" && helpRequested(args) {
		args = append([]string{"submit"}, args...) // "run -h": submit's flags
	}
	if len(args) == 0 || args[0] != "submit" {
		fmt.Fprintln(c.m.Stderr, "Usage: sidecar run submit PLAN_FILE [flags]")
		return errUsage
	}
	fs := c.m.newFlagSet("run submit", "run submit PLAN_FILE [--run-request-id ID] [--tenant-id T] [--project-id P] [--environment-id E] [-l KEY=VALUE[,KEY=VALUE]] [--server URL] [-o json|yaml|name]")
	cf := clientFlags{named: true}
	cf.register(fs)
	requestID := fs.String("run-request-id", "", "idempotency id of this request (default: a new UUID, printed); resubmitting with the same id returns the same run")
	tenant := fs.String("tenant-id", envOr("SIDECAR_TENANT_ID", "default"), "tenantId (env SIDECAR_TENANT_ID)")
	project := fs.String("project-id", envOr("SIDECAR_PROJECT_ID", "default"), "projectId (env SIDECAR_PROJECT_ID)")
	env := fs.String("environment-id", envOr("SIDECAR_ENVIRONMENT_ID", "default"), "environmentId (env SIDECAR_ENVIRONMENT_ID)")
	labels := labelFlag{}
	fs.Var(labels, "l", "labels of the run, KEY=VALUE[,KEY=VALUE] (or repeat the flag; Kubernetes' rules)")
	pos, err := cf.parse(fs, args[1:], "PLAN_FILE")
	if err != nil {
		return err
	}
	p, err := plan.ParseFile(pos[0])
	if err != nil {
		return err
	}
	if *requestID == "" {
		*requestID = uuid.NewString()
	}
	started, err := cf.client().Start(ctx, httpapi.StartRequest{
		TenantID: *tenant, ProjectID: *project, EnvironmentID: *env, RunRequestID: *requestID, Plan: p, Labels: labels,
	})
	if err != nil {
		var api *httpapi.Error
		if errors.As(err, &api) && (api.Status < 500 || api.Code == httpapi.CodeNotReady || api.Code == adapter.CodeConductorURLInvalid) {
			// Refused: nothing was started (a serve not ready reads no
			// request; a wrong Conductor URL fails before any start).
			return err
		}
		// The request may have started the run before it failed (a 5xx
		// after Conductor's start, a connection cut): the same id gets it
		// back instead of starting a second.
		return fmt.Errorf("%w\nthe run may have started: repeat with --run-request-id %s to get it, or to start it once, not twice", err, *requestID)
	}
	if cf.structured() {
		return cf.print(c.m.Stdout, started, started.RunID)
	}
	what := "started"
	switch {
	case started.Status == "QUEUED" && started.NotBefore != "":
		what = "accepted and delayed by admission control: starts at " + started.NotBefore
	case started.Status == "QUEUED":
		what = fmt.Sprintf("queued by admission control (position %d): starts when capacity frees up", started.Position)
	case started.Status != "":
		what = "accepted, " + started.Status + " (see sidecar status)"
	case !started.Created:
		what = "already started by an earlier request with this id"
	}
	fmt.Fprintf(c.m.Stdout, "run %s %s\n  runRequestId %s\n", escapeText(started.RunID), what, escapeText(*requestID))
	if started.EngineRunRef != "" { // none yet for a run admission control holds
		fmt.Fprintf(c.m.Stdout, "  engineRunRef %s\n", escapeText(started.EngineRunRef))
	}
	return nil
}

// labelFlag collects -l KEY=VALUE flags.
type labelFlag map[string]string

func (l labelFlag) String() string { return "" }

// Set takes KEY=VALUE, or several comma separated as kubectl takes them
// (a label value has no comma).
func (l labelFlag) Set(v string) error {
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VALUE[,KEY=VALUE], got %q", v)
		}
		if _, dup := l[k]; dup {
			return fmt.Errorf("label %q given twice", k)
		}
		l[k] = val
	}
	return nil
}
