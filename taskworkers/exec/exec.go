// Package exec holds the step executors: command (a process, no shell),
// http (one request), noop and sleep. Each implements
// taskworkers.Executor; New builds them into a Registry.
//
// Every executor validates its spec at run time (the plan was validated at
// submit time, but a bad spec must never panic a worker): a bad spec fails
// the step with EXECUTOR_SPEC_INVALID, not retryable. Captured output is
// bounded, redacted (every secret of the Execution, see package secrets)
// and stored as artifacts; Result.Output holds only small numbers and
// names. docs/executors.md describes fields, codes and kill semantics.
package exec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/artifacts"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
)

// Artifact kinds (and names) the executors store.
const (
	KindStdout       = "stdout"
	KindStderr       = "stderr"
	KindHTTPResponse = "http-response"
)

// Defaults of Options.
const (
	DefaultKillGrace       = 10 * time.Second
	DefaultMaxCaptureBytes = 1 << 20
	DefaultHTTPTimeout     = 30 * time.Second
	DefaultStoreTimeout    = 90 * time.Second
)

// ArtifactStore keeps a step's outputs. *artifacts.Store implements it.
// Put must be safe for concurrent use and return an error only when
// nothing usable was stored.
type ArtifactStore interface {
	Put(ctx context.Context, key artifacts.Key, kind string, r io.Reader) (statestore.ArtifactRef, error)
}

var _ ArtifactStore = (*artifacts.Store)(nil)

// Options configure New. Zero values take the defaults.
type Options struct {
	// Artifacts stores stdout, stderr and response bodies. Nil stores
	// nothing: results then carry no artifact references.
	Artifacts ArtifactStore
	// Logger (default nop). Executors log ids, codes and durations, never
	// secret values, environment values, request bodies or header values.
	Logger *zap.Logger
	// KillGrace is how long a command may run after SIGTERM before its
	// process group gets SIGKILL (default 10s).
	KillGrace time.Duration
	// MaxCaptureBytes bounds what is kept of each output stream (stdout,
	// stderr, a response body); the first and last halves are kept
	// (default 1 MiB).
	MaxCaptureBytes int
	// HTTPTimeout bounds a request when the step has no deadline (default
	// 30s). With a step timeout, the step's deadline applies instead.
	HTTPTimeout time.Duration
	// StoreTimeout bounds storing a step's artifacts, each try 5 s, tried
	// again with a backoff until then. Storing uses its own context so
	// that the output of a timed-out or cancelled step is still kept
	// (default 90s: within the 120 s a step's task gives the worker after
	// the step's timeout, plan.ResponseTimeoutGraceSeconds).
	StoreTimeout time.Duration
	// BaseEnv returns the environment a command starts from, before the
	// spec's Env and the secrets are added (default
	// AllowEnv(DefaultEnvAllow): only PATH, HOME, LANG, LC_*, TZ, TMPDIR
	// and USER of the worker's environment). It must not return the
	// worker's whole environment: that holds the values behind every
	// plan's env: secrets and the sidecar's own credentials.
	BaseEnv func() []string
	// HTTPAllow lists the destinations the http executor may reach
	// although they are loopback, link-local, private, unspecified,
	// multicast or reserved: a CIDR (127.0.0.1/32) allows the addresses
	// it contains, a host (name or IP, with an optional port) allows
	// whatever that host name resolves to. Public addresses need no
	// entry.
	HTTPAllow []Destination
	// CommandDir, when set, is where each running command's process group
	// is recorded (a file per command, removed once the group is dead), so
	// that Registry.Open can end the commands of a process that died
	// (leftover.go). Empty: no records; a supervisor (systemd's
	// KillMode=control-group or mixed, a container) must kill what a dead
	// sidecar leaves running.
	CommandDir string
	// HTTPDeny lists the destinations the http executor never reaches,
	// whatever HTTPAllow says: the sidecar's own API and Conductor. A
	// host:port whose address is local to this machine (loopback,
	// unspecified or an interface's address) denies that port on every
	// local address, as a server bound to 0.0.0.0 answers on all of them.
	HTTPDeny []Destination
}

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.KillGrace <= 0 {
		o.KillGrace = DefaultKillGrace
	}
	if o.MaxCaptureBytes <= 0 {
		o.MaxCaptureBytes = DefaultMaxCaptureBytes
	}
	if o.HTTPTimeout <= 0 {
		o.HTTPTimeout = DefaultHTTPTimeout
	}
	if o.StoreTimeout <= 0 {
		o.StoreTimeout = DefaultStoreTimeout
	}
	if o.BaseEnv == nil {
		o.BaseEnv = AllowEnv(DefaultEnvAllow)
	}
}

