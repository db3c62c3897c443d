package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/conductor-sidecar/sidecar/admission"
)

// admissionConfig is admission control: limits on active runs and what a
// start over them gets.
type admissionConfig struct {
	Limits    admission.Limits
	Policy    string
	Delay     time.Duration
	MaxQueued int
	// MaxQueuedPerTenant is one tenant's share of MaxQueued.
	MaxQueuedPerTenant int
}

func (c *admissionConfig) registerFlags(fs *flag.FlagSet, env *envSettings) {
	num := func(p *int, name, usage string) {
		fs.Var(&intValue{p}, name, usage+" (env "+envName(name)+")")
		if v, ok := os.LookupEnv(envName(name)); ok {
			if fs.Set(name, v) != nil {
				*p = -1 // validate names it
			}
		}
	}
	num(&c.Limits.Global, "max-active-runs", "at most this many runs RUNNING or PAUSED at once (0: no limit)")
	num(&c.Limits.PerTenant, "max-active-runs-per-tenant", "at most this many active runs per tenantId (0: no limit)")
	num(&c.Limits.PerPlan, "max-active-runs-per-plan", "at most this many active runs per planId of a tenant, all versions (0: no limit)")
	num(&c.MaxQueued, "admission-max-queued", "under queue and delay, at most this many runs wait; a start over a limit beyond is rejected (429) (0: no bound)")
	num(&c.MaxQueuedPerTenant, "admission-max-queued-per-tenant", "under queue and delay, at most this many runs of one tenant wait; a start of that tenant over a limit beyond is rejected (429) (0: no bound)")
	stringFlag(fs, &c.Policy, "admission-policy", "a start over a limit is: queue (RunQueued, started when capacity frees up, in order), reject (429), or delay (started later, Delay per run over)")
	fs.Var(&durationValue{&c.Delay}, "admission-delay", "under --admission-policy delay, how far each run over a limit is put off (env "+envName("admission-delay")+")")
	env.set(fs, "admission-delay")
}

func (c *admissionConfig) validate() []string {
	var p []string
	if c.Limits.Global < 0 || c.Limits.PerTenant < 0 || c.Limits.PerPlan < 0 {
		p = append(p, "--max-active-runs, --max-active-runs-per-tenant and --max-active-runs-per-plan must be >= 0 (0: no limit)")
	}
	if c.MaxQueued < 0 || c.MaxQueuedPerTenant < 0 {
		p = append(p, "--admission-max-queued and --admission-max-queued-per-tenant must be >= 0 (0: no bound)")
	}
	switch c.Policy {
	case admission.Queue, admission.Reject, admission.Delay:
	default:
		p = append(p, fmt.Sprintf("--admission-policy %q: queue, reject or delay", c.Policy))
	}
	if c.Delay <= 0 {
		p = append(p, "--admission-delay must be > 0")
	}
	return p
}
