package exec

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/taskworkers"
)

// MaxSleep bounds a sleep step's Seconds.
const MaxSleep = 30 * 24 * time.Hour

// noopExecutor succeeds at once (unless ctx is already done).
type noopExecutor struct{}

func (noopExecutor) Execute(ctx context.Context, x taskworkers.Execution) (taskworkers.Result, error) {
	if r, ok := checkOnly(x.Spec, plan.ExecutorNoop); !ok {
		return r, nil
	}
	if ctx.Err() != nil {
		return taskworkers.Result{Err: ctxError(ctx, nil, "noop not run")}, nil
	}
	return taskworkers.Result{}, nil
}

// sleepExecutor waits Seconds, or until ctx is done.
type sleepExecutor struct{}

func (sleepExecutor) Execute(ctx context.Context, x taskworkers.Execution) (taskworkers.Result, error) {
	if r, ok := checkOnly(x.Spec, plan.ExecutorSleep, "seconds"); !ok {
		return r, nil
	}
	sec := x.Spec.Seconds
	if math.IsNaN(sec) || sec < 0 || sec > MaxSleep.Seconds() {
		return specInvalid("sleep seconds must be between 0 and %.0f, got %v", MaxSleep.Seconds(), sec), nil
	}
	d := time.Duration(sec * float64(time.Second))
	start := time.Now()
	if ctx.Err() != nil {
		return taskworkers.Result{Err: ctxError(ctx, nil, "sleep not started")}, nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return taskworkers.Result{Output: map[string]any{"sleptMs": time.Since(start).Milliseconds()}}, nil
	case <-ctx.Done():
		slept := time.Since(start)
		return taskworkers.Result{Output: map[string]any{"sleptMs": slept.Milliseconds()},
			Err: ctxError(ctx, nil, fmt.Sprintf("after %s of %s", slept.Round(time.Millisecond), d))}, nil
	}
}
