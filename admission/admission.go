// Package admission limits the runs active at once (Execution Semantics
// Contract v1.1 §3): globally, per tenant and per plan, with the contract's
// three answers to a start that would exceed a limit: REJECT (429, nothing
// started or recorded), QUEUE (RunQueued recorded; the run starts when
// capacity frees up, tenants taking turns, each tenant's runs in submission
// order) and DELAY (RunQueued recorded with a start time; the run starts
// then, whatever the load).
//
// With limits configured every start goes through one decider: the request
// is written to the KV bucket SIDECAR_ADMISSION (one entry per run, its
// ticket the bucket revision that created it), and the replica that owns
// the key "admission" among the members decides the entries in their fair
// order (fairOrder) against the active runs (the run list's RUNNING and PAUSED rows,
// plus the runs it started that the list does not show yet). The start
// itself is the adapter's, idempotent on the run's request key: an entry
// whose start was interrupted (a crash, a lost owner) is started again by
// the next decider and gets the same run, never a second one (the
// reconciler of Execution Semantics Contract v1.1 §3).
package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// Bucket is the KV bucket of the admission entries.
const Bucket = "SIDECAR_ADMISSION"

// Policies: what a start over a limit gets.
const (
	Reject = "reject"
	Queue  = "queue"
	Delay  = "delay"
)

// States of an entry.
const (
	statePending   = "pending"   // submitted, not decided yet
	stateQueued    = "queued"    // waits for capacity (RunQueued recorded)
	stateDelayed   = "delayed"   // waits for NotBefore (RunQueued recorded)
	stateStarting  = "starting"  // being started; started again if interrupted
	stateStarted   = "started"   // started (final)
	stateRejected  = "rejected"  // refused (final)
	stateCancelled = "cancelled" // cancelled while queued (final)
	stateFailed    = "failed"    // cannot start: its plan or request (final)
)

// Limits bounds the active (RUNNING or PAUSED) runs; 0 is no limit.
type Limits struct {
	Global, PerTenant, PerPlan int
}

func (l Limits) any() bool { return l.Global > 0 || l.PerTenant > 0 || l.PerPlan > 0 }

// Runs starts runs; *adapter.Runs satisfies it.
type Runs interface {
	RunIDFor(ctx context.Context, req adapter.StartRequest) (string, error)
	Existing(ctx context.Context, req adapter.StartRequest) (adapter.StartResult, bool, error)
	// ClaimPlan claims the plan version for the plan's content, or fails
	// with adapter.ErrPlanConflict.
	ClaimPlan(ctx context.Context, tenantID string, compiled *plan.Compiled) error
	StartRun(ctx context.Context, req adapter.StartRequest) (adapter.StartResult, error)
}

// Emitter appends events (registry.Emitter).
type Emitter interface {
	Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error)
}

// SnapshotReader reads a run's derived state.
type SnapshotReader interface {
	ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error)
}

// ActiveRuns counts the active runs; *runlist.List satisfies it.
type ActiveRuns interface {
	// WaitIndexed waits until the list includes every event persisted
	// before the call (so that runs started before are counted).
	WaitIndexed(ctx context.Context) (uint64, error)
	// ShowsStarted tells whether the list shows runID started (RUNNING,
	// PAUSED or ended).
	ShowsStarted(runID string) bool
	// ActiveCounts counts the RUNNING and PAUSED runs, in all, by tenant
	// and by plan of a tenant ({tenantId, planId}); ok is false until the
	// list is read.
	ActiveCounts() (total int, byTenant map[string]int, byPlan map[[2]string]int, ok bool)
}

// Waker wakes the task workers' idle poll loops (taskworkers.Wakeup). Wake
// must not block.
type Waker interface {
	Wake()
}

// Owner tells whether this replica does the work of a key.
type Owner interface {
	Owns(key string) bool
}

// Options configures a Controller.
type Options struct {
	Limits Limits
	// Policy is Reject, Queue (default) or Delay.
	Policy string
	// Delay is, under Delay, how far a run over a limit is put off per
	// run it is over by (default 30s): the k-th run over starts k*Delay
	// after it was submitted.
	Delay time.Duration
	// MaxQueued bounds the runs waiting under Queue and Delay (0: no
	// bound): a start over a limit while that many wait is rejected, as
	// under Reject, so that a flood of starts cannot grow the queue, and
	// the memory it takes, without end.
	MaxQueued int
	// MaxQueuedPerTenant bounds the runs of one tenant waiting under
	// Queue and Delay (0: no bound): a start of a tenant with that many
	// runs waiting is rejected, as under Reject, so that one tenant cannot
	// fill the queue the others wait in.
	MaxQueuedPerTenant int
	Runs               Runs
	Log                Emitter
	Snapshots          SnapshotReader
	Active             ActiveRuns
	Owner              Owner
	Replicas           int
	// Wait bounds how long Submit waits for the decider (default 10s).
	Wait time.Duration
	// Waker, when set, is woken after every run the decider started:
	// the task workers' idle poll loops, since Conductor has queued the
	// run's first steps.
	Waker   Waker
	Logger  *zap.Logger
	Metrics *Metrics
}

