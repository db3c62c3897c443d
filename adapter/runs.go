package adapter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// DefaultRunsBucket is the JetStream KV bucket of the run registry.
const DefaultRunsBucket = "SIDECAR_RUNS"

// Defaults of RunsOptions.
const (
	// DefaultLeaseTTL is RunsOptions.LeaseTTL when unset.
	DefaultLeaseTTL = 30 * time.Second
	// DefaultStartWait is RunsOptions.StartWait when unset.
	DefaultStartWait = 15 * time.Second
)

// EngineType is the engineType of the RunStarted events the adapter appends.
const EngineType = "conductor"

// Run states in the run registry.
const (
	// RunStateStarting: a StartRun holds the start lease; the workflow may
	// or may not exist yet.
	RunStateStarting = "STARTING"
	// RunStateStarted: the workflow exists and is recorded (WorkflowID).
	RunStateStarted = "STARTED"
	// RunStateFinal: the watcher saw the workflow end and appended the
	// terminal run event.
	RunStateFinal = "FINAL"
)

// KV key prefixes of the run registry (docs/conductor.md, "KV layout").
const (
	keyPlan   = "plan."
	keyReq    = "req."
	keyRun    = "run."
	keyActive = "active."
)

// Emitter appends events through the EventIdRegistry protocol;
// *registry.Emitter satisfies it.
type Emitter interface {
	Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error)
	// EmitIf appends only if the run's last runSeq is lastSeq (else an
	// error matching statestore.ErrRunChanged, nothing written).
	EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error)
}

// Run is a run's entry in the run registry: its identity, its Conductor
// workflow and where the adapter is in its lifecycle. It is stored as JSON
// under run.<runId>.
type Run struct {
	RunID         string `json:"runId"`
	RequestKey    string `json:"requestKey"`
	TenantID      string `json:"tenantId"`
	ProjectID     string `json:"projectId"`
	EnvironmentID string `json:"environmentId"`
	PlanID        string `json:"planId"`
	PlanVersion   string `json:"planVersion"`
	RunRequestID  string `json:"runRequestId"`
	PlanHash      string `json:"planHash"`

	WorkflowName    string `json:"workflowName"`
	WorkflowVersion int32  `json:"workflowVersion"`
	// WorkflowID is the run's workflow; set from RunStateStarted on. Any
	// other workflow whose input carries this runId is an orphan.
	WorkflowID string `json:"workflowId,omitempty"`

	// TaskDomain is the Conductor task domain of the run's tasks ("" none).
	TaskDomain string `json:"taskDomain,omitempty"`

	State string `json:"state"`
	// AttemptID identifies the start attempt that holds (or held) the
	// lease; it is the workflow input startAttemptId.
	AttemptID      string    `json:"attemptId"`
	LeaseExpiresAt time.Time `json:"leaseExpiresAt,omitzero"`

	CreatedAt time.Time `json:"createdAt"`
	StartedAt time.Time `json:"startedAt,omitzero"`
	// RunStartedEmitted is set once RunStarted is in the event log.
	RunStartedEmitted bool `json:"runStartedEmitted,omitempty"`
	// EngineStatus is the terminal Conductor status the watcher saw
	// (COMPLETED, FAILED, TIMED_OUT, TERMINATED) or LOST.
	EngineStatus string    `json:"engineStatus,omitempty"`
	FinalAt      time.Time `json:"finalAt,omitzero"`
	// EnginePaused and EngineCycle are the pause state the sidecar last
	// put the run's workflow in, or saw it in: paused (or resumed) for pause
	// cycle EngineCycle. The watcher compares them with Conductor and the
	// log to tell a pause or resume made in Conductor from one of the
	// sidecar's that has not reached Conductor yet (docs/conductor.md,
	// "Actions taken in Conductor").
	EnginePaused bool  `json:"enginePaused,omitempty"`
	EngineCycle  int64 `json:"engineCycle,omitempty"`
}

// EngineRunRef returns conductor://<workflowName>/<workflowId>, or "" before
// the workflow exists.
func (r *Run) EngineRunRef() string {
	return statestore.ConductorRunRef(r.WorkflowName, r.WorkflowID)
}

// planRecord is the run registry's entry for a registered plan version.
type planRecord struct {
	PlanID          string    `json:"planId"`
	PlanVersion     string    `json:"planVersion"`
	Hash            string    `json:"hash"`
	WorkflowName    string    `json:"workflowName"`
	WorkflowVersion int32     `json:"workflowVersion"`
	RegisteredAt    time.Time `json:"registeredAt"`
}

