// Package node is one sidecar process: its components, built from a
// Config, opened in order and closed in reverse.
//
// A Node opens NATS (an embedded server, or a connection to a cluster),
// the run event log with its EventIdRegistry (on JetStream or
// PostgreSQL), the Conductor client and run index, the replicas'
// membership, the run list, the event bus, admission control, the run
// watcher, the drain controller, the executors, the task workers and the
// control API. Each component is opened by one small function that builds
// it with what it needs in its constructor; each reports the JetStream
// streams it keeps its state in and how to tell that it can work now
// (/readyz), and is closed by the node when the node closes.
package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/membership"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
	"github.com/conductor-sidecar/sidecar/tracing"
)

// Config is what a node is built from: settings serve fills from its
// flags, and the listeners it bound.
type Config struct {
	// ConductorURL is Conductor's API base URL.
	ConductorURL string
	// ConductorMaxCalls bounds the calls at Conductor at once, batch polls
	// aside (0: adapter.DefaultMaxConcurrentCalls).
	ConductorMaxCalls int
	// Postgres, when set, is the PostgreSQL URL where the run event log,
	// the EventIdRegistry and the control API's replies live; empty:
	// they live on JetStream. The rest of the state is on NATS either way.
	Postgres string
	// AcceptNewNATSState pairs the PostgreSQL log with this NATS state
	// although it was used with another (a lost data dir).
	AcceptNewNATSState bool
	// NATSURL is the NATS cluster to connect to, with NATSOptions (its
	// credentials and TLS); empty: an embedded server, Embedded.
	// NATSURLShown is NATSURL as messages show it, without credentials.
	NATSURL      string
	NATSURLShown string
	NATSOptions  []nats.Option
	// Embedded is the embedded server's data dir, listener, password and
	// sync interval; the node sets its logger and permissions.
	Embedded natsstore.EmbeddedConfig
	// Replicas is the replica count of every stream, bucket and object
	// store the node creates (1 to 5).
	Replicas int
	// API and Metrics are the bound listeners of the control API and of
	// GET /metrics alone (nil: none). The node serves them once every
	// component is open and closes them when it closes; an Open that
	// fails leaves them to the caller, unserved, for another attempt.
	API, Metrics net.Listener
	// Own are the host:ports no http step and no webhook sink may reach:
	// the process's listeners (the API's first) and NATSURL's servers.
	// The node adds the embedded server's listener.
	Own []string
	// APIOptions is the control API's security (Auth, TLSConfig,
	// AllowedHosts); the node sets the rest.
	APIOptions httpapi.Options
	// Exec is what plans may reach (BaseEnv, HTTPAllow, HTTPDeny); the
	// node adds the artifact store, the logger, the command records' dir
	// and the embedded server's listener. Secrets resolves the steps'
	// secret references.
	Exec    exec.Options
	Secrets *secrets.Resolver
	// DrainTimeout is a pause's default drain timeout.
	DrainTimeout time.Duration
	// RepliesMaxBytes bounds the kept answers of Idempotency-Key requests,
	// JetStream's bucket or PostgreSQL's table (0:
	// httpapi.DefaultRepliesMaxBytes).
	RepliesMaxBytes int64
	// ListFinishedInMemory bounds the run list's finished rows in memory
	// (runlist.Options.MaxFinished; 0: its default).
	ListFinishedInMemory int
	// WorkerID names this replica to Conductor and to the other replicas.
	WorkerID string
	// TaskDomain is the Conductor task domain of this deployment's runs.
	TaskDomain string
	// Concurrency is the number of steps run at once per executor kind.
	Concurrency map[string]int
	// PollersPerType is the number of poll loops per task type.
	PollersPerType int
	// PollInterval is an idle poll loop's first pause, after one empty
	// poll (taskworkers.Options.PollInterval; zero: its default, 100ms).
	// PollIntervalMax bounds the pause, which doubles over consecutive
	// empty polls (taskworkers.Options.PollIntervalMax; zero: its
	// default, 1s).
	PollInterval, PollIntervalMax time.Duration
	// ValidateWrites rejects invalid transitions at append time.
	ValidateWrites bool
	// ConductorProxy, when set, is the bound listener of the task proxy:
	// Conductor's API for outside workers, their external steps gated and
	// recorded. ConductorProxyTokens are the tokens it requires (none:
	// any request). ConductorProxyForwardAll forwards Conductor's whole
	// API through it, not only the calls workers make
	// (proxy.Options.ForwardAll).
	ConductorProxy           net.Listener
	ConductorProxyTokens     []string
	ConductorProxyForwardAll bool
	// ConductorProxyMaxUpstream bounds the proxy's connections to
	// Conductor (0: proxy.DefaultMaxUpstreamConnections).
	ConductorProxyMaxUpstream int
	// ConductorProxyMaxTaskOutput is Conductor's
	// maxTaskOutputPayloadSizeThreshold in bytes (0: its default).
	ConductorProxyMaxTaskOutput int64
	// Adopt is the adoption of existing workflow definitions (no specs:
	// none).
	Adopt adapter.AdopterOptions
	// Bus is the event bus (no sinks: none).
	Bus Bus
	// Admission is admission control (no limits: none).
	Admission Admission
	// Tracing says whether and how spans are exported (zero: off;
	// tracing.ConfigFromEnv reads the OTEL_* environment).
	Tracing tracing.Config
	// Retention moves finished runs to an archive (zero: off).
	Retention Retention
}

