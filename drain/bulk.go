package drain

import (
	"context"
	"time"

	"golang.org/x/sync/errgroup"
)

// BulkEngine is the bulk side of Conductor's workflow API (adapter.Client
// has it): one call acts on many workflows. Each returns the error of
// every workflow id it could not act on, as the single call (Engine)
// would return it; an id missing from the map was acted on.
type BulkEngine interface {
	PauseMany(ctx context.Context, workflowIDs []string) map[string]error
	ResumeMany(ctx context.Context, workflowIDs []string) map[string]error
	TerminateMany(ctx context.Context, workflowIDs []string, reason string) map[string]error
}

// Outcome is one run's result of a bulk action: the state and error the
// single action (Pause, Resume, Cancel) would have returned.
type Outcome struct {
	RunID string
	State *State
	Err   error
}

const (
	// bulkBatch is how many runs a bulk action takes at a time: their
	// log parts, then one bulk Conductor call for their workflows, then
	// the rest of each.
	bulkBatch = 1000
	// bulkWorkers is how many runs of a batch are worked on at once: their
	// appends are in flight together, and the batch waits for every one's
	// acknowledgement before Conductor is called.
	bulkWorkers = 32
)

// PauseMany pauses the runs runIDs as Pause pauses each: every run's
// RunPaused is appended fenced, its drain ended or watched, and the answer
// per run is Pause's. Conductor's workflows are paused with one bulk call
// per batch of runs when the engine has one (BulkEngine), else one call a
// run. The outcomes are in runIDs' order.
func (c *Controller) PauseMany(ctx context.Context, runIDs []string, req PauseRequest) []Outcome {
	return bulk(ctx, c, runIDs,
		func(ctx context.Context, runIDs []string) []logged[*pausing] { return c.pauseLogs(ctx, runIDs, req) },
		func(ctx context.Context, ids []string) map[string]error {
			if b, ok := c.engine.(BulkEngine); ok {
				return b.PauseMany(ctx, ids)
			}
			return eachWorkflow(ctx, ids, c.engine.Pause)
		},
		func(ctx context.Context, p *pausing, err error, took time.Duration) (*State, error) {
			return c.pauseEngine(ctx, p, err, took)
		})
}

// ResumeMany resumes the runs runIDs as Resume resumes each, with
// Conductor's workflows resumed in bulk (PauseMany).
func (c *Controller) ResumeMany(ctx context.Context, runIDs []string, req ResumeRequest) []Outcome {
	return bulk(ctx, c, runIDs,
		func(ctx context.Context, runIDs []string) []logged[*resuming] { return c.resumeLogs(ctx, runIDs, req) },
		func(ctx context.Context, ids []string) map[string]error {
			if b, ok := c.engine.(BulkEngine); ok {
				return b.ResumeMany(ctx, ids)
			}
			return eachWorkflow(ctx, ids, c.engine.Resume)
		},
		func(ctx context.Context, r *resuming, err error, _ time.Duration) (*State, error) {
			return c.resumeEngine(ctx, r, err)
		})
}

// CancelMany cancels the runs runIDs as Cancel cancels each, with
// Conductor's workflows terminated in bulk (PauseMany).
func (c *Controller) CancelMany(ctx context.Context, runIDs []string, reason, requestedBy string) []Outcome {
	return bulk(ctx, c, runIDs,
		func(ctx context.Context, runIDs []string) []logged[*cancelling] {
			return c.cancelLogs(ctx, runIDs, reason, requestedBy)
		},
		func(ctx context.Context, ids []string) map[string]error {
			if b, ok := c.engine.(BulkEngine); ok {
				return b.TerminateMany(ctx, ids, "cancelled: "+reason)
			}
			return eachWorkflow(ctx, ids, func(ctx context.Context, wf string) error {
				return c.engine.Terminate(ctx, wf, "cancelled: "+reason)
			})
		},
		func(ctx context.Context, cl *cancelling, err error, _ time.Duration) (*State, error) {
			return c.cancelEngine(ctx, cl, err)
		})
}

// bulk runs a bulk action over runIDs in batches of bulkBatch: logPart
// for the runs of the batch (a run it answers, with a state or an error,
// is done; else it names the run's workflow), engine once for the
// batch's workflows, then rest for each run with its workflow's error.
func bulk[T any](ctx context.Context, c *Controller, runIDs []string,
	logPart func(context.Context, []string) []logged[T],
	engine func(context.Context, []string) map[string]error,
	rest func(context.Context, T, error, time.Duration) (*State, error)) []Outcome {
	defer c.opts.Calls.begin(runIDs...)() // the Follower waits for these runs' requests (Calls)
	out := make([]Outcome, len(runIDs))
	for from := 0; from < len(runIDs); from += bulkBatch {
		batch := runIDs[from:min(len(runIDs), from+bulkBatch)]
		parts := make([]T, len(batch))
		wfs := make([]string, len(batch))
		pending := make([]bool, len(batch))
		for i, l := range logPart(ctx, batch) {
			o := &out[from+i]
			o.RunID = batch[i]
			if l.st != nil || l.err != nil {
				o.State, o.Err = l.st, l.err
				continue
			}
			parts[i], wfs[i], pending[i] = l.part, l.wf, true
		}
		var ids []string
		for i, p := range pending {
			if p {
				ids = append(ids, wfs[i])
			}
		}
		if len(ids) == 0 {
			continue
		}
		began := c.opts.Now()
		errs := engine(ctx, ids)
		took := c.opts.Now().Sub(began)
		forEach(len(batch), func(i int) {
			if pending[i] {
				o := &out[from+i]
				o.State, o.Err = rest(ctx, parts[i], errs[wfs[i]], took)
			}
		})
	}
	return out
}

// forEach calls f(0..n-1), bulkWorkers at a time, and returns when every
// call has.
func forEach(n int, f func(i int)) {
	var g errgroup.Group
	g.SetLimit(bulkWorkers)
	for i := range n {
		g.Go(func() error { f(i); return nil })
	}
	_ = g.Wait() // f returns no error
}

// eachWorkflow calls one for every workflow id, bulkWorkers at a time: the
// bulk call of an engine without one.
func eachWorkflow(ctx context.Context, ids []string, one func(context.Context, string) error) map[string]error {
	errs := make([]error, len(ids))
	forEach(len(ids), func(i int) { errs[i] = one(ctx, ids[i]) })
	out := map[string]error{}
	for i, err := range errs {
		if err != nil {
			out[ids[i]] = err
		}
	}
	return out
}
