package adapter

// The run start protocol (docs/conductor.md, "Run start protocol"): a
// request key leads to one run id; a lease lets one start at a time reach
// Conductor; RunStarted follows the workflow.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// RequestKey returns the idempotency key of a run request (Execution
// Semantics Contract v1.1 §3): lowercase hex SHA-256 of
// tenantId|projectId|environmentId|planId|planVersion|runRequestId.
func RequestKey(tenantID, projectID, environmentID, planID, planVersion, runRequestID string) string {
	sum := sha256.Sum256([]byte(tenantID + "|" + projectID + "|" + environmentID + "|" + planID + "|" + planVersion + "|" + runRequestID))
	return hex.EncodeToString(sum[:])
}

func validateField(op, name, v string) error {
	if err := statestore.CheckID(v, true); err != nil {
		return invalidInput(op, "%s %v", name, err)
	}
	return nil
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
	// Labels are the run's labels (CheckLabels); not part of its
	// identity: a repeat with other labels is the same run, with the
	// first request's labels.
	Labels map[string]string
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

// RunIDFor returns the runId that StartRun gives req, minting it if no
// request with req's key was seen before: a run can be named (a queued
// run's RunQueued) before it starts.
func (r *Runs) RunIDFor(ctx context.Context, req StartRequest) (string, error) {
	defs, err := defsOf("run id", req.TenantID, req.Plan)
	if err != nil {
		return "", err
	}
	return r.runIDFor(ctx, RequestKey(req.TenantID, req.ProjectID, req.EnvironmentID, defs.PlanID, defs.PlanVersion, req.RunRequestID))
}

// Existing returns req's run if it was started (ok false: not yet).
func (r *Runs) Existing(ctx context.Context, req StartRequest) (res StartResult, ok bool, err error) {
	defs, err := defsOf("existing run", req.TenantID, req.Plan)
	if err != nil {
		return StartResult{}, false, err
	}
	return r.existingRun(ctx, RequestKey(req.TenantID, req.ProjectID, req.EnvironmentID, defs.PlanID, defs.PlanVersion, req.RunRequestID), defs)
}

func (r *Runs) startRun(ctx context.Context, req StartRequest) (StartResult, error) {
	const op = "start run"
	for _, f := range [...]struct{ name, v string }{
		{"projectId", req.ProjectID},
		{"environmentId", req.EnvironmentID}, {"runRequestId", req.RunRequestID},
	} {
		if err := validateField(op, f.name, f.v); err != nil {
			return StartResult{}, err
		}
	}
	defs, err := defsOf(op, req.TenantID, req.Plan)
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
				return StartResult{}, &Error{Code: CodeRunStartInProgress, Op: op, RetryAt: rec.LeaseExpiresAt,
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
		return StartResult{}, planConflict(defs)
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
		TaskDomain: r.opts.TaskDomain, Labels: req.Labels,
		State: RunStateStarting, AttemptID: uuid.NewString(), LeaseExpiresAt: now.Add(r.opts.LeaseTTL),
		CreatedAt: now,
	}
}

// InputTraceContext is the workflow input variable that carries the run
// span's W3C trace context, in the shape of Conductor's trace context
// proposal: {"traceparent": "00-<trace id>-<span id>-01"}. Present only
// when tracing is on.
const InputTraceContext = "_trace_context"

// workflowInput is the input of a run's workflow; tracer may be nil.
func workflowInput(rec *Run, tracer WorkflowTracer) map[string]any {
	in := plan.WorkflowInput(rec.RunID, rec.TenantID, rec.ProjectID, rec.EnvironmentID, rec.PlanID, rec.PlanVersion)
	in[InputStartAttemptID] = rec.AttemptID
	if tracer != nil {
		if tc := tracer.WorkflowTraceContext(rec.RunID); tc != nil {
			in[InputTraceContext] = tc
		}
	}
	return in
}

// startRequest is the StartWorkflow request of a run's start attempt;
// tracer may be nil.
func startRequest(rec *Run, tracer WorkflowTracer) model.StartWorkflowRequest {
	req := model.StartWorkflowRequest{
		Name: rec.WorkflowName, Version: rec.WorkflowVersion, CorrelationId: rec.RunID, Input: workflowInput(rec, tracer),
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
		return r.conductor.StartWorkflow(sctx, startRequest(rec, r.opts.Tracer))
	}
	workflowID, err := start()
	if errors.Is(err, ErrNotFound) && rec.WorkflowName == defs.Workflow.Name {
		// Conductor lost the definitions (the memory store restarted):
		// register them again and retry once. (A run recorded before
		// plan ids were each tenant's names the shared definition, which
		// defs does not register.)
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
	reason := "sidecar: start abandoned: RunStarted could not be recorded: " + errcode.CodeOf(cause)
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

// ensureRunStarted appends RunStarted for a started run unless the registry
// says it is already appended, then records that it is.
func (r *Runs) ensureRunStarted(ctx context.Context, rec *Run, rev uint64) error {
	if rec.RunStartedEmitted || rec.WorkflowID == "" {
		return nil
	}
	w, err := runEvent(rec, statestore.RunStarted, statestore.RunStartedPayload{
		EngineRunRef: rec.EngineRunRef(), EngineType: EngineType, Labels: rec.Labels,
		StartedAt: rec.StartedAt.UTC().Format(time.RFC3339Nano),
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

// runEvent builds a run-level event of rec (logicalAttemptId 1) with
// payload, eventType's statestore.Payload.
func runEvent(rec *Run, eventType string, payload any) (*statestore.RunEventWrite, error) {
	return runEventAt(rec, eventType, 1, payload)
}

// runEventAt is runEvent with the logicalAttemptId of a repeated run-level
// event (the pause cycle of RunPaused and RunResumed).
func runEventAt(rec *Run, eventType string, attempt int64, payload any) (*statestore.RunEventWrite, error) {
	return statestore.NewEvent(statestore.RunRef{RunID: rec.RunID, TenantID: rec.TenantID, ProjectID: rec.ProjectID,
		EnvironmentID: rec.EnvironmentID, PlanID: rec.PlanID, PlanVersion: rec.PlanVersion}, eventType, "", 1, attempt, payload)
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
		if rec.State != RunStateStarting && rec.WorkflowID != workflowID {
			// A conflict fails the task for good: confirm it with the
			// bucket's leader first (the read may come from a follower a
			// moment behind, e.g. just after a start was abandoned and
			// retried).
			if rec, rev, err = r.leaderRun(ctx, runID); err != nil {
				return nil, err
			}
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
