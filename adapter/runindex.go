package adapter

// The run index: one KV entry per run (Run), the request and plan
// entries that lead to it, and the index of the active runs the watcher
// follows (docs/conductor.md, "Run index: KV layout"). Every write is a
// compare-and-set on the entry's revision, so any number of replicas share it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Run states in the run index.
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

// KV key prefixes of the run index (docs/conductor.md, "KV layout").
const (
	keyPlan   = "plan."
	keyReq    = "req."
	keyRun    = "run."
	keyActive = "active."
)

// Run is a run's entry in the run index: its identity, its Conductor
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

	// Labels are the run's labels (StartRequest.Labels).
	Labels          map[string]string `json:"labels,omitempty"`
	WorkflowName    string            `json:"workflowName"`
	WorkflowVersion int32             `json:"workflowVersion"`
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
}

// EngineRunRef returns conductor://<workflowName>/<workflowId>, or "" before
// the workflow exists.
func (r *Run) EngineRunRef() string {
	return statestore.ConductorRunRef(r.WorkflowName, r.WorkflowID)
}

// reqRecord maps a run request to its runId; it never changes once created.
type reqRecord struct {
	RunID     string    `json:"runId"`
	CreatedAt time.Time `json:"createdAt"`
}

// activeRevision is the revision of runID's entry in the active index.
func (r *Runs) activeRevision(ctx context.Context, runID string) (uint64, error) {
	e, err := r.kv.Get(ctx, keyActive+runID)
	if err != nil {
		return 0, err
	}
	return e.Revision(), nil
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

// Run returns the run index's entry for runID (any state), or an error
// matching ErrNotFound. Workers use it to check that a task's workflow is the
// run's workflow (Run.WorkflowID); a task of any other workflow carrying the
// runId belongs to an orphan and must not run.
func (r *Runs) Run(ctx context.Context, runID string) (*Run, error) {
	rec, _, err := r.get(ctx, runID)
	return rec, err
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

var errRevisionMismatch = errors.New("adapter: run index entry changed concurrently")

// leaderRun reads runID's entry from the bucket stream's leader, with the
// stream message API that only the leader answers. A KV Get is a direct
// get, which any replica of a replicated bucket answers, a follower
// possibly a moment behind: TestE2E_Chaos saw a worker's guard read a run
// entry that had just been replaced and fail the run's own workflow as
// foreign. Used to confirm a conflict before acting on it.
func (r *Runs) leaderRun(ctx context.Context, runID string) (*Run, uint64, error) {
	bucket := r.kv.Bucket()
	prefix := r.js.Options().APIPrefix
	switch {
	case r.js.Options().Domain != "":
		prefix = "$JS." + r.js.Options().Domain + ".API."
	case prefix == "":
		prefix = jetstream.DefaultAPIPrefix
	case !strings.HasSuffix(prefix, "."):
		prefix += "."
	}
	body, _ := json.Marshal(map[string]string{"last_by_subj": "$KV." + bucket + "." + keyRun + runID})
	// One request: its answer is waited for at most ListTimeout whatever
	// ctx allows, since nats.go waits for an answer a dead node never
	// sends until ctx ends.
	ctx, cancel := context.WithTimeout(ctx, r.opts.ListTimeout)
	defer cancel()
	resp, err := r.js.Conn().RequestWithContext(ctx, prefix+"STREAM.MSG.GET.KV_"+bucket, body)
	if err != nil {
		return nil, 0, registryUnavailable("read run entry from the leader", err)
	}
	var answer struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Seq  uint64 `json:"seq"`
			Data []byte `json:"data"`
			Hdrs []byte `json:"hdrs"`
		} `json:"message"`
	}
	if err := json.Unmarshal(resp.Data, &answer); err != nil {
		return nil, 0, registryUnavailable("decode the leader's answer", err)
	}
	switch {
	case answer.Error != nil && answer.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, 0, &Error{Code: CodeNotFound, Op: "read run index", Message: "no entry " + keyRun + runID}
	case answer.Error != nil:
		return nil, 0, registryUnavailable("read run entry from the leader", answer.Error)
	case answer.Message == nil:
		return nil, 0, registryUnavailable("read run entry from the leader", errors.New("answer without a message"))
	}
	if h := string(answer.Message.Hdrs); strings.Contains(h, "KV-Operation: DEL") || strings.Contains(h, "KV-Operation: PURGE") {
		return nil, 0, &Error{Code: CodeNotFound, Op: "read run index", Message: "no entry " + keyRun + runID}
	}
	var rec Run
	if err := json.Unmarshal(answer.Message.Data, &rec); err != nil {
		return nil, 0, registryUnavailable("decode "+keyRun+runID, err)
	}
	return &rec, answer.Message.Seq, nil
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
		return 0, &Error{Code: CodeNotFound, Op: "read run index", Message: "no entry " + key}
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