// Registry holds the executors by type. It is itself an Executor that
// dispatches on Execution.Spec.Type. It is safe for concurrent use.
type Registry struct {
	execs map[string]taskworkers.Executor
	log   *zap.Logger
	cmds  *commandDir // nil without Options.CommandDir
}

// New returns the command, http, noop and sleep executors configured by
// opts.
func New(opts Options) *Registry {
	opts.setDefaults()
	base := base{opts: opts, log: opts.Logger.Named("exec")}
	r := &Registry{log: base.log, execs: map[string]taskworkers.Executor{}}
	if opts.CommandDir != "" {
		r.cmds = &commandDir{dir: opts.CommandDir, grace: opts.KillGrace, killWait: leftoverKillWait, log: base.log}
	}
	r.execs[plan.ExecutorCommand] = guarded{&commandExecutor{base: base, cmds: r.cmds}, base.log}
	r.execs[plan.ExecutorHTTP] = guarded{&httpExecutor{base: base, client: newGuardedClient(opts.HTTPAllow, opts.HTTPDeny)}, base.log}
	r.execs[plan.ExecutorNoop] = guarded{noopExecutor{}, base.log}
	r.execs[plan.ExecutorSleep] = guarded{sleepExecutor{}, base.log}
	return r
}

// Open prepares Options.CommandDir: it locks it (one process per
// directory) and ends the commands a process that died left running
// there: each recorded process group that is still the recorded one gets
// SIGTERM, and SIGKILL after KillGrace. Call it before the worker records
// the tries of a dead process ended (taskworkers.Worker.Open), and before
// the first command runs. It fails with ErrCommandDirUnusable,
// ErrCommandDirLocked or ErrLeftoverCommand. Without a CommandDir it does
// nothing.
func (r *Registry) Open(ctx context.Context) error {
	if r.cmds == nil {
		return nil
	}
	return r.cmds.open(ctx)
}

// Close releases Options.CommandDir. Call it once no command runs any
// more (after taskworkers.Worker.Close).
func (r *Registry) Close(context.Context) error {
	if r.cmds == nil {
		return nil
	}
	return r.cmds.close()
}

// Executors returns a new map of all executors by type, the shape
// taskworkers.New takes.
func (r *Registry) Executors() map[string]taskworkers.Executor {
	m := make(map[string]taskworkers.Executor, len(r.execs))
	for k, v := range r.execs {
		m[k] = v
	}
	return m
}

// base is what every executor shares.
type base struct {
	opts Options
	log  *zap.Logger
}

func (b base) logger(x taskworkers.Execution) *zap.Logger {
	return b.log.With(zap.String("runId", x.RunID), zap.String("stepId", x.StepID),
		zap.Int64("logicalAttemptId", x.LogicalAttemptID), zap.Int64("engineAttemptId", x.EngineAttemptID),
		zap.String("executor", x.Spec.Type))
}

// storeTryTimeout bounds one try of storing an artifact: a store that
// does not answer a try (a NATS leader election, a request lost with a
// node) is tried again, within StoreTimeout.
const storeTryTimeout = 5 * time.Second

// store keeps data as the artifact name/kind of x's try. It uses its own
// context: the step's may be done already. A try that fails is repeated,
// with a backoff, until StoreTimeout: the step has run, and a store that
// answers again within it costs a delay, not a second run of the step.
func (b base) store(ctx context.Context, x taskworkers.Execution, kind string, data []byte) (statestore.ArtifactRef, bool, error) {
	if b.opts.Artifacts == nil {
		return statestore.ArtifactRef{}, false, nil
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.StoreTimeout)
	defer cancel()
	key := artifacts.Key{RunID: x.RunID, StepID: x.StepID, LogicalAttemptID: x.LogicalAttemptID,
		EngineAttemptID: x.EngineAttemptID, Name: kind}
	tries := 0
	ref, err := backoff.Retry(sctx, func() (statestore.ArtifactRef, error) {
		tries++
		tctx, cancel := context.WithTimeout(sctx, storeTryTimeout)
		defer cancel()
		return b.opts.Artifacts.Put(tctx, key, kind, bytes.NewReader(data))
	}, backoff.WithBackOff(&backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 5 * time.Second}),
		backoff.WithMaxElapsedTime(b.opts.StoreTimeout))
	if err != nil {
		return statestore.ArtifactRef{}, false, fmt.Errorf("store %s artifact (%d tries in %s): %w", kind, tries, b.opts.StoreTimeout, err)
	}
	if tries > 1 {
		b.logger(x).Info("stored the step's output after the artifact store answered again", zap.String("kind", kind), zap.Int("tries", tries))
	}
	return ref, true, nil
}

// guarded turns a panic of the executor into a failed step.
type guarded struct {
	e   taskworkers.Executor
	log *zap.Logger
}

