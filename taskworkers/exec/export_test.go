package exec

import (
	"context"
	"fmt"

	"github.com/conductor-sidecar/sidecar/taskworkers"
)

var _ taskworkers.Executor = (*Registry)(nil)

// For returns the executor of an executor type (plan.ExecutorCommand, ...).
func (r *Registry) For(typ string) (taskworkers.Executor, bool) {
	e, ok := r.execs[typ]
	return e, ok
}

// Execute runs x with the executor of x.Spec.Type; an unknown type fails
// the step with EXECUTOR_UNKNOWN.
func (r *Registry) Execute(ctx context.Context, x taskworkers.Execution) (taskworkers.Result, error) {
	e, ok := r.execs[x.Spec.Type]
	if !ok {
		return fail(CodeUnknownExecutor, fmt.Sprintf("no executor of type %q (want command, http, noop or sleep)", x.Spec.Type), false), nil
	}
	return e.Execute(ctx, x)
}
