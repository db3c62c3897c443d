package main

import (
	"flag"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/httpapi"
)

// apiConfig is the control API's security configuration: authentication,
// authorization and TLS of the listener.
type apiConfig struct{}

// registerFlags binds the API security flags to fs.
func (c *apiConfig) registerFlags(fs *flag.FlagSet) {}

// validate returns the problems of the API settings; listen is --listen.
func (c *apiConfig) validate(listen string) []string { return nil }

// apply sets the security options of the API server.
func (c *apiConfig) apply(o *httpapi.Options, log *zap.Logger) error { return nil }