// reqRecord maps a run request to its runId; it never changes once created.
type reqRecord struct {
	RunID     string    `json:"runId"`
	CreatedAt time.Time `json:"createdAt"`
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
	// Logger (default zap.NewNop()).
	Logger *zap.Logger
	// Metrics (nil: none).
	Metrics *Metrics
}

// Runs registers plans and starts runs on Conductor, idempotently and
// safely across replicas, keeping the run registry (runId <-> workflow) in a
// JetStream KV bucket. It is safe for concurrent use; any number of Runs on
// any number of processes may share one bucket and one Conductor.
type Runs struct {
	kv        jetstream.KeyValue
	conductor *Client
	emitter   Emitter
	opts      RunsOptions
	log       *zap.Logger
	metrics   *Metrics

	mu    sync.Mutex
	plans map[string]string // plan key -> hash registered by this process
}

// OpenRuns creates the run registry bucket, or updates it to opts, and
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
	if opts.LeaseTTL < 2*conductor.timeout {
		return nil, invalidInput("open runs", "lease ttl %s must be at least twice the conductor timeout %s", opts.LeaseTTL, conductor.timeout)
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      opts.Bucket,
		Description: "Conductor sidecar run registry: plan versions, run requests, runs and their workflows (docs/conductor.md)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    opts.Replicas,
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, opts.Bucket) // the sidecar's user may not update buckets
	}
	if err != nil {
		return nil, registryUnavailable("open runs bucket "+opts.Bucket, err)
	}
	return &Runs{
		kv:        kv,
		conductor: conductor,
		emitter:   emitter,
		opts:      opts,
		log:       opts.Logger.Named("runs"),
		metrics:   opts.Metrics,
		plans:     make(map[string]string),
	}, nil
}

// Client returns the Conductor client the Runs uses.
func (r *Runs) Client() *Client { return r.conductor }

// RequestKey returns the idempotency key of a run request (seed 001 §3):
// lowercase hex SHA-256 of
// tenantId|projectId|environmentId|planId|planVersion|runRequestId.
func RequestKey(tenantID, projectID, environmentID, planID, planVersion, runRequestID string) string {
	sum := sha256.Sum256([]byte(tenantID + "|" + projectID + "|" + environmentID + "|" + planID + "|" + planVersion + "|" + runRequestID))
	return hex.EncodeToString(sum[:])
}

func planKey(planID, planVersion string) string {
	sum := sha256.Sum256([]byte(planID + "|" + planVersion))
	return keyPlan + hex.EncodeToString(sum[:])
}

func validateField(op, name, v string) error {
	if err := statestore.CheckID(v, true); err != nil {
		return invalidInput(op, "%s %v", name, err)
	}
	return nil
}

// RegisterPlan registers the plan's task and workflow definitions in
// Conductor, idempotently: registering the same plan again is a no-op (a
// cache hit after the first time in this process). A plan whose
// (planId, planVersion) is already registered with a different content hash
// (recorded in the run registry, or embedded in the workflow definition
// Conductor has) is refused with ErrPlanConflict and nothing is changed.
func (r *Runs) RegisterPlan(ctx context.Context, compiled *plan.Compiled) error {
	defs, err := defsOf("register plan", compiled)
	if err != nil {
		return err
	}
	return r.registerPlan(ctx, defs)
}

func (r *Runs) registerPlan(ctx context.Context, defs *planDefs) error {
	pk := planKey(defs.PlanID, defs.PlanVersion)
	r.mu.Lock()
	cached, ok := r.plans[pk]
	r.mu.Unlock()
	if ok {
		if cached == defs.Hash {
			return nil
		}
		return planConflict(defs, cached)
	}
	if err := r.claimPlan(ctx, pk, defs); err != nil {
		return err
	}
	existing, err := r.conductor.WorkflowDef(ctx, defs.Workflow.Name, defs.Workflow.Version)
	switch {
	case err == nil:
		if h := EmbeddedPlanHash(existing); h != "" && h != defs.Hash {
			return planConflict(defs, h)
		}
	case !errors.Is(err, ErrNotFound):
		return err
	}
	if defs.TaskDefsJSON != nil {
		if err := r.conductor.RegisterTaskDefsJSON(ctx, defs.TaskDefsJSON); err != nil {
			return err
		}
	}
	if err := r.conductor.RegisterWorkflowDefJSON(ctx, defs.WorkflowJSON); err != nil {
		return err
	}
	r.mu.Lock()
	r.plans[pk] = defs.Hash
	r.mu.Unlock()
	r.log.Debug("plan registered", zap.String("planId", defs.PlanID), zap.String("planVersion", defs.PlanVersion),
		zap.String("workflow", defs.Workflow.Name), zap.Int32("workflowVersion", defs.Workflow.Version))
	return nil
}

