package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.opentelemetry.io/otel"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/membership"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/artifacts"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
	"github.com/conductor-sidecar/sidecar/taskworkers/keep"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
	"github.com/conductor-sidecar/sidecar/tracing"
)

// openTracing builds the tracer of Config.Tracing (none when off). It
// closes last, exporting the spans still buffered.
//
// When tracing is on it also sends OpenTelemetry's errors (a failed
// export, a full queue) to the node's logger, rate limited. OpenTelemetry
// reports them only to one global handler per process (otel.Handle), so
// this is the one place the sidecar sets global state: the last node
// opened with tracing on gets the process's errors, and a closed node's
// handler drops them.
func (n *Node) openTracing(ctx context.Context) error {
	t, err := tracing.New(ctx, n.cfg.Tracing, n.log)
	if err != nil || t == nil {
		return err
	}
	n.tracer = t
	errs := tracing.NewErrorHandler(n.log, tracing.DefaultErrorEvery, promauto.With(n.reg).NewCounter(prometheus.CounterOpts{
		Name: "sidecar_tracing_errors_total",
		Help: "Errors the tracing SDK reported (an export that failed, a full span queue, spans dropped): spans may be lost. Logged at most once a minute.",
	}))
	otel.SetErrorHandler(errs)
	n.add(part{name: "tracing", close: func(ctx context.Context) error {
		err := t.Close(ctx)
		errs.Close()
		return err
	}})
	return nil
}

// openRunSpans makes the run and pause cycle spans from the log, for the
// runs this replica owns (when tracing is on).
func (n *Node) openRunSpans(ctx context.Context) error {
	rs := tracing.NewRunSpans(n.tracer, n.store, tracing.RunSpansOptions{Owner: n.members, Logger: n.log})
	if rs == nil {
		return nil
	}
	n.add(part{name: "run spans", close: rs.Close})
	return rs.Open(ctx)
}

// openRuns opens the Conductor client and the run index, and pairs a
// PostgreSQL log with this NATS state. Conductor is ready while it
// answers.
func (n *Node) openRuns(ctx context.Context) error {
	n.adapterM = adapter.NewMetrics(n.reg)
	conductor, err := adapter.NewClient(adapter.ClientOptions{BaseURL: n.cfg.ConductorURL, Logger: n.log, Metrics: n.adapterM, MaxConcurrentCalls: n.cfg.ConductorMaxCalls})
	if err != nil {
		return err
	}
	n.conductor = conductor
	if err := n.checkRunIndex(ctx); err != nil {
		return err
	}
	runs, err := adapter.OpenRuns(ctx, n.js, conductor, n.emitter, adapter.RunsOptions{Logger: n.log, Metrics: n.adapterM, TaskDomain: n.cfg.TaskDomain, Replicas: n.cfg.Replicas, Tracer: n.workflowTracer()})
	if err != nil {
		return err
	}
	n.runs = runs
	n.add(part{name: "conductor", check: conductor.Health, streams: runs.Streams()})
	if pg, ok := n.store.(*pgstore.Store); ok {
		return n.pairNATS(ctx, pg)
	}
	return nil
}

// checkRunIndex refuses to create the run index afresh beside a JetStream
// log that already holds records: the index is where each run's workflow
// and start request are known, and an empty one would start serving as
// if no run were in flight (their tasks handed back as unknown, a repeated
// start made twice). On PostgreSQL, pairNATS sees it (the index's
// creation time). --accept-new-nats-state starts anyway. Only with
// single-replica streams: on a NATS cluster a bucket another replica
// created an instant ago may not be found yet, and the runtime guard
// (Ready) sees a stream deleted while the sidecar runs.
func (n *Node) checkRunIndex(ctx context.Context) error {
	log, ok := n.store.(*natsstore.Store)
	if !ok || n.cfg.AcceptNewNATSState || n.cfg.Replicas > 1 {
		return nil
	}
	stream := "KV_" + adapter.DefaultRunsBucket
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := n.js.Stream(sctx, stream)
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err // there (nil), or unknown: the open below says
	}
	last, err := log.LastSeq(ctx)
	if err != nil || last == 0 {
		return err
	}
	return &statestore.Error{Code: statestore.CodeStoreDamaged, Message: fmt.Sprintf(
		"the run index (stream %s) is missing, and the log %s holds records up to sequence %d: the data dir lost part of its state; "+
			"restore it from a backup, or start once with --accept-new-nats-state to go on without it (runs in flight then stay RUNNING in Conductor: cancel them there) "+
			`(runbook: docs/operations.md, "Damaged data dir")`, stream, log.Stream(), last)}
}