// entry is a run's admission request in the bucket.
type entry struct {
	RunID         string            `json:"runId"`
	Ticket        uint64            `json:"ticket,omitempty"`
	State         string            `json:"state"`
	Policy        string            `json:"policy"`
	TenantID      string            `json:"tenantId"`
	ProjectID     string            `json:"projectId"`
	EnvironmentID string            `json:"environmentId"`
	RunRequestID  string            `json:"runRequestId"`
	PlanID        string            `json:"planId"`
	PlanVersion   string            `json:"planVersion"`
	Plan          json.RawMessage   `json:"plan"`
	Labels        map[string]string `json:"labels,omitempty"`
	RequestedBy   string            `json:"requestedBy,omitempty"`
	SubmittedAt   time.Time         `json:"submittedAt"`
	QueuedAt      time.Time         `json:"queuedAt,omitzero"`
	NotBefore     time.Time         `json:"notBefore,omitzero"`
	Reason        string            `json:"reason,omitempty"`
	WorkflowID    string            `json:"workflowId,omitempty"`
	Created       bool              `json:"created,omitempty"`
	DecidedAt     time.Time         `json:"decidedAt,omitzero"`
	// FailedCode and FailedKind are why an entry failed: the code and
	// kind of its start's error, which a repeat of the request gets.
	FailedCode string       `json:"failedCode,omitempty"`
	FailedKind errcode.Kind `json:"failedKind,omitempty"`
	// Turn is the entry's place in the fair order (fairOrder), set at
	// submission.
	Turn uint64 `json:"turn,omitempty"`

	// checked is when the decider last read the log of the run it
	// started and the list did not show (recent).
	checked time.Time

	rev uint64 // the bucket revision read
}

func (e *entry) ticket() uint64 {
	if e.Ticket != 0 {
		return e.Ticket
	}
	return e.rev
}

func (e *entry) waiting() bool {
	return e.State == statePending || e.State == stateQueued || e.State == stateDelayed || e.State == stateStarting
}

// Controller admits starts.
type Controller struct {
	opts Options
	log  *zap.Logger
	kv   jetstream.KeyValue

	mu      sync.Mutex
	entries map[string]*entry // key -> entry (the bucket's mirror)
	// given is the latest turn this process gave each tenant, and when
	// (turnFor): its starts submitted at once are not all in entries yet.
	given   map[string]givenTurn
	synced  bool
	changed chan struct{}
	// recent are the runs this decider started that the list does not
	// show started yet (runId -> entry): counted as active until it does.
	// caughtUp: the list included every event persisted when this
	// replica's turn as decider began.
	recent   map[string]*entry
	caughtUp bool

	stop context.CancelFunc
	done chan struct{}
}

// Open binds or creates the bucket, mirrors it and, on the replica that
// owns "admission", decides its entries. With no limit set it starts
// every run still waiting in the bucket (Waiting): what a deployment that
// turned its limits off had queued.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Controller, error) {
	if opts.Policy == "" {
		opts.Policy = Queue
	}
	if opts.Policy != Reject && opts.Policy != Queue && opts.Policy != Delay {
		return nil, &Error{Code: CodeInvalid, Message: fmt.Sprintf("policy %q: reject, queue or delay", opts.Policy)}
	}
	if opts.Runs == nil || opts.Log == nil || opts.Snapshots == nil || opts.Active == nil {
		return nil, &Error{Code: CodeInvalid, Message: "Runs, Log, Snapshots and Active are required"}
	}
	if opts.Delay <= 0 {
		opts.Delay = 30 * time.Second
	}
	if opts.Wait <= 0 {
		opts.Wait = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	kv, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{Bucket: Bucket, History: 1, Replicas: max(opts.Replicas, 1),
		Description: "admission control: one entry per run submitted under limits, decided in ticket order"})
	if err != nil {
		return nil, unavailable("bucket "+Bucket, err)
	}
	c := &Controller{opts: opts, log: opts.Logger.Named("admission"), kv: kv, entries: map[string]*entry{}, given: map[string]givenTurn{},
		changed: make(chan struct{}), recent: map[string]*entry{}, done: make(chan struct{})}
	lctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	go c.loop(lctx)
	return c, nil
}

