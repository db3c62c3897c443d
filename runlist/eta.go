package runlist

import (
	"cmp"
	"encoding/base64"
	"math"
	"slices"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// MaxDurationSamples is how many of a step's latest durations the list
// keeps per plan version: the history a drain's ETA is estimated from.
const MaxDurationSamples = 100

// minETASamples is the fewest durations an estimate is made from.
const minETASamples = 3

// keyDur is the key prefix of a step's durations: dur.<token of
// tenantId/planId/planVersion/stepId>. Each tenant's runs of a plan
// version make its own history: plan ids are one namespace every tenant
// may name, and another tenant's history would shape (and show through)
// a run's estimate.
const keyDur = "dur."

// StepDurations are the latest durations (seconds, oldest first) of one
// step of one plan version: from its StepStarted to its StepCompleted or
// StepFailed, each end at the engine's time its event carries (a step
// recorded from Conductor's report), else at the log's persistedAt.
type StepDurations struct {
	TenantID    string    `json:"tenantId"`
	PlanID      string    `json:"planId"`
	PlanVersion string    `json:"planVersion"`
	StepID      string    `json:"stepId"`
	Seconds     []float64 `json:"seconds"`
}

func durKey(tenantID, planID, planVersion, stepID string) string {
	return keyDur + base64.RawURLEncoding.EncodeToString([]byte(tenantID+"\x00"+planID+"\x00"+planVersion+"\x00"+stepID))
}

func (d *StepDurations) key() string { return durKey(d.TenantID, d.PlanID, d.PlanVersion, d.StepID) }

// add appends a duration, keeping the latest MaxDurationSamples.
func (d *StepDurations) add(s float64) {
	d.Seconds = append(d.Seconds, s)
	if n := len(d.Seconds) - MaxDurationSamples; n > 0 {
		d.Seconds = slices.Delete(d.Seconds, 0, n)
	}
}

// InFlightStep is a step a drain waits for, with the time its try began
// (in a run list row, Conductor's start time for a step recorded as
// started from Conductor's report).
type InFlightStep struct {
	StepID    string `json:"stepId"`
	StartedAt string `json:"startedAt"`
}

// InFlightSteps are snapshot s's steps in flight, each with the start of
// its latest try (a step that was idle has run since its
// RunStepTryStarted, not since its StepStarted).
func InFlightSteps(s *statestore.RunSnapshot) []InFlightStep {
	var out []InFlightStep
	for i := range s.Steps {
		if st := &s.Steps[i]; st.Status == statestore.StepStatusRunning && !st.Idle {
			out = append(out, InFlightStep{StepID: st.StepID, StartedAt: cmp.Or(st.TryStartedAt, st.StartedAt)})
		}
	}
	return out
}

// ETA estimates when a drain ends: when its last in-flight step ends.
type ETA struct {
	// P50 and P90 are the times by which the drain ends with even odds
	// and with nine chances in ten, by the step durations of earlier runs
	// of the plan version; empty when Unknown.
	P50 string `json:"p50,omitempty"`
	P90 string `json:"p90,omitempty"`
	// Unknown names the in-flight steps without history enough (fewer
	// than 3 durations, or none as long as the step has run already).
	Unknown []string `json:"unknown,omitempty"`
	// Samples is the fewest durations any step's estimate rests on.
	Samples int `json:"samples"`
}

// estimate is the remaining time of a step that has run elapsed seconds,
// at quantiles 0.5 and 0.9, from its past durations: among the durations
// longer than elapsed (the step is known not to be shorter), the
// quantiles of what is left. ok is false without history enough.
func estimate(samples []float64, elapsed float64) (p50, p90 float64, n int, ok bool) {
	var left []float64
	for _, d := range samples {
		if d > elapsed {
			left = append(left, d-elapsed)
		}
	}
	if len(samples) < minETASamples || len(left) == 0 {
		return 0, 0, len(left), false
	}
	slices.Sort(left)
	return quantile(left, 0.5), quantile(left, 0.9), len(left), true
}

// quantile of sorted values, by linear interpolation between ranks.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 1 {
		return sorted[0]
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	if lo >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	return sorted[lo] + (pos-float64(lo))*(sorted[lo+1]-sorted[lo])
}

