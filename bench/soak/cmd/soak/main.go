// Command soak runs the compressed-time retention soak (package soak):
//
//	go build -o /tmp/sidecar ./cmd/sidecar
//	go run ./bench/soak/cmd/soak -sidecar /tmp/sidecar -dir /tmp/soak-js
//	go run ./bench/soak/cmd/soak -sidecar /tmp/sidecar -dir /tmp/soak-pg -postgres -postgres-port 25499
//
// It writes DIR/samples.csv and DIR/summary.txt (also to stdout) and exits
// 1 unless the verdict is PASS.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/conductor-sidecar/sidecar/bench/soak"
)

func main() {
	var cfg soak.Config
	flag.StringVar(&cfg.Sidecar, "sidecar", "", "the sidecar binary (go build -o /tmp/sidecar ./cmd/sidecar)")
	flag.StringVar(&cfg.Root, "root", ".", "the repository's root")
	flag.StringVar(&cfg.Dir, "dir", "/tmp/soak", "a new directory for the data dir, archive, logs, CSV and summary")
	flag.DurationVar(&cfg.Window, "window", 5*time.Minute, "serve's --retain-finished")
	flag.Float64Var(&cfg.Rate, "rate", 10, "runs submitted a second")
	flag.DurationVar(&cfg.Duration, "duration", 30*time.Minute, "how long runs are submitted")
	flag.DurationVar(&cfg.Sample, "sample", 10*time.Second, "how often hot state is sampled")
	flag.IntVar(&cfg.Steps, "steps", 1, "noop steps per run")
	flag.DurationVar(&cfg.Settle, "settle", 0, "after the last submission, how long to wait for every run to leave (default window + 3m)")
	flag.DurationVar(&cfg.HeapProfile, "heap-profile", 0, "how often to save serve's heap profile as DIR/heap-<seconds>.pb.gz (serve gets a --pprof-listen of its own; 0: none)")
	flag.StringVar(&cfg.ConductorURL, "conductor-url", "", "a running Conductor's API to use (…/api); empty: start one with deploy/local/conductor.sh")
	flag.IntVar(&cfg.ConductorPort, "conductor-port", 8199, "the port of the Conductor the soak starts (its state in DIR/conductor)")
	flag.BoolVar(&cfg.Postgres, "postgres", false, "keep the log in PostgreSQL (--store postgres://), in a cluster started with deploy/local/postgres.sh")
	flag.IntVar(&cfg.PostgresPort, "postgres-port", 25432, "the port of the PostgreSQL cluster the soak starts (its state in DIR/pg)")
	flag.StringVar(&cfg.PostgresAdminURL, "postgres-admin-url", "", "a running cluster's superuser URL to use instead of starting one")
	flag.Parse()
	if cfg.Sidecar == "" {
		fmt.Fprintln(os.Stderr, "soak: -sidecar is required: build one with go build -o /tmp/sidecar ./cmd/sidecar")
		os.Exit(2)
	}
	var err error
	if cfg.Sidecar, err = filepath.Abs(cfg.Sidecar); err == nil {
		cfg.Root, err = filepath.Abs(cfg.Root)
	}
	if err == nil {
		cfg.Dir, err = filepath.Abs(cfg.Dir)
	}
	if err == nil {
		err = os.MkdirAll(cfg.Dir, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	csv, err := os.Create(filepath.Join(cfg.Dir, "samples.csv"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	defer csv.Close()
	cfg.CSV, cfg.Log = csv, os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := soak.Do(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		if res == nil {
			os.Exit(1)
		}
	}
	summary, ferr := os.Create(filepath.Join(cfg.Dir, "summary.txt"))
	if ferr != nil {
		fmt.Fprintln(os.Stderr, "soak:", ferr)
		os.Exit(1)
	}
	defer summary.Close()
	fmt.Fprintf(summary, "soak: window %s, %.1f runs/s for %s, %d steps a run, postgres %v; load at the end %s\n",
		cfg.Window, cfg.Rate, cfg.Duration, cfg.Steps, cfg.Postgres, loadavg())
	res.Summary(io.MultiWriter(summary, os.Stdout))
	if err != nil || !res.Flat() || len(res.NotArchived) > 0 || len(res.ConductorLeft) > 0 || res.VerifyErr != nil {
		os.Exit(1)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil || len(b) < 14 {
		return "?"
	}
	return string(b[:14])
}
