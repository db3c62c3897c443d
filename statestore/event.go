package statestore

import (
	"bytes"
	"encoding/json"
	"time"
)

// Known lifecycle event types of the Run Events Contract v2.0.1 §1.2, plus
// RunApproved from the Execution Semantics Contract §1.2.
const (
	RunQueued     = "RunQueued"
	RunApproved   = "RunApproved"
	RunStarted    = "RunStarted"
	StepStarted   = "StepStarted"
	StepCompleted = "StepCompleted"
	StepFailed    = "StepFailed"
	StepSkipped   = "StepSkipped"
	RunPaused     = "RunPaused"
	RunResumed    = "RunResumed"
	RunCompleted  = "RunCompleted"
	RunFailed     = "RunFailed"
	RunCancelled  = "RunCancelled"
)

// Extension event types of the sidecar (allowed by §1.3 of the contract; their
// semantics are documented in docs/events.md).
const (
	// RunCancelRequested records the intent to cancel. From then on a later
	// RunCompleted or RunFailed stays in the log but does not set the status
	// ("Cancel wins").
	RunCancelRequested = "RunCancelRequested"
	// RunDrainCompleted records that the last in-flight step of a paused run
	// finished; the DRAINING substatus clears.
	RunDrainCompleted = "RunDrainCompleted"
	// RunDrainTimedOut records that the drain deadline passed with steps still
	// running; its payload carries code PAUSE_DRAIN_TIMEOUT.
	RunDrainTimedOut = "RunDrainTimedOut"
	// RunStepRetryRequested records an operator's RETRY_STEP of a step held
	// after a failure (onStepFailure: pause). It is run-level (Run Events
	// Contract v2.0.1 §2.2 allows stepId only on the four step events): the
	// step and its next logical attempt are in the payload, and
	// logicalAttemptId counts the run's retry requests (1, 2, ...), like the
	// pause cycle of RunPaused.
	RunStepRetryRequested = "RunStepRetryRequested"
	// RunStepTryEnded records that a RUNNING step's current try ended
	// without an outcome for its logical attempt (an engine try failed and
	// Conductor retries it, the task was handed back, or the worker that
	// ran it died): the step is no longer in flight (steps[].idle), so a
	// drain does not wait for it. RunStepTryStarted records that a later
	// try of the same attempt started. Both are run-level (Run Events
	// Contract v2.0.1 §2.2): the step and its logical attempt are in the
	// payload, and logicalAttemptId counts the run's try events (1, 2, ...),
	// one counter for both types.
	RunStepTryEnded   = "RunStepTryEnded"
	RunStepTryStarted = "RunStepTryStarted"
)

// Reasons of RunStepTryEnded (payload.reason).
const (
	// TryEndedEngineTryFailed: the try failed and Conductor retries it
	// (engineAttemptId < engineTries): no StepFailed (docs/events.md, "Why the try events exist").
	TryEndedEngineTryFailed = "engineTryFailed"
	// TryEndedHandedBack: the task was handed back to Conductor unfinished
	// (the executor could not run, or shutdown interrupted the step).
	TryEndedHandedBack = "handedBack"
	// TryEndedWorkerRestarted: the process that ran the try died; its
	// restart handed the task back.
	TryEndedWorkerRestarted = "workerRestarted"
	// TryEndedTaskTimedOut: an outside worker's task ended in Conductor
	// without its report (the response timeout passed: the worker died,
	// or the task was cancelled); Conductor retries it or fails the run.
	TryEndedTaskTimedOut = "taskTimedOut"
	// TryEndedSubWorkflowPaused: a SUB_WORKFLOW task of an adopted run is
	// in progress, but its child workflow is paused and nothing of it runs
	// (its own drain ended): the task does not end while the child stays
	// paused. The step is in flight again (RunStepTryStarted) once the run
	// runs and so does the child.
	TryEndedSubWorkflowPaused = "subWorkflowPaused"
)