// Waiting counts the runs waiting in the bucket to be started (submitted,
// queued, delayed, or being started), none when there is no bucket: runs a
// node without limits must still start (Open with no limit).
func Waiting(ctx context.Context, js jetstream.JetStream) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, unavailable("bucket "+Bucket, err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return 0, unavailable("bucket "+Bucket, err)
	}
	defer w.Stop() //nolint:errcheck // nothing to do about it
	n := 0
	for {
		select {
		case <-ctx.Done():
			return 0, unavailable("bucket "+Bucket, ctx.Err())
		case u, ok := <-w.Updates():
			if !ok {
				return 0, unavailable("bucket "+Bucket, errors.New("the watch ended"))
			}
			if u == nil {
				return n, nil
			}
			var e entry
			if json.Unmarshal(u.Value(), &e) == nil && e.waiting() {
				n++
			}
		}
	}
}

// Close stops the mirror and the decider, waiting for them until ctx ends.
func (c *Controller) Close(ctx context.Context) error {
	c.stop()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("admission: close: %w", ctx.Err())
	}
}

// Decision is Submit's answer.
type Decision struct {
	// Started is set when the run started (or had started before).
	Started *adapter.StartResult
	RunID   string
	// State is "QUEUED" (waiting for capacity or, under delay, for
	// NotBefore) or "PENDING" (not decided within the wait).
	State     string
	Position  int
	NotBefore time.Time
}

// Submit asks for req's start under the limits and waits (up to
// Options.Wait) for the decider. src is the plan as submitted (kept to
// start the run later); requestedBy is recorded with RunQueued.
func (c *Controller) Submit(ctx context.Context, req adapter.StartRequest, src *plan.Plan, requestedBy string) (*Decision, error) {
	if res, ok, err := c.opts.Runs.Existing(ctx, req); err != nil {
		return nil, err
	} else if ok {
		return &Decision{Started: &res, RunID: res.Run.RunID}, nil
	}
	// A plan version the tenant has with other content is refused now, as
	// a start that does not wait is: its run could never start.
	if err := c.opts.Runs.ClaimPlan(ctx, req.TenantID, req.Plan); err != nil {
		return nil, err
	}
	runID, err := c.opts.Runs.RunIDFor(ctx, req)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(src)
	if err != nil {
		return nil, fmt.Errorf("admission: encode plan: %w", err)
	}
	e := &entry{RunID: runID, State: statePending, Policy: c.opts.Policy, TenantID: req.TenantID, ProjectID: req.ProjectID,
		EnvironmentID: req.EnvironmentID, RunRequestID: req.RunRequestID, PlanID: req.Plan.Plan.PlanID, PlanVersion: req.Plan.Plan.PlanVersion,
		Plan: body, Labels: req.Labels, RequestedBy: requestedBy, SubmittedAt: time.Now().UTC(), Turn: c.turnFor(req.TenantID)}
	key := keyOf(runID)
	b, _ := json.Marshal(e)
	// The entry's ticket is the revision that creates it; the decider
	// writes it into the entry at its first update.
	_, err = c.kv.Create(ctx, key, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		// A repeat of a submitted request, which its entry answers; but a
		// refusal is not kept: a repeat of a rejected request (as its
		// Retry-After invites) is decided again, on the limits and load
		// of now, as a new entry at the end of the order.
		if old, gerr := c.get(ctx, key); gerr == nil && old.State == stateRejected {
			if _, err := c.kv.Update(ctx, key, b, old.rev); err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
				return nil, unavailable("submit again", err)
			}
		}
	} else if err != nil {
		return nil, unavailable("submit", err)
	}
	c.opts.Metrics.submitted()
	return c.await(ctx, req, key)
}

// await waits for the entry at key to be decided.
func (c *Controller) await(ctx context.Context, req adapter.StartRequest, key string) (*Decision, error) {
	deadline := time.Now().Add(c.opts.Wait)
	for {
		e, err := c.get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			// Decided and cleaned up long ago: the run started.
			if res, ok, err := c.opts.Runs.Existing(ctx, req); err != nil || ok {
				return &Decision{Started: &res, RunID: res.Run.RunID}, err
			}
			return nil, unavailable("the admission entry vanished", err)
		}
		if err != nil {
			return nil, err
		}
		switch e.State {
		case stateStarted:
			res, ok, err := c.opts.Runs.Existing(ctx, req)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, unavailable("started run not found", nil)
			}
			res.Created = e.Created
			return &Decision{Started: &res, RunID: e.RunID}, nil
		case stateRejected:
			return nil, &Error{Code: CodeRejected, Message: e.Reason, RetryAfter: 10 * time.Second}
		case stateFailed:
			return nil, errcode.New(e.FailedKind, e.FailedCode, e.Reason)
		case stateCancelled:
			return &Decision{RunID: e.RunID, State: statestore.RunStatusCancelled}, nil
		case stateQueued, stateDelayed:
			return &Decision{RunID: e.RunID, State: statestore.RunStatusQueued, Position: c.Position(e.RunID), NotBefore: e.NotBefore}, nil
		}
		if !time.Now().Before(deadline) {
			return &Decision{RunID: e.RunID, State: statestore.RunStatusPending}, nil
		}
		c.mu.Lock()
		ch := c.changed
		c.mu.Unlock()
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