// openMembers joins the replicas on this NATS, which divide the runs'
// background work (the watcher's scans, the drain monitor's passes).
func (n *Node) openMembers(ctx context.Context) error {
	m, err := membership.Open(ctx, n.js, membership.Options{Name: n.cfg.WorkerID, Replicas: n.cfg.Replicas, Logger: n.log, Metrics: membership.NewMetrics(n.reg)})
	if err != nil {
		return err
	}
	n.members = m
	// Closing leaves the members: the others take over this replica's runs now.
	n.add(part{name: "members", close: m.Close, streams: m.Streams()})
	return nil
}

// openList opens the run list (GET /v1/runs, sidecar runs): one replica
// follows the log into it, every replica mirrors it.
func (n *Node) openList(ctx context.Context) error {
	l, err := runlist.Open(ctx, n.js, runlist.Options{Log: n.store, Owner: n.members, Replicas: n.cfg.Replicas, Logger: n.log,
		MaxFinished: n.cfg.ListFinishedInMemory, Plans: planStepCounter{n.runs}, Metrics: runlist.NewMetrics(n.reg), Registerer: n.reg})
	if err != nil {
		return err
	}
	n.list = l
	n.add(part{name: "run list", close: l.Close, streams: l.Streams()})
	return nil
}

// planStepCounter counts a plan version's steps for the run list
// (runlist.StepCounter) with the run index's plan lookup: a read of the
// plan's workflow definition from Conductor, which the list caches.
type planStepCounter struct{ runs *adapter.Runs }

var _ runlist.StepCounter = planStepCounter{}

func (c planStepCounter) StepCount(ctx context.Context, tenantID, planID, planVersion string) (int, error) {
	steps, err := c.runs.PlanSteps(ctx, tenantID, planID, planVersion)
	return len(steps), err
}

// openBus opens the event bus when it has sinks: one replica per sink
// delivers the log.
func (n *Node) openBus(ctx context.Context) error {
	if len(n.cfg.Bus.Sinks) == 0 {
		return nil
	}
	if err := n.cfg.Bus.checkNotSelf(ctx, n.cfg.Own, n.log); err != nil {
		return err
	}
	sinks, err := n.cfg.Bus.open(ctx, n.js, n.cfg.Replicas, n.cfg.Own)
	if err != nil {
		return err
	}
	b, err := eventbus.Open(ctx, n.js, eventbus.Options{Log: n.store, Sinks: sinks, Owner: n.members, MaxAttempts: n.cfg.Bus.MaxAttempts,
		Replicas: n.cfg.Replicas, Logger: n.log, Metrics: eventbus.NewMetrics(n.reg)})
	if err != nil {
		return err
	}
	n.bus = b
	n.add(part{name: "bus", close: b.Close, streams: b.Streams()})
	return nil
}

// openAdmission opens admission control when it has limits: starts go
// through the one decider among the replicas. Without limits, runs an
// earlier start with limits left queued are still started: admission
// control opens with no limit, starts them and lists them while they wait,
// and the API's starts go straight to Conductor.
func (n *Node) openAdmission(ctx context.Context) error {
	a := n.cfg.Admission
	if !a.enabled() {
		waiting, err := admission.Waiting(ctx, n.js)
		if err != nil || waiting == 0 {
			return err
		}
		n.log.Warn("admission limits are off, and runs queued under limits are still waiting: starting them", zap.Int("runs", waiting))
	}
	c, err := admission.Open(ctx, n.js, admission.Options{Limits: a.Limits, Policy: a.Policy, Delay: a.Delay, MaxQueued: a.MaxQueued, MaxQueuedPerTenant: a.MaxQueuedPerTenant, Runs: n.runs, Log: n.emitter,
		Snapshots: n.store, Active: n.list, Owner: n.members, Replicas: n.cfg.Replicas, Waker: n.wakeup, Logger: n.log, Metrics: admission.NewMetrics(n.reg)})
	if err != nil {
		return err
	}
	n.admit = c
	n.add(part{name: "admission", close: c.Close, streams: c.Streams()})
	return nil
}

