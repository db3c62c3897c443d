package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/membership"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/artifacts"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
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
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(c.m.Stderr, err)
		return errUsage
	}
	log, err := newLogger(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	// The pprof listener is bound first, so that the http executor can be
	// told never to call it.
	var pprofLn net.Listener
	if cfg.PprofListen != "" {
		if pprofLn, err = net.Listen("tcp", cfg.PprofListen); err != nil {
			return fmt.Errorf("--pprof-listen %s: %w", cfg.PprofListen, err)
		}
		defer pprofLn.Close()
	}
	var own []string // the sidecar's own listeners besides the API
	if pprofLn != nil {
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
		stop := servePprof(pprofLn, log)
		defer stop()
	}
	log.Info("sidecar ready", zap.String("listen", sc.addr), zap.String("conductor", cfg.ConductorURL), zap.String("version", buildVersion()))
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	lost := sc.serveUntil(ctx, hup)
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
		case <-sc.lost:
			return sc.live()
		case <-ctx.Done():
			return nil
		}
	}
}

// live is nil while the NATS connection is open or may come back
// (reconnecting), and says why not once it is closed for good.
func (sc *sidecar) live() error {
	if sc.nc == nil || !sc.nc.IsClosed() || sc.closing.Load() {
		return nil
	}
	cause := "closed"
	if err := sc.nc.LastError(); err != nil {
		cause = err.Error()
	}
	return fmt.Errorf("the connection to NATS was closed for good (%s) and cannot come back; restart serve (its supervisor does)", cause)
}

// eventLog is the run event log as serve uses it: *natsstore.Store (the
// default) or *pgstore.Store (--store postgres://...).
type eventLog interface {
	statestore.Store
	statestore.Follower
	// Check reports whether the log can append now (/readyz).
	Check(ctx context.Context) error
}

// sidecar is a running "serve": every component, in start order.
type sidecar struct {
	log        *zap.Logger
	addr       string
	ln         net.Listener // bound, not yet served by api
	srv        *natsstore.Embedded
	nc         *nats.Conn
	store      eventLog
	closeStore func()
	members    *membership.Members
	list       *runlist.List
	bus        *eventbus.Bus         // nil without sinks
	admit      *admission.Controller // nil without limits
	watcher    *adapter.Watcher
	drain      *drain.Controller
	worker     *taskworkers.Worker
	execs      *exec.Registry
	api        *httpapi.Server
	metrics    *httpapi.MetricsServer // nil without --metrics-listen
	metricsLn  net.Listener           // bound, not yet served by metrics
	apiCfg     *apiConfig             // its tokens file is reloaded on SIGHUP
	// lost receives when the NATS connection is closed; closing is set
	// once close closes it on purpose.
	lost    <-chan nats.Status
	closing atomic.Bool
}