// Position is runID's place among the waiting entries (1: next), or 0
// when it does not wait.
func (c *Controller) Position(runID string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	me := c.entries[keyOf(runID)]
	if me == nil || !me.waiting() {
		return 0
	}
	for i, e := range fairOrder(c.waitingLocked()) {
		if e.RunID == me.RunID {
			return i + 1
		}
	}
	return 0
}

func keyOf(runID string) string { return "r." + natsstore.RunToken(runID) }

func (c *Controller) get(ctx context.Context, key string) (*entry, error) {
	kve, err := c.kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, err
		}
		return nil, unavailable("read entry", err)
	}
	var e entry
	if err := json.Unmarshal(kve.Value(), &e); err != nil {
		return nil, unavailable("entry "+key+" is damaged", err)
	}
	e.rev = kve.Revision()
	return &e, nil
}

// put writes e back with compare-and-set on the revision it was read at.
func (c *Controller) put(ctx context.Context, key string, e *entry) error {
	e.Ticket = e.ticket() // an entry whose ticket update was lost keeps its first revision's
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	rev, err := c.kv.Update(ctx, key, b, e.rev)
	if err != nil {
		return unavailable("update entry", err)
	}
	e.rev = rev
	// The mirror learns it now, not at the watch's echo: a decision made
	// before the echo must not act on the entry's older state.
	cp := *e
	c.mu.Lock()
	c.entries[key] = &cp
	c.mu.Unlock()
	return nil
}

// sortedWaiting returns copies of the waiting entries in the order they
// are decided (fairOrder).
func (c *Controller) sortedWaiting() []*entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.waitingLocked()
	for i, e := range out {
		cp := *e
		out[i] = &cp
	}
	return fairOrder(out)
}

// waitingLocked returns the waiting entries; c.mu is held.
func (c *Controller) waitingLocked() []*entry {
	var out []*entry
	for _, e := range c.entries {
		if e.waiting() {
			out = append(out, e)
		}
	}
	return out
}

// fairOrder sorts waiting entries by turn, then by ticket (submission
// order). The order depends only on the bucket's entries, so every replica
// computes the same positions.
func fairOrder(es []*entry) []*entry {
	sort.Slice(es, func(i, j int) bool {
		if es[i].Turn != es[j].Turn {
			return es[i].Turn < es[j].Turn
		}
		return es[i].ticket() < es[j].ticket()
	})
	return es
}

// turnFor is the turn of a run of tenant submitted now: one after the
// tenant's latest entry, but not before the head of the queue. Tenants
// take turns: one that queued thousands of runs holds turns far ahead, and
// another tenant's run gets the turn at the head, behind one of the first
// tenant's runs rather than all of them (start-time fair queuing across
// tenants; each tenant's runs keep their submission order). Replicas that
// submit at the same moment may give two runs the same turn: the ticket
// orders them. Within this process, starts of one tenant submitted at once
// each get a turn of their own (given), before their entries come back
// from the bucket.
func (c *Controller) turnFor(tenant string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var head, last uint64
	headSet := false
	for _, e := range c.entries {
		if e.waiting() && (!headSet || e.Turn < head) {
			head, headSet = e.Turn, true
		}
		if e.TenantID == tenant {
			last = max(last, e.Turn)
		}
	}
	now := time.Now()
	for k, g := range c.given {
		if now.Sub(g.at) > givenFor {
			delete(c.given, k) // its entries are in the bucket by now
		}
	}
	t := max(head, max(last, c.given[tenant].turn)+1)
	c.given[tenant] = givenTurn{turn: t, at: now}
	return t
}

// givenTurn is a turn turnFor gave, and when.
type givenTurn struct {
	turn uint64
	at   time.Time
}

// givenFor is how long a turn given counts beside the bucket's entries:
// longer than an entry takes to come back from the bucket.
const givenFor = 10 * time.Second

// Streams are the JetStream streams admission keeps its state in: its
// bucket's.
func (c *Controller) Streams() []string { return []string{"KV_" + c.kv.Bucket()} }

// isWrongSequence reports whether err is a KV update refused because the
// key moved on since the revision given (another repeat updated it first).
func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}