// openWatcher opens the run watcher, which follows Conductor's view of
// the runs into the log.
func (n *Node) openWatcher(ctx context.Context) error {
	// drain's own keys (drain marks, scheduled resumes, engine ledger),
	// moved once from the run index where earlier versions kept them; its
	// follower is the watcher's reaction to the pauses it sees in Conductor.
	keys, err := drain.OpenKeys(ctx, n.js, drain.KeysOptions{Replicas: n.cfg.Replicas, LegacyBucket: adapter.DefaultRunsBucket, Logger: n.log})
	if err != nil {
		return err
	}
	n.pauseKeys = keys
	n.add(part{name: "pause keys", streams: keys.Streams()})
	// The follower puts nothing down to Conductor while the drain
	// controller's pause or resume of the run is under way: they share
	// the requests under way (openDrain).
	// Another replica's requests are not among them: while other replicas
	// are live, a difference is put down to Conductor only once it has
	// lasted the follower's grace (docs/drain.md).
	n.pauseCalls, n.pauseAlone = drain.NewCalls(), alone(n.members, time.Now())
	pauses := drain.NewFollower(n.store, n.emitter, n.conductor, keys, drain.FollowerOptions{DrainTimeout: n.cfg.DrainTimeout, Drains: keys, Calls: n.pauseCalls, Interrupt: n.running.Interrupt,
		Alone: n.pauseAlone, Grace: drain.GraceFor(n.conductor.LongestPauseCall()), Logger: n.log})
	wopts := adapter.WatcherOptions{Owner: n.members, Pauses: pauses, StartAdopted: n.strays.Ask, Logger: n.log, Metrics: n.adapterM}
	if len(n.cfg.Adopt.Specs) > 0 {
		aopts := n.cfg.Adopt
		aopts.Owner, aopts.Pauses, aopts.Logger = n.members, pauses, n.log
		n.adopter = adapter.NewAdopter(n.runs, n.store, aopts)
		wopts.Adopted = n.adopter
	}
	n.watcher = adapter.NewWatcher(n.runs, n.store, wopts)
	n.add(part{name: "watcher", close: n.watcher.Close})
	if err := n.watcher.Open(ctx); err != nil {
		return err
	}
	n.warnAdoptedOutside(ctx)
	if n.adopter == nil {
		return nil
	}
	n.add(part{name: "adopter", close: n.adopter.Close})
	return n.adopter.Open(ctx)
}

// aloneAfter is how long after it joined a replica may take itself for
// the only live one: membership counts a member once a heartbeat of it
// arrives after the join (every 2 s), so until then it may not know the
// others yet. It is membership's default DeadAfter (five heartbeats).
const aloneAfter = 10 * time.Second

// alone tells whether m counts this replica, which joined at joined, as
// the only live one; not while it cannot tell, nor before aloneAfter.
func alone(m *membership.Members, joined time.Time) func() bool {
	return func() bool {
		if time.Since(joined) < aloneAfter {
			return false
		}
		keys, unknown := m.Live()
		return !unknown && len(keys) == 1 && keys[0] == m.Key()
	}
}

// openDrain opens the drain controller: pause, resume and cancel, and
// the monitor that ends drains.
func (n *Node) openDrain(ctx context.Context) error {
	n.drain = drain.New(n.store, n.emitter, n.conductor, drain.Options{
		DefaultTimeout: n.cfg.DrainTimeout, Interrupt: n.running.Interrupt, ActiveRuns: n.watcher.OpenRunIDs, Drains: n.pauseKeys, Ledger: n.pauseKeys, Schedule: n.pauseKeys,
		Calls: n.pauseCalls, Owner: n.members, Waker: n.wakeup, Adopted: n.adoptedRuns(), PlanTasks: n.watcher, Logger: n.log, Metrics: drain.NewMetrics(n.reg),
	})
	n.add(part{name: "drain", close: n.drain.Close})
	return n.drain.Open(ctx)
}

// adoptedRuns is the adopter for the drain controller; nil (not a nil
// *Adopter in the interface) without adoption.
func (n *Node) adoptedRuns() drain.AdoptedRuns {
	if n.adopter == nil {
		return nil
	}
	return n.adopter
}

// openExecutors opens the artifact store and the executors. Commands a
// dead process left running end before the workers record their tries
// ended.
func (n *Node) openExecutors(ctx context.Context) error {
	arts, err := artifacts.Open(ctx, n.js, artifacts.Options{Logger: n.log, Replicas: n.cfg.Replicas})
	if err != nil {
		return err
	}
	n.add(part{name: "artifacts", streams: arts.Streams()})
	opts := n.cfg.Exec
	opts.Artifacts, opts.Logger = arts, n.log
	if n.cfg.NATSURL == "" {
		// Beside the embedded store, under its lock: the records of running
		// commands, which the next start ends if this process dies.
		opts.CommandDir = filepath.Join(n.cfg.Embedded.DataDir, "commands")
	}
	n.executors = exec.New(opts)
	n.add(part{name: "executors", close: n.executors.Close, steps: true})
	return n.executors.Open(ctx)
}