// forgetPlan drops the plan from the in-process cache, so that the next
// RegisterPlan registers it in Conductor again (after a Conductor restart
// with the memory store lost the definitions).
func (r *Runs) forgetPlan(defs *planDefs) {
	r.mu.Lock()
	delete(r.plans, planKey(defs.PlanID, defs.PlanVersion))
	r.mu.Unlock()
}

func planConflict(defs *planDefs, registered string) error {
	return &Error{Code: CodePlanVersionConflict, Op: "register plan",
		Message: fmt.Sprintf("plan %s version %s is already registered with content hash %s; this plan's hash is %s (publish it as a new planVersion)",
			defs.PlanID, defs.PlanVersion, registered, defs.Hash)}
}

// claimPlan records (planId, planVersion) -> hash with an atomic Create, or
// checks the recorded hash.
func (r *Runs) claimPlan(ctx context.Context, pk string, defs *planDefs) error {
	rec := planRecord{PlanID: defs.PlanID, PlanVersion: defs.PlanVersion, Hash: defs.Hash,
		WorkflowName: defs.Workflow.Name, WorkflowVersion: defs.Workflow.Version, RegisteredAt: time.Now().UTC()}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("adapter: encode plan record: %w", err)
	}
	for range 3 {
		_, err := r.kv.Create(ctx, pk, b)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return registryUnavailable("claim plan", err)
		}
		var stored planRecord
		_, err = r.getJSON(ctx, pk, &stored)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if stored.Hash != defs.Hash {
			return planConflict(defs, stored.Hash)
		}
		return nil
	}
	return registryUnavailable("claim plan", errors.New("plan record kept vanishing"))
}

