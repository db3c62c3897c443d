package statestore

// Run statuses (Execution Semantics §1.4, plus QUEUED for RunQueued).
const (
	RunStatusPending   = "PENDING"
	RunStatusQueued    = "QUEUED"
	RunStatusApproved  = "APPROVED"
	RunStatusRunning   = "RUNNING"
	RunStatusPaused    = "PAUSED"
	RunStatusCompleted = "COMPLETED"
	RunStatusFailed    = "FAILED"
	RunStatusCancelled = "CANCELLED"
)

// SubstatusDraining is the substatus of a PAUSED run whose in-flight steps
// have not all finished (Execution Semantics §6).
const SubstatusDraining = "DRAINING"

// Step statuses.
const (
	StepStatusPending = "PENDING"
	StepStatusRunning = "RUNNING"
	StepStatusSuccess = "SUCCESS"
	StepStatusFailed  = "FAILED"
	StepStatusSkipped = "SKIPPED"
)

// IsTerminalRunStatus reports whether status never changes again.
func IsTerminalRunStatus(status string) bool {
	return status == RunStatusCompleted || status == RunStatusFailed || status == RunStatusCancelled
}

// RunSnapshot is the derived state of one run. A snapshot is immutable: the
// projector returns a new one for every change and never modifies its input.
type RunSnapshot struct {
	RunID         string `json:"runId"`
	TenantID      string `json:"tenantId,omitempty"`
	ProjectID     string `json:"projectId,omitempty"`
	EnvironmentID string `json:"environmentId,omitempty"`
	PlanID        string `json:"planId,omitempty"`
	PlanVersion   string `json:"planVersion,omitempty"`

	Status    string `json:"status"`
	Substatus string `json:"substatus,omitempty"`
	// LastEventSeq is the highest runSeq applied (the watermark).
	LastEventSeq int64 `json:"lastEventSeq"`
	// EventCount is the number of records applied, known or not.
	EventCount int64 `json:"eventCount"`

	// Labels are the run's labels, given at submission (RunStarted's
	// payload; Kubernetes' key and value rules).
	Labels          map[string]string `json:"labels,omitempty"`
	EngineRunRef    string            `json:"engineRunRef,omitempty"`
	EngineType      string            `json:"engineType,omitempty"`
	Steps           []StepSnapshot    `json:"steps"`
	Artifacts       []ArtifactRef     `json:"artifacts"`
	StartedAt       string            `json:"startedAt,omitempty"`
	CompletedAt     string            `json:"completedAt,omitempty"`
	TotalDurationMs int64             `json:"totalDurationMs,omitempty"`
	// PausedSeconds is the time the run spent PAUSED (millisecond
	// precision): from each RunPaused's persistedAt to the RunResumed, or
	// the terminal event, that ended it. A pause still open is not counted
	// here (a snapshot is a function of the log, not of the clock); the
	// API's run view adds it. Run time without the pauses is
	// totalDurationMs/1000 - pausedSeconds.
	PausedSeconds float64    `json:"pausedSeconds"`
	FailedSteps   int        `json:"failedSteps"`
	Error         *StepError `json:"error,omitempty"`

	// Pause holds the state of the current or last pause cycle.
	Pause *PauseState `json:"pause,omitempty"`

	// StepRetries counts the run's RETRY_STEP requests (the logicalAttemptId
	// of its last RunStepRetryRequested).
	StepRetries int64 `json:"stepRetries,omitempty"`
	// StepTryEvents counts the run's RunStepTryEnded and RunStepTryStarted
	// (the logicalAttemptId of the last one).
	StepTryEvents int64 `json:"stepTryEvents,omitempty"`

	// CancelRequested is set by RunCancelRequested: a later RunCompleted or
	// RunFailed no longer sets the status (Cancel wins).
	CancelRequested bool `json:"cancelRequested"`
	// CancelRequestedBy is the requestedBy of the run's RunCancelRequested:
	// whoever ends the cancel (the Controller, the run watcher, the pause
	// follower completing a cancel cut short) records it as theirs.
	CancelRequestedBy string `json:"cancelRequestedBy,omitempty"`
	// CancelReason is the reason of the run's RunCancelRequested.
	CancelReason string `json:"cancelReason,omitempty"`
	// Inconsistent is set when an invalid transition was ignored (Policy A).
	Inconsistent bool `json:"inconsistent"`
	// InvalidEvents lists the eventIds ignored as invalid transitions.
	InvalidEvents []string `json:"invalidEvents,omitempty"`
	// Stale is set while the projector has observed a visibility gap and
	// waits for a resync to pass it.
	Stale bool `json:"stale"`
	// SupersededEvents counts RunCompleted/RunFailed kept for audit only
	// because a cancel had been requested.
	SupersededEvents int `json:"supersededEvents,omitempty"`
}