// RunLevelStepID is stepIdNormalized for run-level events (§3.1 rule 7).
const RunLevelStepID = "RUN"

// IsStepEvent reports whether eventType is one of the four step-level events
// that must carry a stepId (§2.2). Every other type, known or not, is run-level.
func IsStepEvent(eventType string) bool {
	switch eventType {
	case StepStarted, StepCompleted, StepFailed, StepSkipped:
		return true
	}
	return false
}

// IsKnownEvent reports whether the projector gives eventType semantics.
// Unknown types are stored and advance the watermark but change no state.
func IsKnownEvent(eventType string) bool {
	switch eventType {
	case RunQueued, RunApproved, RunStarted, StepStarted, StepCompleted, StepFailed, StepSkipped,
		RunPaused, RunResumed, RunCompleted, RunFailed, RunCancelled,
		RunCancelRequested, RunDrainCompleted, RunDrainTimedOut, RunStepRetryRequested,
		RunStepTryEnded, RunStepTryStarted:
		return true
	}
	return false
}

// RunEventWrite is an event as a producer hands it to the append authority
// (Run Events Contract §4). It has no runSeq and no persistedAt.
type RunEventWrite struct {
	EventID          string          `json:"eventId"`
	EventType        string          `json:"eventType"`
	EmittedAt        string          `json:"emittedAt"`
	RunID            string          `json:"runId"`
	TenantID         string          `json:"tenantId"`
	ProjectID        string          `json:"projectId"`
	EnvironmentID    string          `json:"environmentId"`
	PlanID           string          `json:"planId"`
	PlanVersion      string          `json:"planVersion"`
	EngineAttemptID  int64           `json:"engineAttemptId"`
	LogicalAttemptID int64           `json:"logicalAttemptId"`
	IdempotencyKey   string          `json:"idempotencyKey"`
	StepID           string          `json:"stepId,omitempty"`
	Payload          json.RawMessage `json:"payload,omitempty"`
}

// RunEventRecord is a persisted event: the write plus the append authority's
// runSeq (monotonic per run, gaps allowed) and persistedAt (its own clock).
type RunEventRecord struct {
	RunEventWrite
	RunSeq      int64  `json:"runSeq"`
	PersistedAt string `json:"persistedAt"`
	// LogSeq is the record's place in the whole log, set by a Follower's
	// tail (0 otherwise): JetStream's stream sequence, PostgreSQL's
	// log_seq. Not part of the contract's record.
	LogSeq uint64 `json:"-"`
}

// AppendResult is what Append returns (IRunStateStore §2). On a duplicate
// (runId, idempotencyKey) it carries the existing record's metadata with
// Idempotent true and Persisted false.
type AppendResult struct {
	EventID     string `json:"eventId"`
	RunSeq      int64  `json:"runSeq"`
	PersistedAt string `json:"persistedAt"`
	Idempotent  bool   `json:"idempotent"`
	Persisted   bool   `json:"persisted"`
}

// ArtifactRef points at a step output kept outside the log (Execution
// Semantics §2). Events carry references, never the bytes.
type ArtifactRef struct {
	URI       string `json:"uri"`
	Kind      string `json:"kind"`
	SHA256    string `json:"sha256,omitempty"`
	SizeBytes int64  `json:"sizeBytes,omitempty"`
	ExpiresAt string `json:"expiresAt,omitempty"`
}

// StepError is the error a failed step or run records.
type StepError struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable"`
}

// EncodeWrite is how a backend stores a RunEventWrite: compact JSON
// without HTML escaping, so that a payload comes back byte for byte as
// the producer sent it.
func EncodeWrite(w *RunEventWrite) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(w); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// FormatPersistedAt renders a store's commit time as persistedAt: RFC 3339
// in UTC with the store's precision (nanoseconds on JetStream,
// microseconds on PostgreSQL).
func FormatPersistedAt(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