// startSidecar opens every component. own are addresses of the process's
// other listeners (pprof) that http steps must never reach.
func startSidecar(ctx context.Context, cfg Config, log *zap.Logger, own ...string) (sc *sidecar, err error) {
	sc = &sidecar{log: log}
	defer func() {
		if err != nil {
			// A request the server refused for want of permission only
			// times out; the connection knows why (transientStart).
			if sc.nc != nil {
				if last := sc.nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) && !errors.Is(err, nats.ErrPermissionViolation) {
					err = fmt.Errorf("%w (%w)", err, last)
				}
			}
			_ = sc.close(context.Background())
		}
	}()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	if sc.nc, err = connectNATS(cfg, sc, log); err != nil {
		return sc, err
	}
	sc.lost = sc.nc.StatusChanged(nats.CLOSED)
	js, err := jetstream.New(sc.nc)
	if err != nil {
		return sc, fmt.Errorf("jetstream: %w", err)
	}
	if err := checkClusterSize(sc.nc, cfg.NATSReplicas); err != nil {
		return sc, err
	}
	replicas := cfg.NATSReplicas
	gate, err := natsstore.OpenAlertGate(ctx, js, natsstore.AlertGateOptions{Replicas: replicas})
	if err != nil {
		return sc, err
	}
	// The run event log, the EventIdRegistry and the control API's kept
	// replies: on JetStream (the default) or all three in one PostgreSQL
	// database (--store postgres://...). The rest of the state stays on
	// NATS either way (docs/postgres.md).
	var ids *registry.Registry
	var replies httpapi.Replies
	var pg *pgstore.Store
	if cfg.postgresStore() {
		pg, err = pgstore.Open(ctx, cfg.Store, pgstore.Options{Logger: log, Metrics: statestore.NewMetrics(reg), Gate: gate, DurableSnapshots: true})
		if err != nil {
			return sc, err
		}
		sc.store, sc.closeStore = pg, pg.Close
		if ids, err = registry.OpenPostgres(ctx, pg.Pool(), registry.PostgresOptions{Logger: log, Metrics: registry.NewMetrics(reg)}); err != nil {
			return sc, err
		}
		if replies, err = httpapi.OpenPostgresReplies(ctx, pg.Pool(), 0); err != nil {
			return sc, err
		}
		log.Info("run event log, event ids and control replies on postgresql", zap.String("database", pg.Pool().Config().ConnConfig.Database))
	} else {
		ns, err := natsstore.Open(ctx, js, natsstore.Options{Logger: log, Metrics: statestore.NewMetrics(reg), Gate: gate, Replicas: replicas,
			SnapshotBucket: natsstore.DefaultSnapshotBucket})
		if err != nil {
			return sc, err
		}
		sc.store, sc.closeStore = ns, func() { _ = ns.Close() }
		if ids, err = registry.Open(ctx, js, registry.Options{Logger: log, Metrics: registry.NewMetrics(reg), Replicas: replicas}); err != nil {
			return sc, err
		}
		if replies, err = httpapi.OpenKVReplies(ctx, js, 0, replicas); err != nil {
			return sc, err
		}
	}
	var appender registry.Appender = sc.store
	if cfg.ValidateWrites {
		if appender, err = statestore.NewValidatingStore(sc.store); err != nil {
			return sc, err
		}
	}
	emitter := registry.NewEmitter(ids, appender)

	adapterMetrics := adapter.NewMetrics(reg)
	conductor, err := adapter.NewClient(adapter.ClientOptions{BaseURL: cfg.ConductorURL, Logger: log, Metrics: adapterMetrics})
	if err != nil {
		return sc, err
	}
	runs, err := adapter.OpenRuns(ctx, js, conductor, emitter, adapter.RunsOptions{Logger: log, Metrics: adapterMetrics, TaskDomain: cfg.TaskDomain, Replicas: replicas})
	if err != nil {
		return sc, err
	}
	if pg != nil {
		if err := pairNATS(ctx, js, pg, cfg.AcceptNewNATSState); err != nil {
			return sc, err
		}
	}
	// The replicas on this NATS divide the runs' background work (the
	// watcher's scans, the drain monitor's passes).
	if sc.members, err = membership.Open(ctx, js, membership.Options{Name: cfg.WorkerID, Replicas: replicas, Logger: log, Metrics: membership.NewMetrics(reg)}); err != nil {
		return sc, err
	}
	// The run list (GET /v1/runs, sidecar runs): one replica follows the
	// log into it, every replica mirrors it.
	if sc.list, err = runlist.Open(ctx, js, runlist.Options{Log: sc.store, Owner: sc.members, Replicas: replicas, Logger: log, Metrics: runlist.NewMetrics(reg), Registerer: reg}); err != nil {
		return sc, err
	}
	// The API's address is bound now so that neither the http executor nor
	// a webhook sink can be pointed at it; it serves once every component
	// is open.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return sc, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	sc.addr = ln.Addr().String()
	sc.ln = ln
	if cfg.API.MetricsListen != "" {
		if sc.metricsLn, err = net.Listen("tcp", cfg.API.MetricsListen); err != nil {
			return sc, fmt.Errorf("--metrics-listen %s: %w", cfg.API.MetricsListen, err)
		}
		own = append(own, sc.metricsLn.Addr().String())
	}
	// Never reachable by an http step or a webhook: the API, the metrics
	// listener, pprof and NATS (the embedded server's listener, or the
	// servers of --nats-url).
	own = append([]string{sc.addr}, own...)
	if sc.srv != nil {
		if a := sc.srv.Addr(); a != nil {
			own = append(own, a.String())
		}
	}
	own = append(own, natsHostPorts(cfg.NATSURL)...)
	// The event bus (--bus-sink): one replica per sink delivers the log.
	if len(cfg.Bus.Sinks) > 0 {
		if err := cfg.Bus.checkNotSelf(ctx, own); err != nil {
			return sc, err
		}
		sinks, err := cfg.Bus.open(ctx, js, replicas)
		if err != nil {
			return sc, err
		}
		if sc.bus, err = eventbus.Open(ctx, js, eventbus.Options{Log: sc.store, Sinks: sinks, Owner: sc.members, MaxAttempts: cfg.Bus.MaxAttempts,
			Replicas: replicas, Logger: log, Metrics: eventbus.NewMetrics(reg)}); err != nil {
			return sc, err
		}
	}
	// Admission control (--max-active-runs...): starts go through the one
	// decider among the replicas.
	var starter httpapi.Starter = &httpapi.RunStarter{Runs: runs}
	if cfg.Admission.enabled() {
		if sc.admit, err = admission.Open(ctx, js, admission.Options{Limits: cfg.Admission.Limits, Policy: cfg.Admission.Policy,
			Delay: cfg.Admission.Delay, Runs: runs, Log: emitter, Snapshots: sc.store, Active: sc.list, Owner: sc.members,
			Replicas: replicas, Logger: log, Metrics: admission.NewMetrics(reg)}); err != nil {
			return sc, err
		}
		starter = &httpapi.AdmittedStarter{Admission: sc.admit}
	}
	sc.watcher = adapter.NewWatcher(runs, sc.store, adapter.WatcherOptions{Owner: sc.members, Logger: log, Metrics: adapterMetrics, DrainTimeout: cfg.DrainTimeout})
	if err := sc.watcher.Open(ctx); err != nil {
		return sc, err
	}

	arts, err := artifacts.Open(ctx, js, artifacts.Options{Logger: log, Replicas: replicas})
	if err != nil {
		return sc, err
	}
	execOpts := exec.Options{Artifacts: arts, Logger: log}
	if cfg.NATSURL == "" {
		// Beside the embedded store, under its lock: the records of running
		// commands, which the next start ends if this process dies.
		execOpts.CommandDir = filepath.Join(cfg.DataDir, "commands")
	}
	resolver := &secrets.Resolver{Logger: log}
	if err := cfg.Exec.apply(&execOpts, resolver, sc.addr, cfg.ConductorURL, own[1:]...); err != nil {
		return sc, err
	}
	executors := exec.New(execOpts)
	sc.execs = executors
	concurrency := map[string]int{}
	for kind, n := range cfg.Concurrency {
		concurrency[plan.TaskType(kind)] = n
	}
	var tasks taskworkers.TaskClient = conductor
	if cfg.TaskDomain != "" {
		tasks = adapter.DomainPoller{Client: conductor, Domain: cfg.TaskDomain}
	}
	// Built in dependency order, each with what it needs in its
	// constructor: the set of running steps (which a cancel interrupts),
	// the drain controller, then the workers, which nudge the watcher and
	// the drain monitor and pause a run on a held failure.
	running := taskworkers.NewRunning()
	watcher := sc.watcher
	ctrl := drain.New(sc.store, emitter, conductor, drain.Options{
		DefaultTimeout: cfg.DrainTimeout, Interrupt: running.Interrupt, ActiveRuns: watcher.OpenRunIDs, Drains: runs, Ledger: runs, Schedule: runs,
		Owner: sc.members, Logger: log, Metrics: drain.NewMetrics(reg),
	})
	sc.drain = ctrl
	sc.worker = taskworkers.New(tasks, sc.store, emitter, resolver, executors.Executors(), taskworkers.Options{
		WorkerID: cfg.WorkerID, Concurrency: concurrency, PollersPerType: cfg.PollersPerType, Running: running,
		Guard: func(ctx context.Context, runID, workflowID string) error {
			_, err := runs.EnsureStarted(ctx, runID, workflowID)
			switch {
			case errors.Is(err, adapter.ErrConflict):
				// Our run, another workflow: an orphan of a crashed start.
				return fmt.Errorf("%w: %v", taskworkers.ErrForeignWorkflow, err)
			case errors.Is(err, adapter.ErrNotFound):
				// Not a run of this deployment (another sidecar's, on
				// another NATS): leave it to its owner.
				return fmt.Errorf("%w: %v", taskworkers.ErrUnknownRun, err)
			}
			return err
		},
		Recover: func(ctx context.Context) ([]model.Task, error) {
			return runs.InFlightTasks(ctx, cfg.WorkerID)
		},
		OnTaskDone: func(runID string, mayEndRun bool) {
			if mayEndRun {
				watcher.Nudge(runID)
			}
			ctrl.Nudge(runID)
		},
		PauseOnFailure: func(ctx context.Context, runID, workflowID, stepID string) error {
			_, err := ctrl.Pause(ctx, runID, workflowID, drain.PauseRequest{Reason: "stepFailed", StepID: stepID, RequestedBy: "sidecar " + cfg.WorkerID})
			return err
		},
		Logger: log, Metrics: taskworkers.NewMetrics(reg),
	})
	// The task types must exist before polling them; registering is
	// idempotent. Conductor may still be starting: workers then retry.
	if err := conductor.RegisterTaskDefs(ctx, plan.TaskDefs()); err != nil {
		log.Warn("could not register the task definitions yet; they are registered with the first plan", zap.Error(err))
	}
	if err := sc.drain.Open(ctx); err != nil {
		return sc, err
	}
	// Commands a dead process left running end before the worker records
	// their tries ended.
	if err := executors.Open(ctx); err != nil {
		return sc, err
	}
	if err := sc.worker.Open(ctx); err != nil {
		return sc, err
	}

	// Every bucket the sidecar keeps state in; /readyz reports one deleted
	// or re-created by an administrator (the event stream: Store.Check).
	streams := []string{"KV_" + adapter.DefaultRunsBucket,
		"KV_" + natsstore.DefaultAlertBucket, "OBJ_" + artifacts.DefaultBucket,
		"KV_" + membership.DefaultBucket, "KV_" + runlist.DefaultBucket}
	if !cfg.postgresStore() {
		streams = append(streams, "KV_"+registry.DefaultBucket, "KV_"+natsstore.DefaultStateBucket, "KV_"+httpapi.KVRepliesBucket,
			"KV_"+natsstore.DefaultSnapshotBucket)
	}
	if sc.bus != nil {
		streams = append(streams, "KV_"+eventbus.Bucket, "KV_"+eventbus.DeadLetterBucket)
	}
	if sc.admit != nil {
		streams = append(streams, "KV_"+admission.Bucket)
	}
	buckets, err := natsstore.NewGuard(ctx, js, streams...)
	if err != nil {
		return sc, err
	}
	if !cfg.postgresStore() {
		streams = append(streams, natsstore.DefaultStream)
	}
	reportReplicas(ctx, js, replicas, streams, log)
	apiOpts := httpapi.Options{
		Log: sc.store, List: sc.list, Replies: replies, Starter: starter, Control: &httpapi.RunControl{Runs: runs, Drain: sc.drain},
		DrainTimeout: cfg.DrainTimeout, Gatherer: reg, Registerer: reg, Logger: log, Live: sc.live,
		// Ready means "can append now": NATS connected, the log whole and
		// the one this process verified, JetStream enabled (a full or
		// read-only disk disables it), Conductor answering.
		Ready: func(ctx context.Context) error {
			if !sc.nc.IsConnected() {
				return errors.New("nats not connected")
			}
			if err := sc.store.Check(ctx); err != nil {
				return err
			}
			if err := buckets.Check(ctx); err != nil {
				return err
			}
			if sc.srv != nil {
				if err := sc.srv.Check(); err != nil {
					return err
				}
			}
			if _, err := js.AccountInfo(ctx); err != nil {
				return fmt.Errorf("jetstream cannot store: %w", err)
			}
			return conductor.Health(ctx)
		},
	}
	if sc.bus != nil {
		apiOpts.Bus = sc.bus
	}
	if sc.admit != nil {
		apiOpts.Queue = sc.admit
	}
	if err := cfg.API.apply(&apiOpts, log); err != nil {
		return sc, err
	}
	sc.apiCfg = &cfg.API
	sc.api = httpapi.NewServer(apiOpts)
	sc.api.Open(ln)
	sc.ln = nil
	if sc.metricsLn != nil {
		sc.metrics = httpapi.NewMetricsServer(reg, log)
		sc.metrics.Open(sc.metricsLn)
		log.Info("serving /metrics without authentication", zap.String("metricsListen", sc.metricsLn.Addr().String()))
		sc.metricsLn = nil
	}
	return sc, nil
}

