package adapter

import (
	"context"
	"errors"
	"fmt"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// RequestedByConductor is the requestedBy of the RunPaused and RunResumed
// the watcher records for a pause or resume made in Conductor itself.
const RequestedByConductor = "conductor"

// follow keeps the log's pause state and Conductor's in step for a run
// whose workflow is RUNNING or PAUSED (status). When they differ, the run
// index's ledger (Run.EnginePaused, Run.EngineCycle: the state the sidecar
// last put the workflow in) says who moved:
//
//   - the ledger does not hold the log's state for the log's pause cycle:
//     the sidecar's own pause or resume has not reached Conductor yet (it
//     is in flight, or Conductor did not answer): apply it to Conductor;
//   - it does: Conductor changed after the sidecar's last action, so the
//     workflow was paused or resumed in Conductor: record it in the log
//     (RunPaused with the next cycle, or RunResumed), requestedBy
//     "conductor". A pause made in Conductor drains and times out like any
//     other.
func (w *Watcher) follow(ctx context.Context, rec *Run, status model.WorkflowStatus) error {
	snap, err := w.snaps.ProjectSnapshot(ctx, rec.RunID)
	if errors.Is(err, statestore.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("adapter: watcher: snapshot of run %s: %w", rec.RunID, err)
	}
	if snap.CancelRequested || statestore.IsTerminalRunStatus(snap.Status) ||
		(snap.Status != statestore.RunStatusRunning && snap.Status != statestore.RunStatusPaused) {
		return nil
	}
	var cycle int64
	if snap.Pause != nil {
		cycle = snap.Pause.Cycle
	}
	logPaused := snap.Status == statestore.RunStatusPaused
	enginePaused := status == model.PausedWorkflow
	if logPaused == enginePaused {
		if rec.EngineCycle != cycle || rec.EnginePaused != enginePaused {
			return w.runs.NoteEngine(ctx, rec.RunID, enginePaused, cycle)
		}
		return nil
	}
	if rec.EngineCycle != cycle || rec.EnginePaused != logPaused {
		return w.converge(ctx, rec, logPaused, cycle)
	}
	if enginePaused {
		return w.pausedInConductor(ctx, rec, snap)
	}
	return w.resumedInConductor(ctx, rec, snap)
}

// converge applies the log's pause state to Conductor.
func (w *Watcher) converge(ctx context.Context, rec *Run, paused bool, cycle int64) error {
	c := w.conductor
	var err error
	if paused {
		err = c.Pause(ctx, rec.WorkflowID)
	} else if err = c.Resume(ctx, rec.WorkflowID); errors.Is(err, ErrConflict) {
		err = nil // no longer PAUSED: what we wanted
	}
	if err != nil {
		return err
	}
	w.log.Info("applied the log's pause state to Conductor (the sidecar's own call had not reached it)",
		zap.String("runId", rec.RunID), zap.String("workflowId", rec.WorkflowID), zap.Bool("paused", paused), zap.Int64("cycle", cycle))
	w.opts.Metrics.watcherAction(actionConverged)
	return w.runs.NoteEngine(ctx, rec.RunID, paused, cycle)
}

// pausedInConductor records a pause made in Conductor: RunPaused with the
// next cycle, appended on the runSeq it was decided on (a concurrent
// pause through the sidecar wins, and this one is then seen in step).
func (w *Watcher) pausedInConductor(ctx context.Context, rec *Run, snap *statestore.RunSnapshot) error {
	cycle := int64(1)
	if snap.Pause != nil {
		cycle = snap.Pause.Cycle + 1
	}
	err := w.record(ctx, rec, snap, statestore.RunPaused, cycle, map[string]any{
		"requestedBy": RequestedByConductor, "reason": "paused in Conductor",
		"drainTimeoutSeconds": int64(w.opts.DrainTimeout.Seconds()),
	}, true)
	if errors.Is(err, statestore.ErrRunChanged) {
		return nil // decided again at the next check
	}
	if err != nil {
		return err
	}
	w.log.Warn("the run's workflow was paused in Conductor; recorded the pause, the run drains",
		zap.String("runId", rec.RunID), zap.String("workflowId", rec.WorkflowID), zap.Int64("cycle", cycle))
	w.opts.Metrics.watcherAction(actionConductorPaused)
	if err := w.runs.MarkDraining(ctx, rec.RunID, cycle); err != nil {
		// The drain monitors' full pass finds the drain without its mark.
		w.log.Warn("could not mark the drain in the drain index", zap.String("runId", rec.RunID), zap.Error(err))
	}
	return w.runs.NoteEngine(ctx, rec.RunID, true, cycle)
}

// resumedInConductor records a resume made in Conductor: RunResumed of the
// open cycle.
func (w *Watcher) resumedInConductor(ctx context.Context, rec *Run, snap *statestore.RunSnapshot) error {
	if err := w.record(ctx, rec, snap, statestore.RunResumed, snap.Pause.Cycle, map[string]any{
		"requestedBy": RequestedByConductor, "reason": "resumed in Conductor",
	}, false); err != nil {
		return err
	}
	w.log.Warn("the run's workflow was resumed in Conductor; recorded the resume",
		zap.String("runId", rec.RunID), zap.String("workflowId", rec.WorkflowID), zap.Int64("cycle", snap.Pause.Cycle))
	w.opts.Metrics.watcherAction(actionConductorResumed)
	return w.runs.NoteEngine(ctx, rec.RunID, false, snap.Pause.Cycle)
}

// record appends the run-level event eventType of rec for the given cycle,
// after checking it against snap (Layer 1: never what the projector would
// flag). conditional appends it on snap's last runSeq (an error matching
// statestore.ErrRunChanged when the run moved on).
func (w *Watcher) record(ctx context.Context, rec *Run, snap *statestore.RunSnapshot, eventType string, cycle int64, payload map[string]any, conditional bool) error {
	ev, err := runEventAt(rec, eventType, cycle, payload)
	if err != nil {
		return err
	}
	if err := statestore.CheckTransition(snap, ev); err != nil {
		return err
	}
	if conditional {
		_, err = w.emitter.EmitIf(ctx, ev, snap.LastEventSeq)
	} else {
		_, err = w.emitter.Emit(ctx, ev)
	}
	if err != nil {
		return fmt.Errorf("adapter: watcher: append %s of run %s: %w", eventType, rec.RunID, err)
	}
	return nil
}
