// Package taskworkers runs plan steps for Conductor: a context-aware poll
// loop per task type, the pause gate, the executors, and the step's events.
package taskworkers

import (
	"context"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Execution is one try of one step, as an Executor sees it.
type Execution struct {
	RunID            string
	StepID           string
	LogicalAttemptID int64
	EngineAttemptID  int64
	Spec             plan.ExecutorSpec
	// Secrets are the resolved values of the step's secret references, by
	// SecretRef.Name. Executors must not log them or put them in results.
	Secrets map[string]string
	// Traceparent is the W3C trace context of the step attempt's span
	// ("" when tracing is off): a command gets it as TRACEPARENT, an http
	// request as its traceparent header.
	Traceparent string
}

// Result is the outcome of an Execution. Err nil means success.
type Result struct {
	// Artifacts reference the outputs kept outside the log (stdout, stderr,
	// response bodies), with sha256 and size.
	Artifacts []statestore.ArtifactRef
	// Output is a small JSON-able summary for Conductor's task output
	// (exit code, HTTP status). It must not contain secrets.
	Output map[string]any
	Err    *statestore.StepError
}

// Executor runs one kind of step. Execute must honour ctx: when ctx is done
// (step timeout, run cancelled, shutdown) it stops the work (a command gets
// SIGTERM, then SIGKILL after a grace period) and returns promptly with a
// Result whose Err says why. A returned error means the executor could not
// run at all (e.g. the artifact store is down) and is retryable.
type Executor interface {
	Execute(ctx context.Context, x Execution) (Result, error)
}