// registeredPlans lists the plan versions in the run registry.
func (r *Runs) registeredPlans(ctx context.Context) ([]planRecord, error) {
	keys, err := r.listKeys(ctx, keyPlan+">")
	if err != nil {
		return nil, err
	}
	out := make([]planRecord, 0, len(keys))
	for _, k := range keys {
		var p planRecord
		if _, err := r.getJSON(ctx, k, &p); err != nil {
			if errors.Is(err, ErrNotFound) {
				continue
			}
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// StartRequest asks for a run of a plan. The run is identified by
// (TenantID, ProjectID, EnvironmentID, Plan.PlanID, Plan.PlanVersion,
// RunRequestID): the same request always yields the same run.
type StartRequest struct {
	TenantID      string
	ProjectID     string
	EnvironmentID string
	RunRequestID  string
	// Plan is the compiled plan (plan.Compile); its planId and planVersion
	// are part of the run's identity.
	Plan *plan.Compiled
}

// StartResult is StartRun's answer: the run, and whether this call started
// its workflow (false: the run existed, nothing was started).
type StartResult struct {
	Run     Run
	Created bool
}

// StartRun starts the run of req exactly once: the first call registers the
// plan (RegisterPlan), mints a runId (UUID v4), starts a Conductor workflow
// with correlationId = runId and input {runId, tenantId, projectId,
// environmentId, planId, planVersion, startAttemptId}, records it and
// appends RunStarted (engineRunRef conductor://<workflowName>/<workflowId>,
// engineType conductor). Repeating the request, from any replica, returns the
// same run without starting anything; a repeat also appends RunStarted if a
// crash had left it out.
//
// Concurrent identical requests: one holds the start lease, the others wait
// for it (at most StartWait and the caller's context) and return its run, or
// ErrRunStartInProgress. When Conductor is unavailable StartRun returns
// ErrEngineUnavailable and leaves no started run: no RunStarted, no run
// entry, and a retry starts cleanly with the same runId. The protocol and its
// crash analysis are in docs/conductor.md.
func (r *Runs) StartRun(ctx context.Context, req StartRequest) (StartResult, error) {
	res, err := r.startRun(ctx, req)
	switch {
	case err != nil:
		r.metrics.start(startResultError)
	case res.Created:
		r.metrics.start(startResultStarted)
	default:
		r.metrics.start(startResultExisting)
	}
	return res, err
}

func (r *Runs) startRun(ctx context.Context, req StartRequest) (StartResult, error) {
	const op = "start run"
	for _, f := range [...]struct{ name, v string }{
		{"tenantId", req.TenantID}, {"projectId", req.ProjectID},
		{"environmentId", req.EnvironmentID}, {"runRequestId", req.RunRequestID},
	} {
		if err := validateField(op, f.name, f.v); err != nil {
			return StartResult{}, err
		}
	}
	defs, err := defsOf(op, req.Plan)
	if err != nil {
		return StartResult{}, err
	}
	reqKey := RequestKey(req.TenantID, req.ProjectID, req.EnvironmentID, defs.PlanID, defs.PlanVersion, req.RunRequestID)
	// A repeat of a started run is answered from the registry alone, so it
	// works while Conductor is down.
	if res, ok, err := r.existingRun(ctx, reqKey, defs); ok || err != nil {
		return res, err
	}
	if err := r.registerPlan(ctx, defs); err != nil {
		return StartResult{}, err
	}
	runID, err := r.runIDFor(ctx, reqKey)
	if err != nil {
		return StartResult{}, err
	}
	waitUntil := time.Now().Add(r.opts.StartWait)
	backoff := 20 * time.Millisecond
	for {
		rec, rev, err := r.get(ctx, runID)
		switch {
		case errors.Is(err, ErrNotFound):
			rec = r.newRun(runID, reqKey, req, defs)
			rev, err = r.createRun(ctx, rec)
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
			if err != nil {
				return StartResult{}, err
			}
			res, retry, err := r.launch(ctx, rec, rev, defs)
			if retry {
				continue
			}
			return res, err
		case err != nil:
			return StartResult{}, err
		case rec.State == RunStateStarting && time.Now().Before(rec.LeaseExpiresAt):
			if !time.Now().Before(waitUntil) {
				return StartResult{}, &Error{Code: CodeRunStartInProgress, Op: op,
					Message: fmt.Sprintf("run %s is being started by attempt %s (lease until %s)", runID, rec.AttemptID, rec.LeaseExpiresAt.Format(time.RFC3339))}
			}
			if err := sleep(ctx, backoff); err != nil {
				if errors.Is(err, context.Canceled) {
					return StartResult{}, fmt.Errorf("adapter: %s: %w", op, err)
				}
				return StartResult{}, &Error{Code: CodeRunStartInProgress, Op: op, Err: err,
					Message: fmt.Sprintf("run %s is being started by attempt %s", runID, rec.AttemptID)}
			}
			backoff = min(2*backoff, 250*time.Millisecond)
		case rec.State == RunStateStarting:
			// The lease expired: its holder crashed (or stalled past the
			// lease). Take over with a new attempt; a workflow the old
			// attempt may have started is adopted or terminated by the
			// watcher (orphan rules).
			prev := rec.AttemptID
			rec.AttemptID = uuid.NewString()
			rec.LeaseExpiresAt = time.Now().Add(r.opts.LeaseTTL).UTC()
			rev, err = r.updateRun(ctx, rec, rev)
			if isRevisionMismatch(err) {
				continue
			}
			if err != nil {
				return StartResult{}, err
			}
			r.log.Info("took over an expired start lease", zap.String("runId", runID),
				zap.String("previousAttempt", prev), zap.String("attempt", rec.AttemptID))
			res, retry, err := r.launch(ctx, rec, rev, defs)
			if retry {
				continue
			}
			return res, err
		default:
			return r.existing(ctx, rec, rev, defs)
		}
	}
}

// existingRun answers a repeated request whose run is started (ok true);
// ok is false when the run request is new or its run is not started.
func (r *Runs) existingRun(ctx context.Context, reqKey string, defs *planDefs) (StartResult, bool, error) {
	var rr reqRecord
	if _, err := r.getJSON(ctx, keyReq+reqKey, &rr); err != nil {
		if errors.Is(err, ErrNotFound) {
			return StartResult{}, false, nil
		}
		return StartResult{}, false, err
	}
	rec, rev, err := r.get(ctx, rr.RunID)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return StartResult{}, false, nil
		}
		return StartResult{}, false, err
	}
	if rec.State == RunStateStarting {
		return StartResult{}, false, nil
	}
	res, err := r.existing(ctx, rec, rev, defs)
	return res, true, err
}

// existing returns a started run, appending its RunStarted if a crash left
// it out. The plan must be the one the run was started with.
func (r *Runs) existing(ctx context.Context, rec *Run, rev uint64, defs *planDefs) (StartResult, error) {
	if rec.PlanHash != defs.Hash {
		return StartResult{}, planConflict(defs, rec.PlanHash)
	}
	if err := r.ensureRunStarted(ctx, rec, rev); err != nil {
		return StartResult{}, err
	}
	return StartResult{Run: *rec}, nil
}

// runIDFor returns the runId of a run request, minting and recording one on
// the first request (atomic Create; racing requests read the winner's).
func (r *Runs) runIDFor(ctx context.Context, reqKey string) (string, error) {
	key := keyReq + reqKey
	fresh, err := json.Marshal(reqRecord{RunID: uuid.NewString(), CreatedAt: time.Now().UTC()})
	if err != nil {
		return "", fmt.Errorf("adapter: encode run request: %w", err)
	}
	for range 3 {
		var rr reqRecord
		_, err := r.getJSON(ctx, key, &rr)
		if err == nil {
			return rr.RunID, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return "", err
		}
		_, err = r.kv.Create(ctx, key, fresh)
		if err == nil {
			var rr reqRecord
			_ = json.Unmarshal(fresh, &rr)
			return rr.RunID, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", registryUnavailable("record run request", err)
		}
	}
	return "", registryUnavailable("record run request", errors.New("run request entry kept vanishing"))
}

func (r *Runs) newRun(runID, reqKey string, req StartRequest, defs *planDefs) *Run {
	now := time.Now().UTC()
	return &Run{
		RunID: runID, RequestKey: reqKey,
		TenantID: req.TenantID, ProjectID: req.ProjectID, EnvironmentID: req.EnvironmentID,
		PlanID: defs.PlanID, PlanVersion: defs.PlanVersion, RunRequestID: req.RunRequestID,
		PlanHash:     defs.Hash,
		WorkflowName: defs.Workflow.Name, WorkflowVersion: defs.Workflow.Version,
		TaskDomain: r.opts.TaskDomain,
		State:      RunStateStarting, AttemptID: uuid.NewString(), LeaseExpiresAt: now.Add(r.opts.LeaseTTL),
		CreatedAt: now,
	}
}

// workflowInput is the input of a run's workflow.
func workflowInput(rec *Run) map[string]any {
	in := plan.WorkflowInput(rec.RunID, rec.TenantID, rec.ProjectID, rec.EnvironmentID, rec.PlanID, rec.PlanVersion)
	in[InputStartAttemptID] = rec.AttemptID
	return in
}

// startRequest is the StartWorkflow request of a run's start attempt.
func startRequest(rec *Run) model.StartWorkflowRequest {
	req := model.StartWorkflowRequest{
		Name: rec.WorkflowName, Version: rec.WorkflowVersion, CorrelationId: rec.RunID, Input: workflowInput(rec),
	}
	if rec.TaskDomain != "" {
		req.TaskToDomain = map[string]string{"*": rec.TaskDomain}
	}
	return req
}

// launch starts the workflow of rec, whose lease this attempt holds at
// revision rev. retry asks the caller to re-read the run (the lease was lost
// while the workflow was being started).
func (r *Runs) launch(ctx context.Context, rec *Run, rev uint64, defs *planDefs) (res StartResult, retry bool, err error) {
	if _, err := r.kv.Put(ctx, keyActive+rec.RunID, []byte(rec.RequestKey)); err != nil {
		r.release(ctx, rec, rev)
		return StartResult{}, false, registryUnavailable("index active run", err)
	}
	start := func() (string, error) {
		// The call is bounded by the client timeout even when ctx allows
		// more, so that it ends well inside the lease.
		sctx, cancel := context.WithTimeout(ctx, r.conductor.timeout)
		defer cancel()
		return r.conductor.StartWorkflow(sctx, startRequest(rec))
	}
	workflowID, err := start()
	if errors.Is(err, ErrNotFound) {
		// Conductor lost the definitions (the memory store restarted):
		// register them again and retry once.
		r.forgetPlan(defs)
		if err = r.registerPlan(ctx, defs); err == nil {
			workflowID, err = start()
		}
	}
	if err != nil {
		r.release(ctx, rec, rev)
		return StartResult{}, false, err
	}
	rec.State = RunStateStarted
	rec.WorkflowID = workflowID
	rec.StartedAt = time.Now().UTC()
	rec.LeaseExpiresAt = time.Time{}
	newRev, err := r.updateRun(ctx, rec, rev)
	if err != nil {
		if isRevisionMismatch(err) {
			// Another attempt took over (our call outlived the lease) or
			// the watcher adopted our workflow. Whatever the record says
			// now wins; if it names another workflow, ours is an orphan
			// and the watcher terminates it.
			r.log.Warn("start lease lost while starting the workflow", zap.String("runId", rec.RunID),
				zap.String("workflowId", workflowID), zap.String("attempt", rec.AttemptID))
			return StartResult{}, true, nil
		}
		// The workflow runs but is not recorded. The lease expires and the
		// watcher adopts it (its input carries the runId); a retry of the
		// request waits for that or takes over.
		return StartResult{}, false, err
	}
	r.log.Info("run started", zap.String("runId", rec.RunID), zap.String("workflowId", workflowID),
		zap.String("workflow", rec.WorkflowName))
	if err := r.ensureRunStarted(ctx, rec, newRev); err != nil {
		if definitelyNotWritten(err) {
			r.abandon(ctx, rec, newRev, err)
		}
		// Otherwise the result is unknown (the store timed out): the
		// workflow stays and a retry of the request, the worker's guard
		// or the watcher adopts it and appends RunStarted.
		return StartResult{}, false, err
	}
	return StartResult{Run: *rec, Created: true}, false, nil
}

// definitelyNotWritten reports an append error after which the event is
// known not to be in the log: the log is damaged or missing, or refused
// the event. A time-out or lost connection is not: the event may be there.
func definitelyNotWritten(err error) bool {
	return errors.Is(err, statestore.ErrDamaged) || errors.Is(err, statestore.ErrSchemaValidation) || errors.Is(err, statestore.ErrInvalidTransition)
}

// abandon undoes a start whose RunStarted could not be written: it
// terminates the workflow (so that Conductor does not run what the log
// does not know) and releases the run entry, so that a retry of the
// request starts afresh under the same runId.
func (r *Runs) abandon(ctx context.Context, rec *Run, rev uint64, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.conductor.timeout)
	defer cancel()
	reason := "sidecar: start abandoned: RunStarted could not be recorded: " + statestore.CodeOf(cause)
	if err := r.conductor.Terminate(ctx, rec.WorkflowID, reason); err != nil {
		// The record stays: the watcher's orphan rules retry it.
		r.log.Error("could not terminate the workflow of an abandoned start; the watcher retries", zap.String("runId", rec.RunID),
			zap.String("workflowId", rec.WorkflowID), zap.Error(err))
		return
	}
	r.log.Warn("start abandoned: the workflow is terminated and a retry of the request starts afresh", zap.String("runId", rec.RunID),
		zap.String("workflowId", rec.WorkflowID), zap.Error(cause))
	r.release(ctx, rec, rev)
}

