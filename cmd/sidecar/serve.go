package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/node"
)

// ServeCommand runs the sidecar: NATS (embedded unless --nats-url), the
// event store and registry, the Conductor adapter and run watcher, the task
// workers and the control API.
type ServeCommand struct{ m *Main }

// Run implements "sidecar serve". The first SIGINT/SIGTERM stops polling
// and lets running steps finish within --shutdown-grace; a second one ends
// the grace period at once.
func (c *ServeCommand) Run(ctx context.Context, args []string) error {
	// Before anything else: command steps run as this process's user and
	// must not read its environment or memory through /proc.
	if err := hideFromSameUser(); err != nil {
		return err
	}
	cfg := DefaultConfig()
	fs := c.m.newFlagSet("serve", "serve [flags]")
	cfg.registerFlags(fs)
	check := fs.Bool("check", false, "check the configuration (flags, SIDECAR_* variables, the modes of the credential files, the tokens file) and exit: 0 valid, 2 with every problem; nothing is started, bound or connected to")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(c.m.Stderr, err)
		return errUsage
	}
	if *check {
		return c.check(&cfg, fs)
	}
	log, err := newLogger(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	for _, line := range unknownSettings(os.Environ(), fs) {
		log.Warn(line)
	}
	// The pprof listener is bound first, so that the http executor can be
	// told never to call it.
	var pprofLn net.Listener
	var own []string // the sidecar's own listeners besides the API
	if cfg.PprofListen != "" {
		if pprofLn, err = net.Listen("tcp", cfg.PprofListen); err != nil {
			return fmt.Errorf("--pprof-listen %s: %w", cfg.PprofListen, err)
		}
		defer pprofLn.Close()
		own = append(own, pprofLn.Addr().String())
	}
	if cfg.NATSURL != "" && cfg.NATS.anonymous() {
		log.Warn("connecting to NATS without credentials: anyone who reaches it can rewrite the log (see docs/security.md)", zap.String("url", redactURL(cfg.NATSURL)))
	}
	sc, err := startWithRetry(ctx, cfg, log, own...)
	if err != nil {
		return err
	}
	if pprofLn != nil {
		defer servePprof(pprofLn, log)()
	}
	readyCtx, readyDone := context.WithCancel(ctx)
	said := make(chan struct{})
	go func() {
		defer close(said)
		sc.sayReady(readyCtx, cfg.ConductorURL)
	}()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	lost := sc.serveUntil(ctx, hup)
	readyDone()
	<-said
	if lost != nil {
		log.Error("stopping: "+lost.Error(), zap.String("code", httpapi.CodeNotLive))
	}
	log.Info("shutting down: polling stopped, running steps may finish", zap.Duration("grace", cfg.ShutdownGrace))
	// A second signal ends the grace period.
	graceCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	graceCtx, stop := signal.NotifyContext(graceCtx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = errors.Join(lost, sc.close(graceCtx))
	log.Info("sidecar stopped")
	return err
}

// check is serve --check once cfg is valid: the settings serve would
// ignore are warned about, the tokens file is read as serve reads it,
// and nothing is started. What only a start can tell (an address in use,
// the data dir, NATS, the store, Conductor) is not checked.
func (c *ServeCommand) check(cfg *Config, fs *flag.FlagSet) error {
	for _, line := range unknownSettings(os.Environ(), fs) {
		fmt.Fprintln(c.m.Stderr, "warning: "+line)
	}
	if f := cfg.API.TokensFile; f != "" {
		if _, err := httpapi.LoadCredentials(f); err != nil {
			fmt.Fprintf(c.m.Stderr, "CONFIG_INVALID: invalid configuration:\n  --tokens-file: %v\n", err)
			return errUsage
		}
	}
	fmt.Fprintln(c.m.Stdout, "configuration valid (an address in use, the data dir, NATS, the store and Conductor are checked when serve starts)")
	return nil
}

// readyCheck bounds one readiness check of sayReady; readyEvery is how
// often it checks again while serve is not ready.
const (
	readyCheck = 5 * time.Second
	readyEvery = 2 * time.Second
)

// sayReady logs "sidecar ready" (with the API's address, which scripts
// read from it) once every component can work, as /readyz would answer
// 200. Until then it logs once why serve is not ready, and /readyz
// answers 503: Conductor away at start is waited for, not fatal
// (docs/operations.md, the ENGINE_UNAVAILABLE runbook). It returns when
// ctx ends.
func (sc *sidecar) sayReady(ctx context.Context, conductorURL string) {
	fields := []zap.Field{zap.String("listen", sc.addr), zap.String("conductor", conductorURL), zap.String("version", buildVersion())}
	told := false
	for {
		cctx, cancel := context.WithTimeout(ctx, readyCheck)
		err := sc.node.Ready(cctx)
		cancel()
		switch {
		case err == nil:
			sc.log.Info("sidecar ready", fields...)
			return
		case ctx.Err() != nil:
			return
		case !told:
			sc.log.Warn("sidecar serving, not ready yet: "+err.Error()+"; /readyz answers 503 until it is, and the ready line follows",
				append(fields, zap.String("code", errcode.CodeOf(err)))...)
			told = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(readyEvery):
		}
	}
}

// sidecar is a running serve: its node, and the API settings SIGHUP
// reloads.
type sidecar struct {
	node   *node.Node
	addr   string     // the API's
	nc     *nats.Conn // the node's connection to NATS
	apiCfg *apiConfig
	log    *zap.Logger
	// listeners holds the listeners serve bound, released once the node
	// is closed.
	listeners node.Config
}

// startSidecar binds the API's listeners and opens a node on them. own
// are addresses of the process's other listeners (pprof) that http steps
// must never reach.
func startSidecar(ctx context.Context, cfg Config, log *zap.Logger, own ...string) (*sidecar, error) {
	nodeCfg, err := cfg.node(log, own)
	if err != nil {
		return nil, err
	}
	sc, err := openSidecar(ctx, &cfg, nodeCfg, log)
	if err != nil {
		closeListeners(nodeCfg)
	}
	return sc, err
}

// openSidecar opens a node on nodeCfg, built from cfg: one attempt to
// start. A failed attempt has closed what it opened, and left the
// listeners bound and unserved.
func openSidecar(ctx context.Context, cfg *Config, nodeCfg node.Config, log *zap.Logger) (*sidecar, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
	// This attempt's servers accept from sessions of the held listeners:
	// their Close (the attempt failed, or serve stops) ends only those.
	attempt := nodeCfg
	attempt.API, attempt.Metrics, attempt.ConductorProxy = session(nodeCfg.API), session(nodeCfg.Metrics), session(nodeCfg.ConductorProxy)
	n := node.New(attempt, log, reg)
	if err := n.Open(ctx); err != nil {
		return nil, err
	}
	// The node serves every listener it was given: their connections go
	// to its servers from now on, not only from each server's first Accept.
	for _, ln := range []net.Listener{attempt.API, attempt.Metrics, attempt.ConductorProxy} {
		if s, ok := ln.(*heldSession); ok {
			s.begin()
		}
	}
	return &sidecar{node: n, addr: nodeCfg.API.Addr().String(), nc: n.Conn(), apiCfg: &cfg.API, log: log, listeners: nodeCfg}, nil
}

// session is a Session of ln when serve holds it, else ln.
func session(ln net.Listener) net.Listener {
	if h, ok := ln.(*heldListener); ok {
		return h.Session()
	}
	return ln
}

// serveUntil serves until ctx ends (nil) or the NATS connection is closed
// for good (the error says so): nats.go does not reconnect a connection
// the server closed for a protocol error, and nothing else in the process
// can work without it, so serve ends and its supervisor (systemd, the
// kubelet) starts it anew. /healthz answers 503 from that moment. hup
// reloads the tokens file.
func (sc *sidecar) serveUntil(ctx context.Context, hup <-chan os.Signal) error {
	for {
		select {
		case <-hup:
			sc.apiCfg.reload(sc.log)
		case <-sc.node.Lost():
			return sc.node.Live()
		case <-ctx.Done():
			return nil
		}
	}
}

// close closes the node; ctx bounds the running steps' grace period.
func (sc *sidecar) close(ctx context.Context) error {
	err := sc.node.Close(ctx)
	closeListeners(sc.listeners)
	return err
}

func newLogger(cfg Config) (*zap.Logger, error) {
	var zc zap.Config
	if cfg.LogFormat == "console" {
		zc = zap.NewDevelopmentConfig()
		// Human-readable lines, without a stack trace under every warning
		// (development mode's): stack traces only for errors, as in json.
		zc.Development = false
	} else {
		zc = zap.NewProductionConfig()
		zc.EncoderConfig.TimeKey = "ts"
		zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	}
	level, err := zapcore.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.OutputPaths, zc.ErrorOutputPaths = []string{"stderr"}, []string{"stderr"}
	return zc.Build()
}
