package statestore

import (
	"slices"
	"time"
)

// InvalidTransitionAlert is the operational alert the projector raises for an
// invalid transition (Run Events Contract §5.4). Alerts are idempotent per
// (RunID, EventID): the Projector raises each at most once.
type InvalidTransitionAlert struct {
	Code           string `json:"code"` // always INVALID_TRANSITION
	RunID          string `json:"runId"`
	TenantID       string `json:"tenantId"`
	ProjectID      string `json:"projectId"`
	EnvironmentID  string `json:"environmentId"`
	EventID        string `json:"eventId"`
	EventType      string `json:"eventType"`
	RunSeq         int64  `json:"runSeq"`
	PersistedAt    string `json:"persistedAt"`
	StepID         string `json:"stepId,omitempty"`
	Entity         string `json:"entity"`
	PriorState     string `json:"priorState"`
	AttemptedState string `json:"attemptedState"`
	ExpectedState  string `json:"expectedState"`
	Reason         string `json:"reason"`
}

// Reduce applies recs, in order, to prev and returns the new snapshot and the
// invalid-transition alerts the batch raised. It is pure: prev and recs are
// not modified, and the same input gives the same output.
//
// Records with runSeq <= prev.LastEventSeq were applied already and are
// skipped, so reprocessing from a watermark is idempotent. Records of another
// run are ignored. prev may be nil for a run without a snapshot; the result
// is nil only when prev is nil and no record applied.
func Reduce(prev *RunSnapshot, recs []RunEventRecord) (*RunSnapshot, []InvalidTransitionAlert) {
	var s *RunSnapshot
	var alerts []InvalidTransitionAlert
	var index stepIndex
	for i := range recs {
		r := &recs[i]
		if s == nil {
			if prev != nil {
				if r.RunID != prev.RunID || r.RunSeq <= prev.LastEventSeq {
					continue
				}
				s = prev.derive(stepRoom(recs[i:]))
			} else {
				s = newSnapshot(r)
			}
			index = stepIndex{s: s, lookups: len(recs) - i}
		}
		if r.RunID != s.RunID || r.RunSeq <= s.LastEventSeq {
			continue
		}
		if a := apply(s, &index, r); a != nil {
			alerts = append(alerts, *a)
		}
		s.LastEventSeq = r.RunSeq
		s.EventCount++
	}
	if s == nil {
		return prev, nil
	}
	s.Substatus = ""
	if s.Status == RunStatusPaused && s.Pause != nil && s.Pause.DrainEndedAt == "" && s.inFlight() > 0 {
		s.Substatus = SubstatusDraining
	}
	return s, alerts
}

// derive is the copy of s that Reduce applies records to: its own Steps
// (with room for grow more) and Pause, and everything else shared with s.
// What is shared is never written through: apply replaces a step's
// Artifacts and Error and the run's Error and Labels rather than changing
// them, and the lists it appends to (the run's Artifacts and
// InvalidEvents, a step's Artifacts) are clipped, so that an append
// copies them first. A record thus costs one copy of the Steps slice's
// elements (a memmove), not a deep copy of every step.
func (s *RunSnapshot) derive(grow int) *RunSnapshot {
	c := *s
	c.Steps = make([]StepSnapshot, len(s.Steps), len(s.Steps)+grow)
	copy(c.Steps, s.Steps)
	c.Artifacts = slices.Clip(s.Artifacts)
	c.InvalidEvents = slices.Clip(s.InvalidEvents)
	if s.Pause != nil {
		p := *s.Pause
		c.Pause = &p
	}
	return &c
}

// stepRoom is the room derive leaves for steps that recs may add: one
// per step event, at most half the batch and one. Run-level events add
// no step, so a snapshot that only they changed (a paused run's, kept by
// the projector and the run list) holds no unused steps.
func stepRoom(recs []RunEventRecord) int {
	n := 0
	for i := range recs {
		if recs[i].StepID != "" {
			n++
		}
	}
	return min(n, len(recs)/2+1)
}

// stepIndex finds a step's position in s.Steps for Reduce. A batch of
// few records (a projection catching up on the newest one) looks each
// step up by a scan, which costs less than building a map of every step
// of a large run; a batch of many builds the map once.
type stepIndex struct {
	s *RunSnapshot
	// lookups is how many lookups the batch may make (its records).
	lookups int
	m       map[string]int
}

// scanBelow is the batch size up to which lookups scan.
const scanBelow = 8

func (x *stepIndex) find(stepID string) (int, bool) {
	if x.m == nil && x.lookups >= scanBelow {
		x.m = make(map[string]int, len(x.s.Steps))
		for j := range x.s.Steps {
			x.m[x.s.Steps[j].StepID] = j
		}
	}
	if x.m != nil {
		i, ok := x.m[stepID]
		return i, ok
	}
	for j := range x.s.Steps {
		if x.s.Steps[j].StepID == stepID {
			return j, true
		}
	}
	return 0, false
}