// release gives up the lease after a failed start: the run entry and its
// active index go, the run request keeps its runId for the retry. It runs on
// a context detached from the caller's cancellation, so that an abandoned
// request does not leave the lease behind.
func (r *Runs) release(ctx context.Context, rec *Run, rev uint64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.kv.Delete(ctx, keyRun+rec.RunID, jetstream.LastRevision(rev)); err != nil {
		if !isRevisionMismatch(err) {
			r.log.Warn("release start lease failed; it expires on its own", zap.String("runId", rec.RunID), zap.Error(err))
		}
		return
	}
	r.deleteActive(ctx, rec.RunID, 0)
}

// deleteActive removes the run from the watcher's index; with rev > 0 only
// if the index entry is still at that revision.
func (r *Runs) deleteActive(ctx context.Context, runID string, rev uint64) {
	var opts []jetstream.KVDeleteOpt
	if rev > 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	if err := r.kv.Delete(ctx, keyActive+runID, opts...); err != nil && !isRevisionMismatch(err) {
		r.log.Debug("delete active index entry", zap.String("runId", runID), zap.Error(err))
	}
}

// ensureRunStarted appends RunStarted for a started run unless the registry
// says it is already appended, then records that it is.
func (r *Runs) ensureRunStarted(ctx context.Context, rec *Run, rev uint64) error {
	if rec.RunStartedEmitted || rec.WorkflowID == "" {
		return nil
	}
	w, err := runEvent(rec, statestore.RunStarted, map[string]any{
		"engineRunRef": rec.EngineRunRef(),
		"engineType":   EngineType,
		"startedAt":    rec.StartedAt.UTC().Format(time.RFC3339Nano),
	})
	if err != nil {
		return err
	}
	if _, err := r.emitter.Emit(ctx, w); err != nil {
		return fmt.Errorf("adapter: append RunStarted of run %s: %w", rec.RunID, err)
	}
	for range 3 {
		rec.RunStartedEmitted = true
		_, err := r.updateRun(ctx, rec, rev)
		if err == nil || !isRevisionMismatch(err) {
			if err != nil {
				r.log.Debug("record RunStarted appended", zap.String("runId", rec.RunID), zap.Error(err))
			}
			return nil // best effort: a repeat of the append is idempotent
		}
		cur, curRev, gerr := r.get(ctx, rec.RunID)
		if gerr != nil || cur.RunStartedEmitted || cur.WorkflowID != rec.WorkflowID {
			return nil
		}
		*rec, rev = *cur, curRev
	}
	return nil
}