// close stops the components in reverse order. ctx bounds the workers'
// grace period.
func (sc *sidecar) close(ctx context.Context) error {
	sc.closing.Store(true)
	var errs []error
	if sc.worker != nil {
		if err := sc.worker.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("workers: %w", err))
		}
	}
	if sc.execs != nil {
		if err := sc.execs.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("executors: %w", err))
		}
	}
	quick, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if sc.api != nil {
		if err := sc.api.Close(quick); err != nil {
			errs = append(errs, fmt.Errorf("api: %w", err))
		}
	}
	if sc.metrics != nil {
		if err := sc.metrics.Close(quick); err != nil {
			errs = append(errs, fmt.Errorf("metrics: %w", err))
		}
	}
	if sc.drain != nil {
		if err := sc.drain.Close(quick); err != nil {
			errs = append(errs, fmt.Errorf("drain: %w", err))
		}
	}
	if sc.watcher != nil {
		if err := sc.watcher.Close(quick); err != nil {
			errs = append(errs, fmt.Errorf("watcher: %w", err))
		}
	}
	if sc.bus != nil {
		sc.bus.Close()
	}
	if sc.admit != nil {
		sc.admit.Close()
	}
	if sc.list != nil {
		sc.list.Close()
	}
	if sc.members != nil {
		// Leaves the members: the others take over this replica's runs now.
		if err := sc.members.Close(quick); err != nil {
			errs = append(errs, fmt.Errorf("members: %w", err))
		}
	}
	if sc.ln != nil {
		_ = sc.ln.Close()
	}
	if sc.metricsLn != nil {
		_ = sc.metricsLn.Close()
	}
	if sc.closeStore != nil {
		sc.closeStore()
	}
	if sc.nc != nil {
		sc.nc.Close()
	}
	if sc.srv != nil {
		sc.srv.Shutdown()
	}
	return errors.Join(errs...)
}

