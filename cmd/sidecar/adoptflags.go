package main

import (
	"flag"
	"os"
	"strings"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/node"
)

// adoptConfig is the adoption of existing workflow definitions
// (docs/workers.md, "Adopting existing workflows").
type adoptConfig struct {
	// Specs are the --adopt values, NAME or NAME:VERSION.
	Specs []string
	// Interval is how often adopted runs with a system task in progress
	// are read back (0: the default, 1s).
	Interval time.Duration
	// TenantID, ProjectID and EnvironmentID of the adopted runs.
	TenantID, ProjectID, EnvironmentID string
	// TaskDomain, when set, adopts only the workflows started in that
	// task domain.
	TaskDomain string
	// OnStepFailure is the failure policy of adopted runs' SIMPLE tasks:
	// fail (the definition decides) or pause (held for RETRY_STEP).
	OnStepFailure string
}

// adoptValue is the repeatable --adopt flag; SIDECAR_ADOPT holds
// comma-separated values, which the first --adopt replaces (fromEnv).
type adoptValue struct {
	p       *[]string
	fromEnv bool
}

func (v *adoptValue) String() string {
	if v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v *adoptValue) Set(s string) error {
	if v.fromEnv {
		*v.p, v.fromEnv = nil, false
	}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*v.p = append(*v.p, part)
		}
	}
	return nil
}

func (c *adoptConfig) registerFlags(fs *flag.FlagSet, env *envSettings) {
	adopt := &adoptValue{p: &c.Specs}
	fs.Var(adopt, "adopt", "make every workflow of this Conductor definition a run of the log: NAME or NAME:VERSION (repeatable, or comma-separated) (env "+envName("adopt")+")")
	if v, ok := os.LookupEnv(envName("adopt")); ok {
		env.check("adopt", v, adopt.Set(v))
		adopt.fromEnv = true
	}
	c.Interval = time.Second
	fs.Var(&durationValue{&c.Interval}, "adopt-interval", "how often adopted runs with a system task in progress are read back from Conductor (their definitions' running lists every 5 intervals) (env "+envName("adopt-interval")+")")
	env.set(fs, "adopt-interval")
	c.TenantID, c.ProjectID, c.EnvironmentID = "default", "default", "default"
	stringFlag(fs, &c.TenantID, "adopt-tenant-id", "tenantId of adopted runs")
	stringFlag(fs, &c.ProjectID, "adopt-project-id", "projectId of adopted runs")
	stringFlag(fs, &c.EnvironmentID, "adopt-environment-id", "environmentId of adopted runs")
	stringFlag(fs, &c.TaskDomain, "adopt-task-domain", "adopt only the workflows started in this task domain (taskToDomain \"*\"); deployments sharing a Conductor and an adopted definition need distinct ones (empty: every workflow of the definition)")
	c.OnStepFailure = plan.OnFailureFail
	stringFlag(fs, &c.OnStepFailure, "adopt-on-step-failure", "a SIMPLE task of an adopted run failed for good: fail (forwarded; the definition decides) or pause (held, the run paused, for RETRY_STEP)")
}

func (c *adoptConfig) validate() []string {
	var p []string
	for _, s := range c.Specs {
		if _, err := adapter.ParseAdoptSpec(s); err != nil {
			p = append(p, "--adopt "+s+": "+err.Error())
		}
	}
	if c.Interval < 0 {
		p = append(p, "--adopt-interval must not be negative")
	}
	if strings.ContainsAny(c.TaskDomain, " ,:*/") {
		p = append(p, "--adopt-task-domain must not contain spaces, ',', ':', '*' or '/'")
	}
	if c.OnStepFailure != plan.OnFailureFail && c.OnStepFailure != plan.OnFailurePause {
		p = append(p, "--adopt-on-step-failure "+c.OnStepFailure+": want fail or pause")
	}
	return p
}

// apply puts the adopted definitions into nc (validate checked them).
func (c *adoptConfig) apply(nc *node.Config) {
	for _, s := range c.Specs {
		if spec, err := adapter.ParseAdoptSpec(s); err == nil {
			nc.Adopt.Specs = append(nc.Adopt.Specs, spec)
		}
	}
	nc.Adopt.Interval = c.Interval
	nc.Adopt.OnStepFailure = c.OnStepFailure
	nc.Adopt.TaskDomain = c.TaskDomain
	nc.Adopt.Identity = adapter.AdoptedIdentity{TenantID: c.TenantID, ProjectID: c.ProjectID, EnvironmentID: c.EnvironmentID}
}
