package plan

// Limits of the plan format. Validate refuses plans beyond them; docs/plans.md
// lists them too.
const (
	// MaxPlanBytes bounds a plan document accepted by Parse.
	MaxPlanBytes = 1 << 20
	// MaxSteps bounds the steps of one plan. Every step becomes a Conductor
	// task of one workflow, which Conductor's decider walks on every
	// evaluation.
	MaxSteps = 500
	// MaxStepBytes bounds one step's JSON encoding, which travels in the
	// Conductor task's input (Conductor moves inputs over 3 MB to external
	// storage, which this server has not).
	MaxStepBytes = 64 << 10
	// MaxDescriptionBytes bounds Plan.Description.
	MaxDescriptionBytes = 4096
	// MaxTimeoutSeconds bounds Step.TimeoutSeconds (7 days).
	MaxTimeoutSeconds = 7 * 24 * 3600
	// MaxEngineTries bounds RetryPolicy.EngineTries.
	MaxEngineTries = 10
	// MaxLogicalAttempts bounds RetryPolicy.LogicalAttempts.
	MaxLogicalAttempts = 10
	// MaxRetryDelaySeconds bounds RetryPolicy.DelaySeconds (1 hour).
	MaxRetryDelaySeconds = 3600
	// MaxSecretNameBytes bounds SecretRef.Name.
	MaxSecretNameBytes = 128
	// MaxPathBytes bounds file paths (a file: secret ref, a workingDir).
	MaxPathBytes = 4096
)

// Defaults, applied by Plan.Normalize (and only there).
const (
	// DefaultTimeoutSeconds is a step's timeout when TimeoutSeconds is 0.
	DefaultTimeoutSeconds = 3600
	// DefaultOnStepFailure is the failure policy when OnStepFailure is "".
	DefaultOnStepFailure = OnFailureFail
)

// DefaultRetryableStatus are the HTTP statuses that make a failed http
// step retryable when RetryableStatus is not set.
var DefaultRetryableStatus = []int{408, 429, 500, 502, 503, 504}

// Normalize applies the defaults in place: OnStepFailure "" becomes "fail";
// per step, TimeoutSeconds 0 becomes DefaultTimeoutSeconds, EngineTries and
// LogicalAttempts 0 become 1, and an http executor without RetryableStatus
// gets DefaultRetryableStatus. It changes nothing else and is idempotent;
// a normalized plan validates exactly when the original does.
func (p *Plan) Normalize() {
	if p == nil {
		return
	}
	if p.OnStepFailure == "" {
		p.OnStepFailure = DefaultOnStepFailure
	}
	for i := range p.Steps {
		p.Steps[i].normalize()
	}
}

func (s *Step) normalize() {
	if s.TimeoutSeconds == 0 {
		s.TimeoutSeconds = DefaultTimeoutSeconds
	}
	if s.Retries.EngineTries == 0 {
		s.Retries.EngineTries = 1
	}
	if s.Retries.LogicalAttempts == 0 {
		s.Retries.LogicalAttempts = 1
	}
	if s.Executor.Type == ExecutorHTTP && s.Executor.RetryableStatus == nil {
		s.Executor.RetryableStatus = append([]int(nil), DefaultRetryableStatus...)
	}
}

// Clone returns a deep copy of p.
func (p *Plan) Clone() *Plan {
	if p == nil {
		return nil
	}
	c := *p
	if p.Steps != nil {
		c.Steps = make([]Step, len(p.Steps))
		for i := range p.Steps {
			c.Steps[i] = p.Steps[i].Clone()
		}
	}
	return &c
}

// Clone returns a deep copy of s.
func (s Step) Clone() Step {
	c := s
	c.DependsOn = cloneSlice(s.DependsOn)
	c.Secrets = cloneSlice(s.Secrets)
	c.Executor.Argv = cloneSlice(s.Executor.Argv)
	c.Executor.Env = cloneMap(s.Executor.Env)
	c.Executor.Headers = cloneMap(s.Executor.Headers)
	c.Executor.RetryableStatus = cloneSlice(s.Executor.RetryableStatus)
	c.Executor.Input = cloneMap(s.Executor.Input)
	return c
}

func cloneSlice[T any](s []T) []T {
	if s == nil {
		return nil
	}
	return append(make([]T, 0, len(s)), s...)
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// TotalTries is E*L, the number of Conductor tries of the step (zero values
// count as 1).
func (r RetryPolicy) TotalTries() int {
	return max(r.EngineTries, 1) * max(r.LogicalAttempts, 1)
}
