// Package runlist keeps the run list: one row per run of the event log
// (identity, plan, labels, status, substatus, step and drain progress) in
// a JetStream KV bucket, so that runs can be listed and selected by plan,
// scope, status and label selector without reading every run's log.
//
// One replica at a time (the owner of the key "runlist" among the live
// members) follows the log in stream order, folds each run's new events
// into its snapshot (statestore.Reduce, the projector's own fold) and
// writes the rows that changed, then the cursor: the stream sequence the
// rows include. Every replica mirrors the bucket in memory with a KV watch
// and answers queries from there. Cost follows change: the follower reads
// each event once and writes a row per run that changed; the mirrors
// receive each changed row once. A lost bucket is rebuilt from the log
// (the stream denies delete and purge, so it still holds every event).
// docs/operations.md, "Listing runs", has the layout and the numbers.
package runlist

import (
	"time"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Row is a run's entry in the list. It is stored as JSON under
// run.<runToken> (natsstore.RunToken of the runId).
type Row struct {
	RunID         string            `json:"runId"`
	TenantID      string            `json:"tenantId"`
	ProjectID     string            `json:"projectId"`
	EnvironmentID string            `json:"environmentId"`
	PlanID        string            `json:"planId"`
	PlanVersion   string            `json:"planVersion"`
	Labels        map[string]string `json:"labels,omitempty"`
	Status        string            `json:"status"`
	Substatus     string            `json:"substatus,omitempty"`
	// Steps is the number of steps the run has started or settled; Done
	// those SUCCESS, FAILED or SKIPPED; InFlight those running now (a
	// DRAINING run's drain waits for them).
	Steps    int `json:"steps"`
	Done     int `json:"done"`
	InFlight int `json:"inFlight"`
	// PlanSteps is the number of steps of the run's plan (so Done of
	// PlanSteps is the run's progress), 0 when the plan could not be read
	// (Options.Plans); filled in when the run is listed, never stored.
	PlanSteps int `json:"planSteps,omitempty"`
	// InFlightSteps are the steps in flight with the time their try began.
	InFlightSteps []InFlightStep `json:"inFlightSteps,omitempty"`
	// DrainETA estimates when a DRAINING run's drain ends; computed when
	// the run is listed, never stored.
	DrainETA *ETA `json:"drainEta,omitempty"`
	// CreatedAt is the persistedAt of the run's first event; the list is
	// ordered by it, newest first.
	CreatedAt   string `json:"createdAt"`
	CompletedAt string `json:"completedAt,omitempty"`
	// PausedAt, PauseReason and ResumeAt describe the open pause of a
	// PAUSED run.
	PausedAt    string `json:"pausedAt,omitempty"`
	PauseReason string `json:"pauseReason,omitempty"`
	ResumeAt    string `json:"resumeAt,omitempty"`
	// PauseOrigin is where the open pause came from: operator (the API),
	// step_failed (a held failure) or conductor (paused in Conductor).
	PauseOrigin string `json:"pauseOrigin,omitempty"`
	// DrainTimedOut: the open pause's drain ended by PAUSE_DRAIN_TIMEOUT.
	DrainTimedOut bool `json:"drainTimedOut,omitempty"`
	// Drained counts the steps of the open pause that were in flight when
	// it began and have ended since (a drain's progress: Drained of
	// Drained+InFlight); DrainTimeoutSeconds is the pause's drain timeout
	// (0: the sidecar's default).
	Drained             int   `json:"drained,omitempty"`
	DrainTimeoutSeconds int64 `json:"drainTimeoutSeconds,omitempty"`
	// LastEventSeq is the runSeq of the last event the row includes;
	// UpdatedAt that event's persistedAt.
	LastEventSeq int64  `json:"lastEventSeq"`
	UpdatedAt    string `json:"updatedAt"`
}

// rowOf is the row of a run's snapshot; created is the persistedAt of its
// first event and updated that of its last.
func rowOf(s *statestore.RunSnapshot, created, updated string) Row {
	r := Row{
		RunID: s.RunID, TenantID: s.TenantID, ProjectID: s.ProjectID, EnvironmentID: s.EnvironmentID,
		PlanID: s.PlanID, PlanVersion: s.PlanVersion, Labels: s.Labels,
		Status: s.Status, Substatus: s.Substatus, Steps: len(s.Steps),
		CreatedAt: created, CompletedAt: s.CompletedAt, LastEventSeq: s.LastEventSeq, UpdatedAt: updated,
	}
	r.InFlightSteps = InFlightSteps(s)
	r.InFlight = len(r.InFlightSteps)
	for i := range s.Steps {
		switch s.Steps[i].Status {
		case statestore.StepStatusSuccess, statestore.StepStatusFailed, statestore.StepStatusSkipped:
			r.Done++
		}
	}
	if s.Status == statestore.RunStatusPaused && s.Pause != nil {
		r.PausedAt, r.PauseReason, r.ResumeAt, r.DrainTimedOut = s.Pause.PausedAt, s.Pause.Reason, s.Pause.ResumeAt, s.Pause.DrainTimedOut
		r.PauseOrigin = pauseOrigin(s.Pause)
		r.DrainTimeoutSeconds = s.Pause.DrainTimeoutSeconds
		r.Drained = drainedSince(s, s.Pause.PausedAt)
	}
	return r
}

// drainedSince counts the steps of s that started before pausedAt and
// ended after it: those a drain beginning then waited for and saw end.
func drainedSince(s *statestore.RunSnapshot, pausedAt string) int {
	at, err := time.Parse(time.RFC3339Nano, pausedAt)
	if err != nil {
		return 0
	}
	n := 0
	for i := range s.Steps {
		st := &s.Steps[i]
		started, err1 := time.Parse(time.RFC3339Nano, st.StartedAt)
		ended, err2 := time.Parse(time.RFC3339Nano, st.CompletedAt)
		if err1 == nil && err2 == nil && !started.After(at) && !ended.Before(at) {
			n++
		}
	}
	return n
}

// Where a pause came from (Row.PauseOrigin): a bounded set, unlike the
// free-text reason, so it may be a metric label.
const (
	PauseOriginOperator   = "operator"
	PauseOriginStepFailed = "step_failed"
	PauseOriginConductor  = "conductor"
)

var pauseOrigins = []string{PauseOriginOperator, PauseOriginStepFailed, PauseOriginConductor}

func pauseOrigin(p *statestore.PauseState) string {
	switch {
	case p.StepID != "":
		return PauseOriginStepFailed
	case p.RequestedBy == statestore.RequestedByConductor:
		return PauseOriginConductor
	default:
		return PauseOriginOperator
	}
}

// created parses CreatedAt (zero if it does not parse).
func (r *Row) created() time.Time {
	t, _ := time.Parse(time.RFC3339Nano, r.CreatedAt)
	return t
}
