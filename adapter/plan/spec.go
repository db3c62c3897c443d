// Package plan is the sidecar's plan format: the steps of a run, their
// executors, dependencies, timeouts, retry policy and secret references. It
// validates plans with located errors and compiles them to Conductor
// workflow and task definitions.
package plan

// Executor types.
const (
	ExecutorCommand = "command"
	ExecutorHTTP    = "http"
	ExecutorNoop    = "noop"
	ExecutorSleep   = "sleep"
	// ExecutorExternal is a step an outside worker executes: a Conductor
	// SIMPLE task of the step's taskType, polled through the task proxy
	// (docs/workers.md, "Bring your own workers"). The sidecar runs no
	// code for it; it gates and records it.
	ExecutorExternal = "external"
)

// Failure policies (Plan.OnStepFailure).
const (
	// OnFailureFail fails the run when a step fails for good (the default).
	OnFailureFail = "fail"
	// OnFailurePause pauses the run instead (RunPaused, reason stepFailed) and
	// holds the step's Conductor task until an operator retries the step.
	OnFailurePause = "pause"
)

// Plan is a run's plan, as submitted in JSON (or YAML with the same field
// names).
type Plan struct {
	PlanID        string `json:"planId"`
	PlanVersion   string `json:"planVersion"`
	Description   string `json:"description,omitempty"`
	OnStepFailure string `json:"onStepFailure,omitempty"`
	Steps         []Step `json:"steps"`
}

// Step is one unit of work of a plan.
type Step struct {
	StepID    string       `json:"stepId"`
	Executor  ExecutorSpec `json:"executor"`
	DependsOn []string     `json:"dependsOn,omitempty"`
	// TimeoutSeconds bounds one execution of the step (one engine try).
	TimeoutSeconds int64       `json:"timeoutSeconds,omitempty"`
	Retries        RetryPolicy `json:"retries,omitempty"`
	Secrets        []SecretRef `json:"secrets,omitempty"`
	// Join is the gate of a step with two or more dependencies (the join
	// policies of the Core Events Specification v1.0): JoinAllSuccess (the
	// default), JoinAllDone or JoinAnySuccess. docs/plans.md, "Joins".
	Join string `json:"join,omitempty"`
}

// Join policies (Step.Join). Conductor's JOIN waits until every joined
// branch has ended, so each policy is decided then.
const (
	// JoinAllSuccess: the step runs when every dependency succeeded; a
	// failed dependency fails the run (Conductor's JOIN as it is).
	JoinAllSuccess = "all_success"
	// JoinAllDone: the step runs once every dependency ended, succeeded
	// or failed (the dependencies are optional tasks in Conductor).
	JoinAllDone = "all_done"
	// JoinAnySuccess: as JoinAllDone, and the step fails with
	// JOIN_NOT_PASSABLE unless at least one dependency succeeded.
	JoinAnySuccess = "any_success"
)

// RetryPolicy is the step's retry budget: EngineTries tries of each of
// LogicalAttempts logical attempts (docs/plans.md, "One step, one task").
// Zero values mean 1.
type RetryPolicy struct {
	EngineTries     int `json:"engineTries,omitempty"`
	LogicalAttempts int `json:"logicalAttempts,omitempty"`
	// DelaySeconds is Conductor's delay between tries.
	DelaySeconds int `json:"delaySeconds,omitempty"`
}

// SecretRef names a secret by reference; its value is resolved by the
// worker right before execution and never written to events or logs.
type SecretRef struct {
	// Name is how the executor sees the secret: an environment variable
	// of a command, or ${secret:Name} in an http executor's url, headers
	// and body.
	Name string `json:"name"`
	// Ref locates the value: "env:VAR" (the worker's environment) or
	// "file:/path" (a file's contents, a trailing newline removed).
	Ref string `json:"ref"`
}

// ExecutorSpec says how a step runs. Type selects the executor; only that
// executor's fields may be set.
type ExecutorSpec struct {
	Type string `json:"type"`

	// command: Argv[0] is run with Argv[1:] (no shell), with Env added to
	// the worker's environment, in WorkingDir.
	Argv       []string          `json:"argv,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	WorkingDir string            `json:"workingDir,omitempty"`

	// http: a request; a non-2xx answer fails the step, retryable when its
	// status is in RetryableStatus (default 408, 429, 500, 502, 503, 504).
	Method          string            `json:"method,omitempty"`
	URL             string            `json:"url,omitempty"`
	Headers         map[string]string `json:"headers,omitempty"`
	Body            string            `json:"body,omitempty"`
	RetryableStatus []int             `json:"retryableStatus,omitempty"`

	// sleep: waits Seconds, then succeeds.
	Seconds float64 `json:"seconds,omitempty"`

	// external: TaskType is the Conductor task type the outside worker
	// polls; Input is added to the task's input (keys must not be one of
	// the sidecar's own task input keys).
	TaskType string            `json:"taskType,omitempty"`
	Input    map[string]string `json:"input,omitempty"`
}
