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
// the workflowId from the run's records (its RunStarted's engineRunRef),
// so it must run while the run is still in the log, as Forgetters do
// (before its records leave: a crash after the workflow's removal leaves
// the run in the log, and the next pass removes it again, finding the
// workflow gone). It reduces the records itself rather than read the
// run's snapshot: the store's projection would save the finished run's
// snapshot only for the removal to purge it moments later.
type WorkflowRemover struct {
	client *Client
	log    RecordReader
	logger *zap.Logger
	// slots bound the removals Conductor works on at once
	// (MaxRemovalsInFlight).
	slots chan struct{}
}

// RecordReader reads a run's records; statestore.Store satisfies it.
type RecordReader interface {
	Fetch(ctx context.Context, runID string, afterSeq int64, limit int) ([]statestore.RunEventRecord, error)
}

// MaxRemovalsInFlight is how many workflow removals a WorkflowRemover has
// Conductor work on at once: Conductor's SQLite store holds two connections
// of its pool for one removal (the removal reads the workflow on a second
// one), so a pool full of removals waiting for their second connection
// never completes any (each fails after the pool's 30 s wait); the
// connections beyond twice this many stay free for the workers' polls and
// updates.
const MaxRemovalsInFlight = 4

// workflowRefPage is how many records ForgetRun reads at a time until it
// has the run's engineRunRef (its RunStarted, among the first records).
const workflowRefPage = 16

// NewWorkflowRemover returns the Forgetter over client and log.
func NewWorkflowRemover(client *Client, log RecordReader, logger *zap.Logger) *WorkflowRemover {
	if logger == nil {
		logger = zap.NewNop()
	}
	return &WorkflowRemover{client: client, log: log, logger: logger.Named("conductor-removal"), slots: make(chan struct{}, MaxRemovalsInFlight)}
}

// ForgetRun removes runID's workflow from Conductor. A run the log does
// not have, a run that never got a workflow, and a workflow Conductor no
// longer knows (removed before) are done: nil. Other failures (Conductor
// down) are returned, and the run stays in hot state until a later pass
// removes its workflow.
func (w *WorkflowRemover) ForgetRun(ctx context.Context, runID string) error {
	ref, err := w.engineRunRef(ctx, runID)
	if err != nil {
		return fmt.Errorf("read run %q for its workflow: %w", runID, err)
	}
	id := statestore.ConductorWorkflowID(ref)
	if id == "" {
		return nil
	}
	select {
	case w.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("remove workflow %s of run %q from conductor: %w", id, runID, ctx.Err())
	}
	err = w.client.RemoveWorkflow(ctx, id)
	<-w.slots
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove workflow %s of run %q from conductor: %w", id, runID, err)
	}
	w.logger.Debug("removed the workflow from conductor", zap.String("runId", runID), zap.String("workflowId", id))
	return nil
}

// engineRunRef reduces runID's records, a page at a time, until they give
// its engineRunRef; "" when they have none (or the log has no record).
func (w *WorkflowRemover) engineRunRef(ctx context.Context, runID string) (string, error) {
	var snap *statestore.RunSnapshot
	var after int64
	for {
		recs, err := w.log.Fetch(ctx, runID, after, workflowRefPage)
		if err != nil {
			return "", err
		}
		snap, _ = statestore.Reduce(snap, recs)
		if snap != nil && snap.EngineRunRef != "" {
			return snap.EngineRunRef, nil
		}
		if len(recs) < workflowRefPage {
			return "", nil
		}
		after = recs[len(recs)-1].RunSeq
	}
}
