package main

import (
	"runtime"

	"context"
	"fmt"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = ""

// VersionCommand prints the sidecar's version.
type VersionCommand struct{ m *Main }

// Run implements "sidecar version".
func (c *VersionCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("version", "version")
	if err := parse(fs, args); err != nil {
		return err
	}
	_, err := fmt.Fprintln(c.m.Stdout, "sidecar "+buildVersion())
	return err
}

// buildVersion returns the -ldflags version, else the module version, else
// the VCS revision, else "devel".
func buildVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return "devel+" + rev + " (" + info.GoVersion + ")"
}

// buildInfo is the gauge sidecar_build_info{version, goversion} = 1: the
// dashboard shows which versions the sidecars run.
func buildInfo() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "sidecar_build_info",
		Help:        "1, labelled with the sidecar's version and the Go version that built it.",
		ConstLabels: prometheus.Labels{"version": buildVersion(), "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}
