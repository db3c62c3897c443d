package adapter

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// DefaultRunsBucket is the JetStream KV bucket of the run index.
const DefaultRunsBucket = "SIDECAR_RUNS"

// Defaults of RunsOptions.
const (
	// DefaultLeaseTTL is RunsOptions.LeaseTTL when unset.
	DefaultLeaseTTL = 30 * time.Second
	// DefaultStartWait is RunsOptions.StartWait when unset.
	DefaultStartWait = 15 * time.Second
	// DefaultPlanRecheck is RunsOptions.PlanRecheck when unset: a read
	// of a plan version's definition a minute at most, per process, only
	// while runs of it start.
	DefaultPlanRecheck = time.Minute
)

// EngineType is the engineType of the RunStarted events the adapter appends.
const EngineType = "conductor"

// Emitter appends events through the EventIdRegistry protocol;
// *registry.Emitter satisfies it. The adapter appends RunStarted with
// Emit, and the run's terminal event and the steps of adopted runs with
// EmitIf, fenced on the runSeq of the state they were decided on.
type Emitter interface {
	Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error)
	// EmitIf appends only if the run's last runSeq is lastSeq (else an
	// error matching statestore.ErrRunChanged, nothing written).
	EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error)
}

// RunsOptions configures OpenRuns. The zero value works.
type RunsOptions struct {
	// Bucket is the KV bucket (default DefaultRunsBucket).
	Bucket string
	// Replicas is the bucket's replica count (default 1).
	Replicas int
	// LeaseTTL is how long a start attempt owns a run request before
	// another StartRun (or the watcher) may take over (default 30s). It
	// must exceed twice the client's Timeout.
	LeaseTTL time.Duration
	// StartWait bounds how long StartRun waits for another attempt that
	// holds the lease before it returns ErrRunStartInProgress (default
	// 15s; the caller's context may end the wait earlier).
	StartWait time.Duration
	// TaskDomain, when set, puts every task of the workflows this Runs
	// starts in that Conductor task domain (taskToDomain {"*": TaskDomain}):
	// only workers polling with the same domain get them. It keeps the
	// sidecar's task types (sidecar_command, ...) apart between deployments
	// or tests sharing one Conductor. Empty: no domain.
	TaskDomain string
	// ListTimeout bounds a listing of the bucket's keys when the caller's
	// context has no deadline (default 30s).
	ListTimeout time.Duration
	// PlanRecheck is how long a plan version this process registered is
	// trusted to be unchanged in Conductor before a start reads its
	// workflow definition back again (default DefaultPlanRecheck): an
	// edit made in Conductor is then registered over.
	PlanRecheck time.Duration
	// Logger (default zap.NewNop()).
	Logger *zap.Logger
	// Metrics (nil: none).
	Metrics *Metrics
	// Tracer gives each run's workflow its trace context, in the input
	// variable InputTraceContext (nil: none).
	Tracer WorkflowTracer
}

// WorkflowTracer gives a run's workflow the trace context of the run's
// span (tracing.Tracer): a W3C carrier, {"traceparent": ...}, or nil when
// tracing is off.
type WorkflowTracer interface {
	WorkflowTraceContext(runID string) map[string]any
}

// Runs registers plans and starts runs on Conductor, idempotently and
// safely across replicas, keeping the run index (runId <-> workflow) in a
// JetStream KV bucket. It is safe for concurrent use; any number of Runs on
// any number of processes may share one bucket and one Conductor.
type Runs struct {
	kv        jetstream.KeyValue
	js        jetstream.JetStream // for leader reads of kv (leaderRun)
	conductor *Client
	emitter   Emitter
	opts      RunsOptions
	log       *zap.Logger
	metrics   *Metrics

	mu    sync.Mutex
	plans map[string]registeredPlan // plan key -> the plan this process registered
}

// OpenRuns creates the run index bucket, or updates it to opts, and
// returns a Runs that starts workflows with conductor and appends RunStarted
// through emitter. It does not take ownership of js.
func OpenRuns(ctx context.Context, js jetstream.JetStream, conductor *Client, emitter Emitter, opts RunsOptions) (*Runs, error) {
	if conductor == nil || emitter == nil {
		return nil, invalidInput("open runs", "conductor client and emitter are required")
	}
	if opts.Bucket == "" {
		opts.Bucket = DefaultRunsBucket
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.StartWait <= 0 {
		opts.StartWait = DefaultStartWait
	}
	if opts.ListTimeout <= 0 {
		opts.ListTimeout = 30 * time.Second
	}
	if opts.PlanRecheck <= 0 {
		opts.PlanRecheck = DefaultPlanRecheck
	}
	if opts.LeaseTTL < 2*conductor.timeout {
		return nil, invalidInput("open runs", "lease ttl %s must be at least twice the conductor timeout %s", opts.LeaseTTL, conductor.timeout)
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	kv, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:      opts.Bucket,
		Description: "Conductor sidecar run index: plan versions, run requests, runs and their workflows (docs/conductor.md)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    opts.Replicas,
	})
	if err != nil {
		return nil, registryUnavailable("open runs bucket "+opts.Bucket, err)
	}
	return &Runs{
		kv:        kv,
		js:        js,
		conductor: conductor,
		emitter:   emitter,
		opts:      opts,
		log:       opts.Logger.Named("runs"),
		metrics:   opts.Metrics,
		plans:     make(map[string]registeredPlan),
	}, nil
}

// Client returns the Conductor client the Runs uses.
func (r *Runs) Client() *Client { return r.conductor }

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Streams are the JetStream streams the run index keeps its state in:
// its bucket's.
func (r *Runs) Streams() []string { return []string{"KV_" + r.kv.Bucket()} }