// runEvent builds a run-level event of rec (logicalAttemptId 1).
func runEvent(rec *Run, eventType string, payload map[string]any) (*statestore.RunEventWrite, error) {
	return runEventAt(rec, eventType, 1, payload)
}

// runEventAt is runEvent with the logicalAttemptId of a repeated run-level
// event (the pause cycle of RunPaused and RunResumed).
func runEventAt(rec *Run, eventType string, attempt int64, payload map[string]any) (*statestore.RunEventWrite, error) {
	return statestore.NewEvent(statestore.RunRef{RunID: rec.RunID, TenantID: rec.TenantID, ProjectID: rec.ProjectID,
		EnvironmentID: rec.EnvironmentID, PlanID: rec.PlanID, PlanVersion: rec.PlanVersion}, eventType, "", 1, attempt, payload)
}

// Run returns the run registry's entry for runID (any state), or an error
// matching ErrNotFound. Workers use it to check that a task's workflow is the
// run's workflow (Run.WorkflowID); a task of any other workflow carrying the
// runId belongs to an orphan and must not run.
func (r *Runs) Run(ctx context.Context, runID string) (*Run, error) {
	rec, _, err := r.get(ctx, runID)
	return rec, err
}

// maxEnsureWait bounds how long EnsureStarted waits for a start in
// progress.
const maxEnsureWait = 2 * time.Second