// add records that stepID was appended to s.Steps at i.
func (x *stepIndex) add(stepID string, i int) {
	if x.m != nil {
		x.m[stepID] = i
	}
}

func newSnapshot(r *RunEventRecord) *RunSnapshot {
	return &RunSnapshot{
		RunID: r.RunID, TenantID: r.TenantID, ProjectID: r.ProjectID, EnvironmentID: r.EnvironmentID,
		PlanID: r.PlanID, PlanVersion: r.PlanVersion,
		Status: RunStatusPending, Steps: []StepSnapshot{}, Artifacts: []ArtifactRef{},
	}
}

func (s *RunSnapshot) inFlight() int {
	n := 0
	for i := range s.Steps {
		if s.Steps[i].Status == StepStatusRunning && !s.Steps[i].Idle {
			n++
		}
	}
	return n
}

func apply(s *RunSnapshot, index *stepIndex, r *RunEventRecord) *InvalidTransitionAlert {
	var step *StepSnapshot
	if IsStepEvent(r.EventType) {
		if i, ok := index.find(r.StepID); ok {
			step = &s.Steps[i]
		}
	}
	d := decide(s, step, r.EventType, r.LogicalAttemptID)
	switch d.Outcome {
	case Ignore:
		return nil
	case Audit:
		if r.EventType == RunCompleted || r.EventType == RunFailed {
			s.SupersededEvents++
		}
		return nil
	case Invalid:
		s.Inconsistent = true
		s.InvalidEvents = append(s.InvalidEvents, r.EventID)
		return &InvalidTransitionAlert{
			Code: CodeInvalidTransition, RunID: r.RunID, TenantID: r.TenantID, ProjectID: r.ProjectID,
			EnvironmentID: r.EnvironmentID, EventID: r.EventID, EventType: r.EventType, RunSeq: r.RunSeq,
			PersistedAt: r.PersistedAt, StepID: r.StepID, Entity: d.Entity, PriorState: d.PriorState,
			AttemptedState: d.AttemptedState, ExpectedState: d.ExpectedState, Reason: d.Reason,
		}
	}
	if IsStepEvent(r.EventType) {
		applyStep(s, index, r)
		return nil
	}
	switch r.EventType {
	case RunResumed, RunCompleted, RunFailed, RunCancelled:
		if s.Status == RunStatusPaused && s.Pause != nil {
			s.PausedSeconds += secondsBetween(s.Pause.PausedAt, r.PersistedAt)
		}
	}
	switch r.EventType {
	case RunQueued:
		var p RunQueuedPayload
		decodeLenient(r.Payload, &p)
		s.Status = RunStatusQueued
		if p.Labels != nil {
			s.Labels = p.Labels // a queued run is selected by its labels too
		}
	case RunApproved:
		s.Status = RunStatusApproved
	case RunStarted:
		var p RunStartedPayload
		decodeLenient(r.Payload, &p)
		s.Status = RunStatusRunning
		s.EngineRunRef, s.EngineType = p.EngineRunRef, p.EngineType
		if p.Labels != nil {
			s.Labels = p.Labels // else those of its RunQueued, if any
		}
		s.StartedAt = p.StartedAt
		if s.StartedAt == "" {
			s.StartedAt = r.PersistedAt
		}
	case RunPaused:
		var p RunPausedPayload
		decodeLenient(r.Payload, &p)
		s.Status = RunStatusPaused
		s.Pause = &PauseState{
			Cycle: r.LogicalAttemptID, Reason: p.Reason, RequestedBy: p.RequestedBy, StepID: p.StepID,
			PausedAt: r.PersistedAt, ResumeAt: p.ResumeAt,
		}
		if p.DrainTimeoutSeconds != nil {
			s.Pause.DrainTimeoutSeconds = *p.DrainTimeoutSeconds
		}
	case RunResumed:
		s.Status = RunStatusRunning
		s.Pause.ResumedAt = r.PersistedAt
		if s.Pause.DrainEndedAt == "" {
			s.Pause.DrainEndedAt = r.PersistedAt
		}
	case RunDrainCompleted:
		s.Pause.DrainEndedAt = r.PersistedAt
	case RunDrainTimedOut:
		s.Pause.DrainEndedAt = r.PersistedAt
		s.Pause.DrainTimedOut = true
	case RunCancelRequested:
		var p RunCancelRequestedPayload
		decodeLenient(r.Payload, &p)
		s.CancelRequested = true
		s.CancelRequestedBy, s.CancelReason = p.RequestedBy, p.Reason
	case RunStepRetryRequested:
		var p RunStepRetryRequestedPayload
		decodeLenient(r.Payload, &p)
		s.StepRetries = r.LogicalAttemptID
		// Opens the step's next attempt when the payload names it; a retry
		// that does not fit the step (not failed, wrong attempt) counts but
		// changes no step.
		if i, ok := index.find(p.StepID); ok {
			st := &s.Steps[i]
			if st.Status == StepStatusFailed && p.StepLogicalAttemptID == st.LogicalAttemptID+1 {
				*st = StepSnapshot{StepID: st.StepID, Status: StepStatusPending, LogicalAttemptID: p.StepLogicalAttemptID,
					Artifacts: []ArtifactRef{}, RetryRequested: true}
			}
		}
	case RunStepTryEnded, RunStepTryStarted:
		// Both payloads name the step and its attempt alike; an end adds
		// its reason.
		var p RunStepTryEndedPayload
		decodeLenient(r.Payload, &p)
		s.StepTryEvents = r.LogicalAttemptID
		// Marks the step idle (or in flight again) when the payload names
		// its RUNNING attempt; one that does not fit counts and changes no step.
		if i, ok := index.find(p.StepID); ok {
			st := &s.Steps[i]
			stale := r.EventType == RunStepTryEnded && p.EngineAttemptID > 0 && p.EngineAttemptID < st.EngineAttemptID
			if st.Status == StepStatusRunning && st.LogicalAttemptID == p.StepLogicalAttemptID && !stale {
				if p.EngineAttemptID > 0 {
					st.EngineAttemptID = p.EngineAttemptID
				}
				st.Idle = r.EventType == RunStepTryEnded
				st.IdleReason = ""
				if st.Idle {
					st.IdleReason = p.Reason
				}
				if r.EventType == RunStepTryStarted {
					st.TryStartedAt = r.PersistedAt
				}
			}
		}
	case RunCompleted:
		var p RunCompletedPayload
		decodeLenient(r.Payload, &p)
		s.Status = RunStatusCompleted
		s.finish(r.PersistedAt)
		for i := range s.Steps {
			s.Artifacts = append(s.Artifacts, s.Steps[i].Artifacts...)
		}
		s.Artifacts = append(s.Artifacts, p.Artifacts...)
	case RunFailed:
		var p RunFailedPayload
		decodeLenient(r.Payload, &p)
		s.Status = RunStatusFailed
		s.Error = p.Error
		s.finish(r.PersistedAt)
	case RunCancelled:
		s.Status = RunStatusCancelled
		s.CancelRequested = true
		s.finish(r.PersistedAt)
	}
	return nil
}