// PauseState describes a pause cycle.
type PauseState struct {
	// Cycle is the pause cycle (the logicalAttemptId of its RunPaused).
	Cycle               int64  `json:"cycle"`
	Reason              string `json:"reason,omitempty"`
	RequestedBy         string `json:"requestedBy,omitempty"`
	StepID              string `json:"stepId,omitempty"`
	PausedAt            string `json:"pausedAt"`
	DrainTimeoutSeconds int64  `json:"drainTimeoutSeconds,omitempty"`
	// ResumeAt is when the pause is to be resumed on its own (RunPaused's
	// payload; requestedBy "schedule"); empty for a pause that waits for
	// an operator.
	ResumeAt string `json:"resumeAt,omitempty"`
	// DrainEndedAt is the persistedAt of RunDrainCompleted or RunDrainTimedOut.
	DrainEndedAt  string `json:"drainEndedAt,omitempty"`
	DrainTimedOut bool   `json:"drainTimedOut,omitempty"`
	ResumedAt     string `json:"resumedAt,omitempty"`
}

// StepSnapshot is the derived state of one step at its current logical attempt.
type StepSnapshot struct {
	StepID           string        `json:"stepId"`
	Status           string        `json:"status"`
	LogicalAttemptID int64         `json:"logicalAttemptId"`
	EngineAttemptID  int64         `json:"engineAttemptId,omitempty"`
	StartedAt        string        `json:"startedAt,omitempty"`
	CompletedAt      string        `json:"completedAt,omitempty"`
	Artifacts        []ArtifactRef `json:"artifacts"`
	Error            *StepError    `json:"error,omitempty"`
	SkipReason       string        `json:"skipReason,omitempty"`
	// Held is set on a FAILED attempt whose StepFailed named
	// onStepFailure "pause": the run was paused instead of failed and the
	// step waits for a RETRY_STEP (or a cancel).
	Held bool `json:"held,omitempty"`
	// RetryRequested is set on a PENDING attempt opened by RETRY_STEP.
	RetryRequested bool `json:"retryRequested,omitempty"`
	// Idle is set on a RUNNING attempt whose try ended without an outcome
	// (RunStepTryEnded) until its next try starts (RunStepTryStarted): the
	// step is not in flight, and a drain does not wait for it.
	Idle bool `json:"idle,omitempty"`
	// IdleReason is the reason of the RunStepTryEnded that made the
	// attempt idle (TryEndedTaskTimedOut, ...); empty when it is not.
	IdleReason string `json:"idleReason,omitempty"`
	// TryStartedAt is the persistedAt of the RunStepTryStarted that put an
	// idle attempt in flight again: its latest try began then (empty: the
	// attempt ran from its StepStarted without a break).
	TryStartedAt string `json:"tryStartedAt,omitempty"`
}

// HeldSteps returns the ids of the steps held after a failure and not
// retried yet, in step order.
func (s *RunSnapshot) HeldSteps() []string {
	var ids []string
	for i := range s.Steps {
		if s.Steps[i].Held && s.Steps[i].Status == StepStatusFailed {
			ids = append(ids, s.Steps[i].StepID)
		}
	}
	return ids
}

// Step returns the step with the given id, or nil.
func (s *RunSnapshot) Step(stepID string) *StepSnapshot {
	for i := range s.Steps {
		if s.Steps[i].StepID == stepID {
			return &s.Steps[i]
		}
	}
	return nil
}

// InFlight returns the ids of the steps in flight, in step order: RUNNING
// and not idle (a try of theirs is running somewhere).
func (s *RunSnapshot) InFlight() []string {
	var ids []string
	for i := range s.Steps {
		if s.Steps[i].Status == StepStatusRunning && !s.Steps[i].Idle {
			ids = append(ids, s.Steps[i].StepID)
		}
	}
	return ids
}

// Clone returns a deep copy of s.
func (s *RunSnapshot) Clone() *RunSnapshot {
	c := *s
	c.Steps = make([]StepSnapshot, len(s.Steps))
	for i, st := range s.Steps {
		st.Artifacts = cloneSlice(st.Artifacts)
		if st.Error != nil {
			e := *st.Error
			st.Error = &e
		}
		c.Steps[i] = st
	}
	c.Artifacts = cloneSlice(s.Artifacts)
	c.InvalidEvents = cloneSlice(s.InvalidEvents)
	if s.Error != nil {
		e := *s.Error
		c.Error = &e
	}
	if s.Pause != nil {
		p := *s.Pause
		c.Pause = &p
	}
	return &c
}

// cloneSlice copies s, keeping nil nil and empty empty (JSON null vs []).
func cloneSlice[T any](s []T) []T {
	if s == nil {
		return nil
	}
	return append(make([]T, 0, len(s)), s...)
}