// Bus is the event bus: its sinks, in order, and how many times an event
// is offered to a sink before it is dead-lettered.
type Bus struct {
	Sinks       []Sink
	MaxAttempts int
}

// Sink is one bus sink: NATS or Webhook.
type Sink struct {
	NATS    *eventbus.NATSSinkConfig
	Webhook *eventbus.WebhookSinkConfig
}

// Admission is admission control: limits on active runs, and what a start
// over them gets (admission.Queue, Reject or Delay).
type Admission struct {
	Limits admission.Limits
	Policy string
	Delay  time.Duration
	// MaxQueued bounds the runs waiting (admission.Options.MaxQueued).
	MaxQueued int
	// MaxQueuedPerTenant bounds one tenant's runs waiting
	// (admission.Options.MaxQueuedPerTenant).
	MaxQueuedPerTenant int
}

func (a Admission) enabled() bool {
	return a.Limits.Global > 0 || a.Limits.PerTenant > 0 || a.Limits.PerPlan > 0
}

// quickClose bounds the close of every component but the ones that run
// steps, which get the caller's grace period.
const quickClose = 5 * time.Second

// Node is one sidecar process's components.
type Node struct {
	cfg     Config
	log     *zap.Logger
	reg     *prometheus.Registry
	running *taskworkers.Running
	// wakeup wakes the workers' idle poll loops; admission control and the
	// drain controller are built with it before the workers are.
	wakeup *taskworkers.Wakeup
	// strays asks the workers for a look for tasks a dead process left in
	// progress; the watcher is built with it before the workers are.
	strays *taskworkers.StrayLook

	// parts are the open components, in the order they were opened.
	parts   []part
	closing atomic.Bool

	// Set by Open, each by the step that opens it and read by later steps.
	srv       *natsstore.Embedded
	nc        *nats.Conn
	lost      <-chan nats.Status
	js        jetstream.JetStream
	gate      *natsstore.AlertGate
	store     eventLog
	emitter   *registry.Emitter
	replies   httpapi.Replies
	conductor *adapter.Client
	runs      *adapter.Runs
	adapterM  *adapter.Metrics
	members   *membership.Members
	list      *runlist.List
	bus       *eventbus.Bus
	admit     *admission.Controller
	archive   *archive.Archive // where finished runs go (nil without retention)
	watcher   *adapter.Watcher
	// adopter is nil unless Config.Adopt names definitions.
	adopter   *adapter.Adopter
	drain     *drain.Controller
	pauseKeys *drain.Keys
	// pauseCalls: the drain controller's pause and resume requests under
	// way, which its follower waits for.
	pauseCalls *drain.Calls
	// pauseAlone: whether the follower takes this replica for the only
	// live one (then it decides a difference at the first check).
	pauseAlone func() bool
	executors  *exec.Registry
	tracer     *tracing.Tracer // nil: tracing off
	workers    *taskworkers.Worker
}

// part is one open component as the node sees it.
type part struct {
	name string
	// close stops it; steps marks the components that run steps, which
	// close first, within the caller's grace period.
	close func(ctx context.Context) error
	steps bool
	// check reports whether it can work now (nil: nothing to check).
	check func(ctx context.Context) error
	// streams are the JetStream streams it keeps its state in.
	streams []string
}

