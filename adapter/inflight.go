package adapter

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// InFlightTasks returns the tasks of the active runs that Conductor shows
// IN_PROGRESS and polled by workerID. A sidecar calls it as it starts, with
// its own (stable) worker id: none of its steps can be running yet, so
// every such task was left behind by its previous process (kill -9, OOM)
// and can be handed back at once instead of waiting for Conductor's
// response timeout. Worker ids must therefore be unique per live sidecar.
func (r *Runs) InFlightTasks(ctx context.Context, workerID string) ([]model.Task, error) {
	return r.InProgressTasks(ctx, func(t *model.Task) bool { return t.WorkerId == workerID })
}

// InProgressTasks returns the tasks of the active runs that Conductor
// shows IN_PROGRESS and match keeps.
func (r *Runs) InProgressTasks(ctx context.Context, keep func(*model.Task) bool) ([]model.Task, error) {
	recs, err := r.activeRecords(ctx)
	if recs == nil && err != nil {
		return nil, err
	}
	var out []model.Task
	errs := []error{err}
	for _, rec := range recs {
		if rec.WorkflowID == "" {
			continue
		}
		wf, err := r.conductor.Workflow(ctx, rec.WorkflowID, true)
		if err != nil {
			if !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		for _, t := range wf.Tasks {
			if t.Status == model.InProgressTask && keep(&t) {
				out = append(out, t)
			}
		}
	}
	return out, errors.Join(errs...)
}

// StartsUnderWay returns when the last start lease of a run still
// STARTING expires (zero when none is): by then each such start is
// decided, its workflow adopted or its lease released (Watcher).
func (r *Runs) StartsUnderWay(ctx context.Context) (time.Time, error) {
	recs, err := r.activeRecords(ctx)
	if err != nil {
		return time.Time{}, err
	}
	var until time.Time
	for _, rec := range recs {
		if rec.State == RunStateStarting && rec.LeaseExpiresAt.After(until) {
			until = rec.LeaseExpiresAt
		}
	}
	return until, nil
}

// activeRecords reads the run records of the active runs. A record that
// could not be read is left out and its error joined in the error; nil
// records with an error: the listing failed.
func (r *Runs) activeRecords(ctx context.Context) ([]*Run, error) {
	keys, err := r.listKeys(ctx, keyActive+">")
	if err != nil {
		return nil, err
	}
	recs := make([]*Run, 0, len(keys))
	var errs []error
	for _, k := range keys {
		rec, _, err := r.get(ctx, strings.TrimPrefix(k, keyActive))
		if err != nil {
			if !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		recs = append(recs, rec)
	}
	return recs, errors.Join(errs...)
}

// ActiveRunIDs lists the runs the adapter considers active (started, not
// yet final in Conductor): the runs the drain monitor watches.
func (r *Runs) ActiveRunIDs(ctx context.Context) ([]string, error) {
	keys, err := r.listKeys(ctx, keyActive+">")
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = strings.TrimPrefix(k, keyActive)
	}
	return ids, nil
}