// secondsBetween is to - from in seconds, to the millisecond; 0 when either
// does not parse or to is before from.
func secondsBetween(from, to string) float64 {
	a, err1 := time.Parse(time.RFC3339Nano, from)
	b, err2 := time.Parse(time.RFC3339Nano, to)
	if err1 != nil || err2 != nil || b.Before(a) {
		return 0
	}
	return float64(b.Sub(a).Milliseconds()) / 1000
}

func (s *RunSnapshot) finish(at string) {
	s.CompletedAt = at
	start, err1 := time.Parse(time.RFC3339Nano, s.StartedAt)
	end, err2 := time.Parse(time.RFC3339Nano, at)
	if err1 == nil && err2 == nil && !end.Before(start) {
		s.TotalDurationMs = end.Sub(start).Milliseconds()
	}
}

func applyStep(s *RunSnapshot, index *stepIndex, r *RunEventRecord) {
	i, ok := index.find(r.StepID)
	if !ok {
		i = len(s.Steps)
		index.add(r.StepID, i)
		s.Steps = append(s.Steps, StepSnapshot{StepID: r.StepID, Status: StepStatusPending, LogicalAttemptID: r.LogicalAttemptID, Artifacts: []ArtifactRef{}})
	}
	st := &s.Steps[i]
	if r.LogicalAttemptID > st.LogicalAttemptID {
		*st = StepSnapshot{StepID: r.StepID, Status: StepStatusPending, LogicalAttemptID: r.LogicalAttemptID, Artifacts: []ArtifactRef{}}
	}
	st.EngineAttemptID = r.EngineAttemptID
	st.Idle, st.IdleReason = false, ""
	switch r.EventType {
	case StepStarted:
		st.Status = StepStatusRunning
		st.StartedAt = r.PersistedAt
		st.RetryRequested = false
		st.TryStartedAt = ""
	case StepCompleted:
		st.Status = StepStatusSuccess
		st.CompletedAt = r.PersistedAt
		var p StepCompletedPayload
		if decodeLenient(r.Payload, &p); len(p.Artifacts) > 0 {
			st.Artifacts = p.Artifacts
		}
	case StepFailed:
		var p StepFailedPayload
		decodeLenient(r.Payload, &p)
		st.Status = StepStatusFailed
		st.CompletedAt = r.PersistedAt
		st.Error = p.Error
		st.Artifacts = append(slices.Clip(st.Artifacts), p.Artifacts...)
		st.Held = p.OnStepFailure == OnStepFailurePause
		s.FailedSteps++
	case StepSkipped:
		st.Status = StepStatusSkipped
		st.CompletedAt = r.PersistedAt
		var p StepSkippedPayload
		decodeLenient(r.Payload, &p)
		st.SkipReason = p.Reason
	}
}