// eventLog is the run event log as the node uses it: *natsstore.Store or
// *pgstore.Store.
type eventLog interface {
	statestore.Store
	statestore.Follower
	// Check reports whether the log can append now (/readyz).
	Check(ctx context.Context) error
}

// New returns a node built from cfg that logs to log and registers its
// metrics with reg. Open opens it.
func New(cfg Config, log *zap.Logger, reg *prometheus.Registry) *Node {
	// Open adds the embedded server's listener to these.
	cfg.Own, cfg.Exec.HTTPDeny = slices.Clone(cfg.Own), slices.Clone(cfg.Exec.HTTPDeny)
	return &Node{cfg: cfg, log: log, reg: reg, running: taskworkers.NewRunning(), wakeup: taskworkers.NewWakeup(),
		strays: taskworkers.NewStrayLook()}
}

// Open opens every component in order; the control API serves last. An
// Open that fails closes what it opened and returns why.
func (n *Node) Open(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			err = n.explain(err)
			_ = n.Close(context.Background())
		}
	}()
	for _, open := range []func(context.Context) error{
		n.openTracing, n.openNATS, n.openLog, n.openRuns, n.openMembers, n.openRunSpans, n.openList, n.openBus, n.openAdmission,
		n.openWatcher, n.openDrain, n.openExecutors, n.openWorkers, n.openProxy, n.openGuard, n.openRetention, n.openAPI, n.openMetrics,
	} {
		if err := open(ctx); err != nil {
			return err
		}
	}
	return nil
}

// explain adds to a failed Open why the NATS server refused a request:
// one it refused for want of permission only times out, and the
// connection knows why.
func (n *Node) explain(err error) error {
	if n.nc == nil {
		return err
	}
	if last := n.nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) && !errors.Is(err, nats.ErrPermissionViolation) {
		return fmt.Errorf("%w (%w)", err, last)
	}
	return err
}

func (n *Node) add(p part) { n.parts = append(n.parts, p) }

// Close closes the components in reverse order of opening: first the
// ones that run steps, within ctx (the grace period of running steps),
// then the others, each within a few seconds. It returns their errors
// joined.
func (n *Node) Close(ctx context.Context) error {
	n.closing.Store(true)
	var errs []error
	closeParts := func(ctx context.Context, steps bool) {
		for i := len(n.parts) - 1; i >= 0; i-- {
			if p := n.parts[i]; p.steps == steps && p.close != nil {
				err := p.close(ctx)
				if steps && err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
					// The grace ended first: the documented stop, not a
					// failure. The steps still running were interrupted
					// and their tasks handed back to Conductor.
					n.log.Warn("the shutdown grace ended before every running step did: they were interrupted and their tasks handed back to Conductor, which gives them out again (a hand-back that did not reach it is logged apart)",
						zap.String("part", p.name))
					continue
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", p.name, err))
				}
			}
		}
	}
	closeParts(ctx, true)
	quick, cancel := context.WithTimeout(context.Background(), quickClose)
	defer cancel()
	closeParts(quick, false)
	n.parts = nil
	return errors.Join(errs...)
}

// Ready reports whether the node can append now: every component's
// check, in order of opening.
func (n *Node) Ready(ctx context.Context) error {
	for _, p := range n.parts {
		if p.check == nil {
			continue
		}
		if err := p.check(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Live is nil while the NATS connection is open or may come back
// (reconnecting), and says why not once it is closed for good.
func (n *Node) Live() error {
	if n.nc == nil || !n.nc.IsClosed() || n.closing.Load() {
		return nil
	}
	cause := "closed"
	if err := n.nc.LastError(); err != nil {
		cause = err.Error()
	}
	return fmt.Errorf("the connection to NATS was closed for good (%s) and cannot come back; restart serve (its supervisor does)", cause)
}

// Lost receives when the NATS connection is closed (Live then says why,
// unless the node is closing).
func (n *Node) Lost() <-chan nats.Status { return n.lost }

// Conn is the node's NATS connection.
func (n *Node) Conn() *nats.Conn { return n.nc }

// streams are the JetStream streams of every open component.
func (n *Node) streams() []string {
	var out []string
	for _, p := range n.parts {
		out = append(out, p.streams...)
	}
	return out
}