// eta estimates the end of a drain of a run of tenantID's plan version
// waiting for steps, at now.
func (mr *mirror) eta(tenantID, planID, planVersion string, steps []InFlightStep, now time.Time) *ETA {
	if len(steps) == 0 {
		return nil
	}
	mr.mu.RLock()
	defer mr.mu.RUnlock()
	out := &ETA{Samples: math.MaxInt}
	var rem50, rem90 float64
	for _, s := range steps {
		d := mr.st.durs[durKey(tenantID, planID, planVersion, s.StepID)]
		started, err := time.Parse(time.RFC3339Nano, s.StartedAt)
		var samples []float64
		if d != nil {
			samples = d.Seconds
		}
		p50, p90, n, ok := estimate(samples, now.Sub(started).Seconds())
		if err != nil || !ok {
			out.Unknown = append(out.Unknown, s.StepID)
			continue
		}
		rem50, rem90 = max(rem50, p50), max(rem90, p90)
		out.Samples = min(out.Samples, n)
	}
	if out.Samples == math.MaxInt {
		out.Samples = 0
	}
	if len(out.Unknown) == 0 {
		out.P50 = now.Add(time.Duration(rem50 * float64(time.Second))).UTC().Format(time.RFC3339Nano)
		out.P90 = now.Add(time.Duration(rem90 * float64(time.Second))).UTC().Format(time.RFC3339Nano)
	}
	return out
}

// ETA estimates when the drain of a run of tenantID's planID/planVersion
// that waits for steps ends (nil without steps in flight). Every replica
// can answer: the durations are in the run list, kept by its follower.
func (l *List) ETA(tenantID, planID, planVersion string, steps []InFlightStep, now time.Time) *ETA {
	return l.mirror.eta(tenantID, planID, planVersion, steps, now)
}

// DrainETA estimates when the drain of snap's run ends (nil without steps
// in flight). The steps in flight and when each began are the run list's
// row's when it is as new as snap (a step recorded as started from
// Conductor's report began when Conductor started it, which only the
// follower keeps), else snap's (their StepStarted's persistedAt).
func (l *List) DrainETA(snap *statestore.RunSnapshot, now time.Time) *ETA {
	steps := InFlightSteps(snap)
	l.mirror.mu.RLock()
	if e := l.mirror.st.draining[snap.RunID]; e != nil && e.row.LastEventSeq == snap.LastEventSeq {
		steps = e.row.InFlightSteps
	}
	l.mirror.mu.RUnlock()
	return l.mirror.eta(snap.TenantID, snap.PlanID, snap.PlanVersion, steps, now)
}

// Durations returns the step durations the list holds for a step of
// tenantID's plan version (nil: none yet).
func (l *List) Durations(tenantID, planID, planVersion, stepID string) []float64 {
	return l.mirror.durations(durKey(tenantID, planID, planVersion, stepID))
}

// slowestDrain is the longest time, at quantile q (0.5 or 0.9), until a
// drain ends among the DRAINING runs whose estimate is known; 0 without
// one. Its cost follows the number of open drains.
func (l *List) slowestDrain(q float64) float64 {
	l.mirror.mu.RLock()
	drains := make([]Row, 0, len(l.mirror.st.draining))
	for _, e := range l.mirror.st.draining {
		drains = append(drains, e.row)
	}
	l.mirror.mu.RUnlock()
	now := time.Now()
	longest := 0.0
	for i := range drains {
		eta := l.mirror.eta(drains[i].TenantID, drains[i].PlanID, drains[i].PlanVersion, drains[i].InFlightSteps, now)
		if eta == nil || len(eta.Unknown) > 0 {
			continue
		}
		at := eta.P50
		if q > 0.5 {
			at = eta.P90
		}
		if t, err := time.Parse(time.RFC3339Nano, at); err == nil {
			longest = max(longest, t.Sub(now).Seconds())
		}
	}
	return longest
}
