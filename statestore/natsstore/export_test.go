package natsstore

import (
	"context"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// LeaderFetch is leaderFetch over every event of runID, for tests.
func (s *Store) LeaderFetch(ctx context.Context, runID string, limit int) ([]statestore.RunEventRecord, error) {
	return s.leaderFetch(ctx, runID, s.prefix+"."+RunToken(runID)+".>", limit)
}

// SetStep makes r call step after each step of a removal ("pending",
// "purged"); an error stops the removal there, as a crash would.
func (r *Remover) SetStep(step func(string) error) { r.step = step }
