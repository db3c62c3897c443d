package adapter

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// WorkflowRemover removes a finished run's workflow from Conductor when
// the run leaves the sidecar's hot state: a retention Forgetter. It reads
// the workflowId from the run's snapshot (its RunStarted's engineRunRef),
// so it must run while the run is still in the log, as Forgetters do
// (before its records leave: a crash after the workflow's removal leaves
// the run in the log, and the next pass removes it again, finding the
// workflow gone).
type WorkflowRemover struct {
	client *Client
	log    SnapshotReader
	logger *zap.Logger
}

// NewWorkflowRemover returns the Forgetter over client and log.
func NewWorkflowRemover(client *Client, log SnapshotReader, logger *zap.Logger) *WorkflowRemover {
	if logger == nil {
		logger = zap.NewNop()
	}
	return &WorkflowRemover{client: client, log: log, logger: logger.Named("conductor-removal")}
}

// ForgetRun removes runID's workflow from Conductor. A run the log does
// not have, a run that never got a workflow, and a workflow Conductor no
// longer knows (removed before) are done: nil. Other failures (Conductor
// down) are returned, and the run stays in hot state until a later pass
// removes its workflow.
func (w *WorkflowRemover) ForgetRun(ctx context.Context, runID string) error {
	snap, err := w.log.ProjectSnapshot(ctx, runID)
	if errors.Is(err, statestore.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read run %q for its workflow: %w", runID, err)
	}
	id := statestore.ConductorWorkflowID(snap.EngineRunRef)
	if id == "" {
		return nil
	}
	err = w.client.RemoveWorkflow(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove workflow %s of run %q from conductor: %w", id, runID, err)
	}
	w.logger.Debug("removed the workflow from conductor", zap.String("runId", runID), zap.String("workflowId", id))
	return nil
}