// pairNATS checks, before anything is written, that the NATS state this
// sidecar has (the run index above all) is the one the PostgreSQL log was
// used with: the run index's creation time is its identity. A sidecar on
// the right database and the wrong NATS state would not know the runs in
// flight (they would stay RUNNING: TestE2E_PostgresStoreLostNATSState).
func pairNATS(ctx context.Context, js jetstream.JetStream, pg *pgstore.Store, accept bool) error {
	st, err := js.Stream(ctx, "KV_"+adapter.DefaultRunsBucket)
	if err != nil {
		return fmt.Errorf("read the run index's stream: %w", err)
	}
	state := fmt.Sprintf("run index %s created %s", adapter.DefaultRunsBucket, st.CachedInfo().Created.UTC().Format(time.RFC3339Nano))
	if _, err := pg.Pair(ctx, state, accept); err != nil {
		if errors.Is(err, statestore.ErrDamaged) {
			return fmt.Errorf("%w: start with the --data-dir (or --nats-url) it was used with: the runs in flight are known only there; "+
				"if that state is gone for good, start once with --accept-new-nats-state (runs in flight then stay RUNNING in Conductor: cancel them there)", err)
		}
		return err
	}
	return nil
}

// connectNATS starts the embedded server (unless --nats-url) and connects
// to NATS as the sidecar's least-privileged user.
func connectNATS(cfg Config, sc *sidecar, log *zap.Logger) (*nats.Conn, error) {
	if cfg.NATSURL == "" {
		ec := natsstore.EmbeddedConfig{DataDir: cfg.DataDir, Listen: cfg.NATS.Listen, SyncInterval: cfg.SyncInterval, Logger: log,
			Permissions: natsstore.Permissions(natsstore.DefaultSubjectPrefix, cfg.Bus.natsSubjects()...)}
		if cfg.NATS.Listen != "" {
			pw, err := cfg.NATS.password()
			if err != nil {
				return nil, err
			}
			ec.Password = pw
		}
		srv, err := natsstore.StartEmbedded(ec)
		if err != nil {
			return nil, err
		}
		sc.srv = srv
		if addr := srv.Addr(); addr != nil {
			log.Info("embedded nats listens for other replicas (user "+natsstore.SidecarUser+")", zap.String("addr", addr.String()))
		}
		return srv.Connect(append(newNATSEvents(log).options(), nats.Name("sidecar "+cfg.WorkerID))...)
	}
	opts, err := cfg.NATS.connectOptions()
	if err != nil {
		return nil, err
	}
	opts = append(append(opts, newNATSEvents(log).options()...), nats.Name("sidecar "+cfg.WorkerID), nats.MaxReconnects(-1))
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", redactURL(cfg.NATSURL), err)
	}
	return nc, nil
}

func newLogger(cfg Config) (*zap.Logger, error) {
	var zc zap.Config
	if cfg.LogFormat == "console" {
		zc = zap.NewDevelopmentConfig()
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
