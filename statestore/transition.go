package statestore

import (
	"strconv"
	"strings"
)

// RunTransition is one row of the run-level transition table: Event moves a
// run whose status is one of From to To. To equal to the from-status means
// the event changes derived metadata only.
type RunTransition struct {
	Event string
	From  []string
	To    string // "" keeps the current status
}

var nonTerminal = []string{RunStatusPending, RunStatusQueued, RunStatusApproved, RunStatusRunning, RunStatusPaused}

// RunTransitions is the run-level table: Run Events Contract v2.0.1 §5.1,
// RunQueued and RunApproved of Execution Semantics Contract v1.1 §1.2, and
// the sidecar's extension events. An event of the table applied in a status
// outside From is an invalid transition, except where Cancel wins or an older
// pause cycle makes it audit only (see Decide).
var RunTransitions = []RunTransition{
	{RunQueued, []string{RunStatusPending}, RunStatusQueued},
	{RunApproved, []string{RunStatusPending, RunStatusQueued}, RunStatusApproved},
	{RunStarted, []string{RunStatusPending, RunStatusQueued, RunStatusApproved}, RunStatusRunning},
	{RunPaused, []string{RunStatusRunning}, RunStatusPaused},
	{RunResumed, []string{RunStatusPaused}, RunStatusRunning},
	{RunCompleted, []string{RunStatusRunning}, RunStatusCompleted},
	{RunFailed, []string{RunStatusRunning, RunStatusPaused}, RunStatusFailed},
	{RunCancelled, nonTerminal, RunStatusCancelled},
	{RunCancelRequested, nonTerminal, ""},
	{RunDrainCompleted, []string{RunStatusPaused}, ""},
	{RunDrainTimedOut, []string{RunStatusPaused}, ""},
	{RunStepRetryRequested, []string{RunStatusPaused}, ""},
	{RunStepTryEnded, []string{RunStatusRunning, RunStatusPaused}, ""},
	{RunStepTryStarted, []string{RunStatusRunning}, ""},
}

// StepTransitions is the step-level table of Run Events Contract v2.0.1 §5.2,
// applied per (stepId, logicalAttemptId). A step first seen is PENDING.
var StepTransitions = map[string]struct{ From, To string }{
	StepStarted:   {StepStatusPending, StepStatusRunning},
	StepCompleted: {StepStatusRunning, StepStatusSuccess},
	StepFailed:    {StepStatusRunning, StepStatusFailed},
	StepSkipped:   {StepStatusPending, StepStatusSkipped},
}

var runTable = func() map[string]RunTransition {
	m := make(map[string]RunTransition, len(RunTransitions))
	for _, t := range RunTransitions {
		m[t.Event] = t
	}
	return m
}()

// Outcome is how the projector treats one event.
type Outcome int

const (
	// Apply: the event is a valid transition and changes derived state.
	Apply Outcome = iota
	// Ignore: unknown event type; advances the watermark only.
	Ignore
	// Audit: kept in the log, changes nothing and is not an error: a
	// RunCompleted/RunFailed after a cancel request (Cancel wins), an event
	// of an older logical attempt, or a drain event of a drain that already ended.
	Audit
	// Invalid: an invalid transition (Policy A: ignored for state, run
	// marked inconsistent, one alert).
	Invalid
)

// Decision is the result of Decide.
type Decision struct {
	Outcome Outcome
	// Entity is "run" or "step".
	Entity string
	// PriorState is the derived state before the event ("RUNNING", or
	// "SUCCESS" for a step); AttemptedState the state the event asks for.
	PriorState     string
	AttemptedState string
	// ExpectedState names the states the event is allowed from, joined by "|".
	ExpectedState string
	Reason        string
}

// Decide classifies the event (eventType, stepID, logicalAttemptID) against
// the derived state s without changing it. It is the single rule set used by
// the producer guard (Layer 1), the store's optional validation (Layer 2)
// and the projector (Layer 3). s may be nil for a run without events.
func Decide(s *RunSnapshot, eventType, stepID string, logicalAttemptID int64) Decision {
	var step *StepSnapshot
	if s != nil && IsStepEvent(eventType) {
		step = s.Step(stepID)
	}
	return decide(s, step, eventType, logicalAttemptID)
}