// openWorkers registers the task types and starts the task workers.
// Conductor may still be starting: then the workers retry.
func (n *Node) openWorkers(ctx context.Context) error {
	concurrency := map[string]int{}
	for kind, c := range n.cfg.Concurrency {
		concurrency[plan.TaskType(kind)] = c
	}
	var tasks taskworkers.TaskClient = n.conductor
	if n.cfg.TaskDomain != "" {
		tasks = adapter.DomainPoller{Client: n.conductor, Domain: n.cfg.TaskDomain}
	}
	wopts := taskworkers.Options{
		WorkerID: n.cfg.WorkerID, Concurrency: concurrency, PollersPerType: n.cfg.PollersPerType,
		PollInterval: n.cfg.PollInterval, PollIntervalMax: n.cfg.PollIntervalMax, Running: n.running, Wakeup: n.wakeup, StrayLook: n.strays,
		Guard:        runGuard{n.runs, n.adopter}.check,
		Recover:      inFlight{n.runs, n.cfg.WorkerID}.tasks,
		OnTaskDone:   taskDone{n.watcher, n.drain, n.adopter}.nudge,
		OnPausedTask: n.watcher.Recheck, OnCancellingTask: n.watcher.Recheck,
		PauseOnFailure: failurePause{n.drain, statestore.RequestedByWorker(n.cfg.WorkerID)}.pause,
		Tasks:          n.conductor, Definitions: n.conductor, ExternalInFlight: externalInFlight{n.runs, n.adopter}.tasks,
		Logger: n.log, Metrics: taskworkers.NewMetrics(n.reg), Tracer: n.tracer,
	}
	if n.adopter != nil {
		wopts.Adopted = n.adopter
	}
	if n.cfg.ConductorProxy != nil {
		// Outside workers' outputs Conductor has not taken yet, read by
		// whichever replica answers the step's next try.
		ks, err := keep.Open(ctx, n.js, keep.Options{Replicas: n.cfg.Replicas})
		if err != nil {
			return err
		}
		n.add(part{name: "output keep", streams: ks.Streams()})
		wopts.OutputKeep = ks
	}
	w := taskworkers.New(tasks, n.store, n.emitter, n.cfg.Secrets, n.executors.Executors(), wopts)
	n.workers = w
	// The task types must exist before polling them; registering is
	// idempotent.
	if err := n.conductor.RegisterTaskDefs(ctx, plan.TaskDefs()); err != nil {
		n.log.Warn("could not register the task definitions yet; they are registered with the first plan", zap.Error(err))
	}
	n.add(part{name: "workers", close: w.Close, steps: true})
	if err := w.Open(ctx); err != nil {
		return err
	}
	n.lookAfterStarts(ctx)
	return nil
}

// startDecidedAfter is how long after a start lease expires its start is
// decided: the watcher's scan (2 s) and a margin.
const startDecidedAfter = 5 * time.Second

// lookAfterStarts asks the workers for one more look for strays once the
// starts under way at Open are decided. A previous process of this worker
// id that died in the middle of a start may have taken its workflow's
// first task, which cannot be listed before the workflow is recorded; the
// replica that adopts the workflow may be another one, whose watcher asks
// only its own workers (StartAdopted).
func (n *Node) lookAfterStarts(ctx context.Context) {
	until, err := n.runs.StartsUnderWay(ctx)
	if err != nil {
		n.log.Warn("could not list the starts under way; a task a previous process took in the middle of one waits for Conductor's response timeout", zap.Error(err))
		return
	}
	if until.IsZero() {
		return
	}
	t := time.AfterFunc(time.Until(until)+startDecidedAfter, n.strays.Ask)
	n.add(part{name: "stray look after starts", close: func(context.Context) error {
		t.Stop()
		return nil
	}})
}

// openProxy serves the task proxy on Config.ConductorProxy, when set.
func (n *Node) openProxy(context.Context) error {
	if n.cfg.ConductorProxy == nil {
		return nil
	}
	p, err := proxy.New(n.workers, proxy.Options{Conductor: n.cfg.ConductorURL, Tokens: n.cfg.ConductorProxyTokens,
		ForwardAll: n.cfg.ConductorProxyForwardAll, MaxConnections: n.cfg.APIOptions.MaxConnections, MaxUpstreamConnections: n.cfg.ConductorProxyMaxUpstream,
		MaxTaskOutputBytes: n.cfg.ConductorProxyMaxTaskOutput,
		Logger:             n.log, Metrics: proxy.NewMetrics(n.reg)})
	if err != nil {
		return err
	}
	p.Open(n.cfg.ConductorProxy)
	n.add(part{name: "proxy", close: p.Close})
	return nil
}

