package adapter

import (
	"context"
	"errors"

	"github.com/google/uuid"
)

// KeyPurger purges keys of a KV bucket so that no delete marker stays
// (natsstore.KeyPurger, on the retention user's connection).
type KeyPurger interface {
	// PurgeKeys purges keys from bucket; keys that are absent, or could
	// not be KV keys, are skipped.
	PurgeKeys(ctx context.Context, bucket string, keys ...string) error
}

// RunIndexForgetter drops a run's entries from the run index when the run
// leaves hot state (retention): its run entry, its request entry (if it
// still maps to the run) and its active-index entry, markers included.
// Plan entries are shared by every run of a plan and stay.
//
// Once forgotten, a run request with the same runRequestId starts a new
// run: starting is idempotent while the run is in hot state.
type RunIndexForgetter struct {
	runs   *Runs
	purger KeyPurger
}

// NewRunIndexForgetter returns the run index's forgetter: it reads through
// runs and purges through purger.
func NewRunIndexForgetter(runs *Runs, purger KeyPurger) *RunIndexForgetter {
	return &RunIndexForgetter{runs: runs, purger: purger}
}

// ForgetRun drops runID's entries. It is idempotent: a run the index does
// not know (or a runId that is not one of the index's) is nothing to do.
// The request entry goes first, and only while it names runID (a later
// run of the same request keeps its own), then the active entry, then the
// run entry: a crash in between leaves the run entry, from which a retry
// finds the request entry again. The run entry is deleted through the
// bucket before it is purged, so that every replica's cache of the index
// (which watches it) drops the run.
func (f *RunIndexForgetter) ForgetRun(ctx context.Context, runID string) error {
	if _, err := uuid.Parse(runID); err != nil || len(runID) != 36 {
		return nil
	}
	bucket := f.runs.kv.Bucket()
	rec, _, err := f.runs.get(ctx, runID)
	switch {
	case errors.Is(err, ErrNotFound):
		rec = nil
	case err != nil:
		return err
	}
	if rec != nil && rec.RequestKey != "" && !rec.IsAdopted() { // an adopted run has no request entry
		var rr reqRecord
		_, err := f.runs.getJSON(ctx, keyReq+rec.RequestKey, &rr)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return err
		case rr.RunID == runID:
			if err := f.purger.PurgeKeys(ctx, bucket, keyReq+rec.RequestKey); err != nil {
				return err
			}
		}
	}
	if rec != nil {
		if err := f.runs.kv.Delete(ctx, keyRun+runID); err != nil {
			return registryUnavailable("delete "+keyRun+runID, err)
		}
	}
	return f.purger.PurgeKeys(ctx, bucket, keyActive+runID, keyRun+runID)
}
