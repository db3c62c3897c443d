package taskworkers

import "github.com/conductor-sidecar/sidecar/statestore"

// verdict is what the gate decides for a polled task.
type verdict int

const (
	// start: record StepStarted and run the step.
	start verdict = iota
	// waitPaused: the run is paused; hand the task back.
	waitPaused
	// waitNotRunning: the run is not RUNNING yet; hand the task back soon.
	waitNotRunning
	// refuseEnded: the run is cancelled or finished; fail the task for good.
	refuseEnded
	// waitCancel: the run's cancel is requested and the run not ended yet:
	// hand the task back, unstarted, for the cancel's terminate to end it
	// (failing it would fail the workflow in Conductor instead).
	waitCancel
	// refuseForeign: the task's workflow is not the run's.
	refuseForeign
	// reportCompleted: the log already has the attempt's StepCompleted
	// (recorded before a crash, not reported): report, do not run again.
	reportCompleted
	// reportFailed: the log already has the attempt's final StepFailed.
	reportFailed
	// holdFailed: the attempt failed and is held for RETRY_STEP (a crash
	// came between StepFailed and the run's pause): pause, hold.
	holdFailed
)

// decision is the gate's answer: the verdict and, for start, the attempt
// the step runs as.
type decision struct {
	verdict verdict
	// engine and logical are the attempt ids; an operator's RETRY_STEP
	// raises logical past Conductor's retryCount and makes the try the
	// attempt's only one (operatorAttempt).
	engine, logical int64
	operatorAttempt bool
	// step is the step's derived state (nil: the log does not name it).
	step *statestore.StepSnapshot
	// started is the run as this worker's StepStarted left it (nil: the
	// start was not recorded by this worker's own append).
	started *startedRun
}

// gate is the pause gate and the producer guard (Layer 1) of StepStarted,
// as a pure function of the run's derived state: which verdict a task of
// workflowID for stepID, attempt (engine, logical) gets. A StepStarted it
// allows is then appended conditioned on snap.LastEventSeq, so that no
// pause can slip in between this decision and the write (the fence).
func gate(snap *statestore.RunSnapshot, workflowID, stepID string, engine, logical int64) decision {
	d := decision{verdict: start, engine: engine, logical: logical}
	if id := statestore.ConductorWorkflowID(snap.EngineRunRef); id != "" && id != workflowID {
		d.verdict = refuseForeign
		return d
	}
	switch {
	case statestore.IsTerminalRunStatus(snap.Status):
		d.verdict = refuseEnded
		return d
	case snap.CancelRequested:
		d.verdict = waitCancel
		return d
	case snap.Status == statestore.RunStatusPaused:
		if st := snap.Step(stepID); st != nil && st.Status == statestore.StepStatusRunning && !st.Idle &&
			st.LogicalAttemptID == logical && st.EngineAttemptID == engine {
			// The try in flight, polled again: its worker reported it
			// IN_PROGRESS with a callback (a long job it checks on) and
			// polls it back. A pause stops new tasks, not this one: the
			// drain waits for it, so it goes on (nothing is recorded).
			d.step = st
			return d
		}
		d.verdict = waitPaused
		return d
	case snap.Status != statestore.RunStatusRunning:
		d.verdict = waitNotRunning
		return d
	}
	st := snap.Step(stepID)
	d.step = st
	if st == nil {
		return d
	}
	if st.LogicalAttemptID > logical {
		// An operator's RETRY_STEP opened a later logical attempt than
		// Conductor's retryCount gives: the held task runs as that
		// attempt, one try (no engine retry is left to count it by).
		d.logical, d.engine, d.operatorAttempt = st.LogicalAttemptID, 1, true
	}
	if st.LogicalAttemptID != d.logical {
		return d
	}
	switch {
	case st.Status == statestore.StepStatusSuccess:
		d.verdict = reportCompleted
	case st.Status == statestore.StepStatusFailed && st.Held:
		d.verdict = holdFailed
	case st.Status == statestore.StepStatusFailed:
		d.verdict = reportFailed
	}
	return d
}