// EnsureStarted is for a worker holding a task of workflowID that carries
// runID, when the run has no RunStarted in the log yet. The start of a run
// records the workflow and then appends RunStarted, so a worker that polls
// the first task within that millisecond window sees a run that is not
// started. EnsureStarted closes the window: if the registry records
// workflowID as the run's workflow, it appends RunStarted (idempotent, the
// same event StartRun appends) and returns the run. If the start is still
// in progress it waits for it (at most 2 s or ctx).
//
// It is also the orphan guard: ErrConflict means the run's workflow is
// another one (the task belongs to an orphan workflow and must not run),
// ErrNotFound that no run has that runId (an abandoned start's orphan, or
// a workflow not started by the adapter), ErrRunStartInProgress that the
// start did not finish in time (2 s, or ctx's deadline).
func (r *Runs) EnsureStarted(ctx context.Context, runID, workflowID string) (*Run, error) {
	const op = "ensure run started"
	deadline := time.Now().Add(maxEnsureWait)
	backoff := 10 * time.Millisecond
	for {
		rec, rev, err := r.get(ctx, runID)
		if err != nil {
			return nil, err
		}
		if rec.State != RunStateStarting {
			if rec.WorkflowID != workflowID {
				return nil, &Error{Code: CodeConflict, Op: op,
					Message: fmt.Sprintf("run %s runs as workflow %s, not %s (an orphan workflow)", runID, rec.WorkflowID, workflowID)}
			}
			if err := r.ensureRunStarted(ctx, rec, rev); err != nil {
				return nil, err
			}
			return rec, nil
		}
		if !time.Now().Before(deadline) {
			return nil, &Error{Code: CodeRunStartInProgress, Op: op, Message: "run " + runID + " is still starting"}
		}
		if err := sleep(ctx, backoff); err != nil {
			if errors.Is(err, context.Canceled) {
				return nil, fmt.Errorf("adapter: %s: %w", op, err)
			}
			return nil, &Error{Code: CodeRunStartInProgress, Op: op, Message: "run " + runID + " is still starting", Err: err}
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// RunForRequest returns the run of a run request, or ErrNotFound if it was
// never started.
func (r *Runs) RunForRequest(ctx context.Context, tenantID, projectID, environmentID, planID, planVersion, runRequestID string) (*Run, error) {
	var rr reqRecord
	if _, err := r.getJSON(ctx, keyReq+RequestKey(tenantID, projectID, environmentID, planID, planVersion, runRequestID), &rr); err != nil {
		return nil, err
	}
	return r.Run(ctx, rr.RunID)
}

func (r *Runs) get(ctx context.Context, runID string) (*Run, uint64, error) {
	if _, err := uuid.Parse(runID); err != nil || len(runID) != 36 {
		return nil, 0, &Error{Code: CodeNotFound, Op: "get run", Message: "no run " + runID}
	}
	var rec Run
	rev, err := r.getJSON(ctx, keyRun+runID, &rec)
	if err != nil {
		return nil, 0, err
	}
	if rec.RunID != runID {
		return nil, 0, registryUnavailable("get run", fmt.Errorf("entry %s holds run %q", keyRun+runID, rec.RunID))
	}
	return &rec, rev, nil
}

func (r *Runs) createRun(ctx context.Context, rec *Run) (uint64, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("adapter: encode run: %w", err)
	}
	rev, err := r.kv.Create(ctx, keyRun+rec.RunID, b)
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return 0, registryUnavailable("create run", err)
	}
	return rev, err
}

// updateRun writes rec if the entry is still at rev. A lost race returns an
// error for which isRevisionMismatch is true.
func (r *Runs) updateRun(ctx context.Context, rec *Run, rev uint64) (uint64, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("adapter: encode run: %w", err)
	}
	newRev, err := r.kv.Update(ctx, keyRun+rec.RunID, b, rev)
	if err != nil {
		if isRevisionMismatch(err) {
			return 0, errRevisionMismatch
		}
		return 0, registryUnavailable("update run", err)
	}
	return newRev, nil
}

