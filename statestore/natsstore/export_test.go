package natsstore

import (
	"context"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// LeaderFetch is leaderFetch over every event of runID, for tests.
func (s *Store) LeaderFetch(ctx context.Context, runID string, limit int) ([]statestore.RunEventRecord, error) {
	return s.leaderFetch(ctx, runID, s.prefix+"."+RunToken(runID)+".>", limit)
}

// SetStep makes r call step after each step of a removal ("pending";
// "keys" and "purged" of each run; "purged" of the batch, runID empty);
// an error stops the removal there, as a crash would.
func (r *Remover) SetStep(step func(step, runID string) error) { r.step = step }

// RemoveInFlight and RemoveBatchRuns are the Remover's bounds, for tests.
const (
	RemoveInFlight  = removeInFlight
	RemoveBatchRuns = removeBatchRuns
)

// SubjectPrefix is the prefix of the stream's subjects, for tests that
// open a second Store on one stream.
func (s *Store) SubjectPrefix() string { return s.prefix }