func (g guarded) Execute(ctx context.Context, x taskworkers.Execution) (res taskworkers.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			g.log.Error("executor panicked", zap.String("runId", x.RunID), zap.String("stepId", x.StepID),
				zap.String("executor", x.Spec.Type), zap.ByteString("stack", debug.Stack()))
			res, err = fail(CodeInternal, "executor panicked (a bug; see the worker log)", false), nil
		}
	}()
	return g.e.Execute(ctx, x)
}

func fail(code, msg string, retryable bool) taskworkers.Result {
	return taskworkers.Result{Err: &statestore.StepError{Code: code, Message: msg, Retryable: retryable}}
}

func specInvalid(format string, args ...any) taskworkers.Result {
	return fail(CodeSpecInvalid, fmt.Sprintf(format, args...), false)
}

// ctxError is the step error for a done ctx: STEP_TIMEOUT when its
// deadline passed, STEP_INTERRUPTED when it was cancelled. what says what
// happened to the work.
func ctxError(ctx context.Context, red *secrets.Redactor, what string) *statestore.StepError {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &statestore.StepError{Code: CodeStepTimeout, Message: "step timed out: " + what, Retryable: true}
	}
	msg := "step interrupted: " + what
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		msg += " (" + red.String(cause.Error()) + ")"
	}
	return &statestore.StepError{Code: CodeStepInterrupted, Message: msg, Retryable: false}
}

// checkOnly fails unless the spec's type is typ and it sets no field that
// the listed field set does not allow.
func checkOnly(s plan.ExecutorSpec, typ string, allowed ...string) (taskworkers.Result, bool) {
	if s.Type != typ {
		return specInvalid("executor %s got a spec of type %q", typ, s.Type), false
	}
	fields := [...]struct {
		name string
		set  bool
	}{
		{"argv", len(s.Argv) > 0}, {"body", s.Body != ""}, {"env", len(s.Env) > 0},
		{"headers", len(s.Headers) > 0}, {"method", s.Method != ""},
		{"retryableStatus", len(s.RetryableStatus) > 0}, {"seconds", s.Seconds != 0},
		{"url", s.URL != ""}, {"workingDir", s.WorkingDir != ""},
	}
	var bad []string
	for _, f := range fields {
		if f.set && !slices.Contains(allowed, f.name) {
			bad = append(bad, f.name)
		}
	}
	if len(bad) > 0 {
		return specInvalid("%s executor does not take field(s) %s", typ, strings.Join(bad, ", ")), false
	}
	return taskworkers.Result{}, true
}

// capture keeps the first and last halves of at most max bytes written to
// it and counts them all. It is safe for concurrent use.
type capture struct {
	mu      sync.Mutex
	headCap int
	head    []byte
	tailCap int
	ring    []byte // tail ring of len tailCap, allocated once the head is full
	w       int    // next write position in ring
	full    bool   // ring has wrapped
	total   int64
}

func newCapture(max int) *capture {
	h := max / 2
	return &capture{headCap: h, tailCap: max - h}
}

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	c.total += int64(n)
	if k := min(c.headCap-len(c.head), len(p)); k > 0 {
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	if c.tailCap == 0 || len(p) == 0 {
		return n, nil
	}
	if c.ring == nil {
		c.ring = make([]byte, c.tailCap)
	}
	if len(p) >= len(c.ring) {
		copy(c.ring, p[len(p)-len(c.ring):])
		c.w, c.full = 0, true
		return n, nil
	}
	k := copy(c.ring[c.w:], p)
	if k < len(p) {
		copy(c.ring, p[k:])
		c.full = true
	}
	c.w = (c.w + len(p)) % len(c.ring)
	if c.w == 0 {
		c.full = true
	}
	return n, nil
}

// bytes returns the kept bytes, redacted, and whether some were dropped.
// When bytes were dropped a line "[... N bytes omitted ...]" joins head and
// tail, and both are redacted as fragments (see secrets.Redactor.Fragment).
func (c *capture) bytes(red *secrets.Redactor) ([]byte, int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var tail []byte
	if c.full {
		tail = append(append([]byte{}, c.ring[c.w:]...), c.ring[:c.w]...)
	} else {
		tail = c.ring[:c.w]
	}
	kept := int64(len(c.head) + len(tail))
	if c.total <= kept {
		whole := append(append([]byte{}, c.head...), tail...)
		return red.Bytes(whole), c.total, false
	}
	out := append([]byte{}, red.Fragment(c.head, false, true)...)
	out = append(out, fmt.Sprintf("\n[... %d bytes omitted ...]\n", c.total-kept)...)
	out = append(out, red.Fragment(tail, true, false)...)
	return out, c.total, true
}