// decide is Decide with the event's step already looked up (nil: unseen).
func decide(s *RunSnapshot, step *StepSnapshot, eventType string, logicalAttemptID int64) Decision {
	status := RunStatusPending
	if s != nil {
		status = s.Status
	}
	if st, ok := StepTransitions[eventType]; ok {
		return decideStep(step, status, eventType, logicalAttemptID, st.From, st.To)
	}
	t, ok := runTable[eventType]
	if !ok {
		return Decision{Outcome: Ignore, Entity: "run", PriorState: status, AttemptedState: status}
	}
	to := t.To
	if to == "" {
		to = status
	}
	d := Decision{Entity: "run", PriorState: status, AttemptedState: to, ExpectedState: strings.Join(t.From, "|")}
	cancelled := status == RunStatusCancelled || (s != nil && s.CancelRequested)
	if (eventType == RunCompleted || eventType == RunFailed) && cancelled {
		d.Outcome, d.Reason = Audit, "cancel wins: a cancel was requested before this event"
		return d
	}
	if !contains(t.From, status) {
		d.Outcome, d.Reason = Invalid, eventType+" is not allowed: the run is "+status
		return d
	}
	switch eventType {
	case RunPaused:
		want := int64(1)
		if s != nil && s.Pause != nil {
			want = s.Pause.Cycle + 1
		}
		if logicalAttemptID != want {
			d.Outcome, d.Reason = Invalid, "RunPaused must open pause cycle "+strconv.FormatInt(want, 10)
			return d
		}
	case RunResumed:
		if s.Pause == nil || logicalAttemptID != s.Pause.Cycle {
			d.Outcome, d.Reason = Invalid, "RunResumed must close the current pause cycle"
			return d
		}
	case RunStepRetryRequested:
		if cancelled {
			d.Outcome, d.Reason = Invalid, "a cancel was requested; no step is retried"
			return d
		}
		if want := s.StepRetries + 1; logicalAttemptID != want {
			d.Outcome, d.Reason = Invalid, "RunStepRetryRequested must be retry request "+strconv.FormatInt(want, 10)
			return d
		}
	case RunStepTryEnded, RunStepTryStarted:
		if want := s.StepTryEvents + 1; logicalAttemptID != want {
			d.Outcome, d.Reason = Invalid, eventType+" must be try event "+strconv.FormatInt(want, 10)
			return d
		}
	case RunDrainCompleted, RunDrainTimedOut:
		if s.Pause == nil || logicalAttemptID > s.Pause.Cycle {
			d.Outcome, d.Reason = Invalid, eventType+" names a pause cycle that has not started"
			return d
		}
		if logicalAttemptID < s.Pause.Cycle || s.Pause.DrainEndedAt != "" {
			d.Outcome, d.Reason = Audit, "the drain of this pause cycle already ended"
			return d
		}
	}
	d.Outcome = Apply
	return d
}

func decideStep(st *StepSnapshot, runStatus, eventType string, attempt int64, from, to string) Decision {
	prior := StepStatusPending
	if st != nil {
		switch {
		case attempt < st.LogicalAttemptID:
			return Decision{Outcome: Audit, Entity: "step", PriorState: st.Status, AttemptedState: st.Status,
				Reason: "event of an older logical attempt"}
		case attempt == st.LogicalAttemptID:
			prior = st.Status
		}
	}
	d := Decision{Entity: "step", PriorState: prior, AttemptedState: to, ExpectedState: from}
	if eventType == StepStarted && runStatus != RunStatusRunning && runStatus != RunStatusPaused {
		d.ExpectedState = "run RUNNING|PAUSED"
		d.PriorState = "run " + runStatus
		d.Outcome, d.Reason = Invalid, "a step cannot start in a run that is "+runStatus
		return d
	}
	if prior != from {
		d.Outcome, d.Reason = Invalid, eventType+" is not allowed: the step is "+prior
		return d
	}
	d.Outcome = Apply
	return d
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