var errRevisionMismatch = errors.New("adapter: run registry entry changed concurrently")

// NoteEngine records that the run's workflow was paused (or resumed) in
// Conductor for pause cycle cycle: Run.EnginePaused and Run.EngineCycle.
// A note of an older cycle than the recorded one changes nothing.
func (r *Runs) NoteEngine(ctx context.Context, runID string, paused bool, cycle int64) error {
	for range 5 {
		rec, rev, err := r.get(ctx, runID)
		if err != nil {
			return err
		}
		if cycle < rec.EngineCycle || (rec.EngineCycle == cycle && rec.EnginePaused == paused) {
			return nil
		}
		rec.EnginePaused, rec.EngineCycle = paused, cycle
		if _, err = r.updateRun(ctx, rec, rev); !isRevisionMismatch(err) {
			return err
		}
	}
	return fmt.Errorf("adapter: note engine state of run %s: %w", runID, errRevisionMismatch)
}

// isRevisionMismatch reports a lost compare-and-set. On a single server a
// CAS conflict also matches jetstream.ErrKeyExists (same API code).
func isRevisionMismatch(err error) bool {
	return errors.Is(err, errRevisionMismatch) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) ||
		errors.Is(err, jetstream.ErrKeyExists)
}

// getJSON reads key into v and returns its revision; a missing or deleted
// key is ErrNotFound.
func (r *Runs) getJSON(ctx context.Context, key string, v any) (uint64, error) {
	e, err := r.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return 0, &Error{Code: CodeNotFound, Op: "read run registry", Message: "no entry " + key}
	}
	if err != nil {
		return 0, registryUnavailable("read "+key, err)
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return 0, registryUnavailable("decode "+key, err)
	}
	return e.Revision(), nil
}

// listKeys returns the keys matching filter. A KV listing is a watch
// that waits for the stream to deliver every key: without a deadline of
// the caller's, it gets ListTimeout, so that a stalled server cannot hang
// start-up or a background loop.
func (r *Runs) listKeys(ctx context.Context, filter string) ([]string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.opts.ListTimeout)
		defer cancel()
	}
	lister, err := r.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, registryUnavailable("list "+filter, err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	if err := ctx.Err(); err != nil {
		return nil, registryUnavailable("list "+filter, err)
	}
	return keys, nil
}

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