// openGuard watches every stream the components keep state in: /readyz
// reports one deleted or re-created by an administrator. It warns once
// about a stream whose replica count is not Config.Replicas.
func (n *Node) openGuard(ctx context.Context) error {
	streams := n.streams()
	g, err := natsstore.NewGuard(ctx, n.js, streams...)
	if err != nil {
		return err
	}
	n.add(part{name: "streams", check: g.Check})
	reportReplicas(ctx, n.js, n.cfg.Replicas, streams, n.log)
	return nil
}

// openAPI serves the control API on Config.API.
func (n *Node) openAPI(context.Context) error {
	opts := n.cfg.APIOptions
	opts.Log, opts.List, opts.Replies, opts.Starter = n.store, n.list, n.replies, n.starter()
	opts.Control, opts.Plans = n.drain, n.runs
	opts.DrainTimeout, opts.Gatherer, opts.Registerer, opts.Logger, opts.Tracer = n.cfg.DrainTimeout, n.reg, n.reg, n.log, n.tracer
	// Live: the NATS connection may still come back. Ready: every
	// component can work now, so an append can succeed.
	opts.Live, opts.Ready = n.Live, n.Ready
	if n.bus != nil {
		opts.Bus = n.bus
	}
	if n.admit != nil {
		opts.Queue = n.admit
	}
	if n.archive != nil {
		opts.Archive = n.archive
	}
	if n.adopter != nil {
		opts.Adoption = n.adopter // a new adopted workflow is a run at its first request
	}
	if len(opts.NotifySecret) > 0 {
		opts.Notifications = n.watcher // Conductor's status notifications: a prompt check of the run
	}
	api := httpapi.NewServer(opts)
	api.Open(n.cfg.API)
	n.add(part{name: "api", close: api.Close})
	return nil
}

// workflowTracer is what gives workflows their trace context: none when
// tracing is off (a nil *tracing.Tracer in the interface would not be nil).
func (n *Node) workflowTracer() adapter.WorkflowTracer {
	if n.tracer == nil {
		return nil
	}
	return n.tracer
}

// starter starts runs: through admission control when it is on. Each
// start wakes the task workers' idle poll loops: admission control's
// decider wakes them for the runs it starts, queued ones included.
func (n *Node) starter() httpapi.Starter {
	if n.admit != nil && n.cfg.Admission.enabled() {
		return &httpapi.AdmittedStarter{Admission: n.admit}
	}
	return wakingStarter{&httpapi.RunStarter{Runs: n.runs}, n.wakeup}
}

// openMetrics serves GET /metrics alone on Config.Metrics, when set.
func (n *Node) openMetrics(context.Context) error {
	if n.cfg.Metrics == nil {
		return nil
	}
	m := httpapi.NewMetricsServer(n.reg, n.log)
	m.MaxConnections = n.cfg.APIOptions.MaxConnections
	m.Open(n.cfg.Metrics)
	n.log.Info("serving /metrics without authentication", zap.String("metricsListen", n.cfg.Metrics.Addr().String()))
	n.add(part{name: "metrics", close: m.Close})
	return nil
}

// listenerAddr is addr as a destination no step may reach.
func listenerAddr(addr string) (exec.Destination, error) {
	d, err := exec.ParseDestination(addr)
	if err != nil {
		return d, fmt.Errorf("listener address %q: %w", addr, err)
	}
	return d, nil
}

// warnAdoptedOutside says at start which in-flight adopted runs are of
// definitions this process does not adopt (an --adopt dropped since they
// were adopted): their tasks are no longer recorded, so their log will
// miss steps; the run watcher still records their end.
func (n *Node) warnAdoptedOutside(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	outside, err := n.runs.AdoptedOutside(ctx, n.cfg.Adopt.Specs)
	if err != nil {
		n.log.Warn("could not check the in-flight adopted runs against --adopt", zap.Error(err))
	}
	if len(outside) == 0 {
		return
	}
	defs, runs := make([]string, 0, len(outside)), 0
	for d, k := range outside {
		defs, runs = append(defs, fmt.Sprintf("%s (%d)", d, k)), runs+k
	}
	slices.Sort(defs)
	n.log.Warn("in-flight adopted runs of definitions this sidecar does not adopt: their tasks are no longer recorded, so their logs will miss steps (their end is still recorded); add --adopt NAME for them until they end (docs/workers.md, \"Adopting existing workflows\")",
		zap.Int("runs", runs), zap.Strings("definitions", defs))
}
