package main

import (
	"flag"

	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
)

// execConfig is what plans may reach: the command environment, the roots
// of file secrets and the addresses the http executor may call.
type execConfig struct{}

// registerFlags binds the executor flags to fs.
func (c *execConfig) registerFlags(fs *flag.FlagSet) {}

// validate returns the problems of the executor settings.
func (c *execConfig) validate() []string { return nil }

// apply sets the executor and secret options. apiAddr is the control API's
// bound address and conductorURL Conductor's: the http executor must never
// reach either.
func (c *execConfig) apply(o *exec.Options, r *secrets.Resolver, apiAddr, conductorURL string) error {
	return nil
}
