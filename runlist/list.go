package runlist

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// DefaultBucket is the KV bucket of the run list.
const DefaultBucket = "SIDECAR_RUNLIST"

// ownerKey is the key whose owner among the members follows the log.
const ownerKey = "runlist"

// Keys of the bucket.
const (
	keyRun    = "run."
	keyCursor = "cursor"
)

// Log is the event log the list follows; *natsstore.Store satisfies it.
type Log interface {
	// Follow reads every run's events in the order they were persisted.
	statestore.Follower
	// Fetch reads one run's events (a run the follower meets mid-log).
	Fetch(ctx context.Context, runID string, afterSeq int64, limit int) ([]statestore.RunEventRecord, error)
}

// Owner tells whether this replica does the work of a key;
// *membership.Members satisfies it.
type Owner interface {
	Owns(key string) bool
}

// Options configures Open. The zero value works, with Log set.
type Options struct {
	// Log is the event log to follow (required).
	Log Log
	// Bucket is the KV bucket (default DefaultBucket); Replicas its
	// replica count (default 1).
	Bucket   string
	Replicas int
	// Owner picks the one replica that follows the log (nil: this one).
	// Two followers at once are safe (rows and cursor are written with
	// compare-and-set), only wasteful.
	Owner Owner
	// Poll is how often an idle follower looks for new events (default
	// 500ms): the list is that much behind the log at most, plus a write.
	Poll time.Duration
	// Coalesce is how long the follower waits after reading new events
	// before it reads again (default Poll), so that a run's events in that
	// time cost one write of its row, not one each; the list stays at most
	// Poll behind the log, plus a write, as when idle. WaitIndexed does
	// not wait for it.
	Coalesce time.Duration
	// Batch is how many events the follower reads at once (default 1,024).
	Batch int
	// MaxTracked bounds the snapshots of unfinished runs the follower
	// keeps in memory (default 100,000); a run dropped beyond it is read
	// back from the log at its next event.
	MaxTracked int
	// MarkerTTL is how long the bucket keeps the marker of a row that
	// ForgetRun removed (default DefaultMarkerTTL): long enough for every
	// replica's watch to receive it. It is set when the bucket is created;
	// a bucket created without it keeps delete markers.
	MarkerTTL time.Duration
	// MaxFinished bounds the finished runs' rows each replica keeps in
	// memory (default DefaultMaxFinished): the newest ones. Open runs'
	// rows are always kept; a listing that goes past the newest
	// MaxFinished finished runs reads the older ones from the bucket.
	MaxFinished int
	// Timeout bounds every NATS request without a deadline (default 10s).
	Timeout time.Duration
	// Plans tells the step count of each plan version, for the rows'
	// PlanSteps (nil: left 0, unknown).
	Plans StepCounter
	// Logger (default zap.NewNop()); Metrics (nil: none).
	Logger  *zap.Logger
	Metrics *Metrics
	// Registerer, when set, receives the drain estimate gauges
	// (sidecar_drain_eta_seconds), computed from the list at each scrape.
	Registerer prometheus.Registerer
}

// List is the run list: the follower that keeps the bucket up to date
// with the log, and the in-memory mirror that answers queries.
type List struct {
	opts   Options
	log    *zap.Logger
	kv     jetstream.KeyValue
	mirror *mirror
	follow *follower
	plans  *planSteps // nil without Options.Plans
	// markerTTL is the TTL of a forgotten row's marker (0: the bucket
	// takes none; a delete marker stays).
	markerTTL time.Duration
}

// Open opens (or creates) the bucket, starts mirroring it and starts the
// follower. Close stops both.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*List, error) {
	if opts.Log == nil {
		return nil, fmt.Errorf("%w: a log is required", ErrInvalidOptions)
	}
	if opts.Bucket == "" {
		opts.Bucket = DefaultBucket
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.Poll <= 0 {
		opts.Poll = 500 * time.Millisecond
	}
	if opts.Coalesce <= 0 {
		opts.Coalesce = opts.Poll
	}
	if opts.Batch <= 0 {
		opts.Batch = 1024
	}
	if opts.MaxTracked <= 0 {
		opts.MaxTracked = 100_000
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.MaxFinished <= 0 {
		opts.MaxFinished = DefaultMaxFinished
	}
	if opts.MarkerTTL <= 0 {
		opts.MarkerTTL = DefaultMarkerTTL
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	kv, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:      opts.Bucket,
		Description: "Conductor sidecar run list: a row per run of the event log and the log position it includes (docs/operations.md)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    opts.Replicas,
		// Forgotten rows leave a purge marker that expires (ForgetRun).
		LimitMarkerTTL: opts.MarkerTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: open bucket %s: %w", ErrUnavailable, opts.Bucket, err)
	}
	l := &List{opts: opts, log: opts.Logger.Named("runlist"), kv: kv}
	sctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	l.markerTTL = markerTTLOf(sctx, kv, opts.MarkerTTL, l.log)
	cancel()
	if opts.Plans != nil {
		l.plans = newPlanSteps(opts.Plans)
	}
	l.mirror = startMirror(kv, opts.MaxFinished, l.log, opts.Metrics)
	l.follow = startFollower(kv, opts, l.log, l.mirror)
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(newPausedByReason(l))
		for _, q := range []float64{0.5, 0.9} {
			opts.Registerer.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "sidecar_drain_eta_seconds",
				Help: "Estimated seconds until the slowest open drain ends, at a quantile of the step durations of earlier runs (every replica reports the same; take max).",
				// "estimate", not "quantile": that label is a summary's.
				ConstLabels: prometheus.Labels{"estimate": fmt.Sprintf("p%.0f", q*100)},
			}, func() float64 { return l.slowestDrain(q) }))
		}
	}
	return l, nil
}

// Close stops the follower and the mirror, waiting for them until ctx
// ends.
func (l *List) Close(ctx context.Context) error {
	return waitClosed(ctx, "run list", func() {
		l.follow.close()
		l.mirror.close()
	})
}

// WaitIndexed waits until the list includes every event up to the log's
// last one at the time of the call (what a bulk action needs before it
// selects runs), or ctx ends. It returns the sequence waited for.
func (l *List) WaitIndexed(ctx context.Context) (uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, l.opts.Timeout)
	seq, err := l.opts.Log.LastSeq(rctx)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	l.follow.nudge()
	return seq, l.mirror.waitCursor(ctx, seq)
}

// Streams are the JetStream streams the list keeps its state in: its
// bucket's.
func (l *List) Streams() []string { return []string{"KV_" + l.kv.Bucket()} }

// waitClosed runs stop and waits for it until ctx ends.
func waitClosed(ctx context.Context, what string, stop func()) error {
	done := make(chan struct{})
	go func() {
		stop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: close: %w", what, ctx.Err())
	}
}
