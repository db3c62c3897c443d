package plan

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// Conductor task types, one per executor. Each is registered as a TaskDef
// (TaskDefs) and polled by the sidecar's workers; the per-step settings
// ride inline in each workflow task.
const (
	TaskTypeCommand = "sidecar_command"
	TaskTypeHTTP    = "sidecar_http"
	TaskTypeNoop    = "sidecar_noop"
	TaskTypeSleep   = "sidecar_sleep"
)

// TaskTypes lists every task type, in a fixed order.
var TaskTypes = []string{TaskTypeCommand, TaskTypeHTTP, TaskTypeNoop, TaskTypeSleep}

// TaskType returns the Conductor task type of an executor type, or "" for
// an unknown one.
func TaskType(executorType string) string {
	switch executorType {
	case ExecutorCommand:
		return TaskTypeCommand
	case ExecutorHTTP:
		return TaskTypeHTTP
	case ExecutorNoop:
		return TaskTypeNoop
	case ExecutorSleep:
		return TaskTypeSleep
	}
	return ""
}

// ExecutorTypeOf returns the executor type of a Conductor task type, or ""
// when taskType is not one of TaskTypes.
func ExecutorTypeOf(taskType string) string {
	switch taskType {
	case TaskTypeCommand:
		return ExecutorCommand
	case TaskTypeHTTP:
		return ExecutorHTTP
	case TaskTypeNoop:
		return ExecutorNoop
	case TaskTypeSleep:
		return ExecutorSleep
	}
	return ""
}

// Settings of the compiled definitions (docs/plans.md explains each).
const (
	// OwnerEmail is the ownerEmail of every definition; the server requires
	// one and does not use it.
	OwnerEmail = "sidecar@localhost"
	// WorkflowVersion is the version of every compiled workflow def; the
	// plan's own version is part of the workflow name.
	WorkflowVersion = 1
	// ResponseTimeoutGraceSeconds is added to a step's timeout to give its
	// task's responseTimeoutSeconds: time for the worker to stop the step
	// at its timeout, record the outcome and update the task. Conductor's
	// IN_PROGRESS update is not a heartbeat on 3.21.14, so the response
	// timeout must outlast the whole step.
	ResponseTimeoutGraceSeconds = 120
	// CompilerVersion changes when the compiled layout of a plan changes.
	// It is written in the workflow description, not in the content hash.
	CompilerVersion = 1
)

// Workflow input keys, set by the adapter when it starts a run
// (WorkflowInput) and passed to every step task as ${workflow.input.KEY}.
const (
	InputRunID         = "runId"
	InputTenantID      = "tenantId"
	InputProjectID     = "projectId"
	InputEnvironmentID = "environmentId"
	InputPlanID        = "planId"
	InputPlanVersion   = "planVersion"
)

// Task input keys a step task carries besides the workflow input keys.
const (
	// InputStep is the step's normalized JSON, base64 (standard, padded),
	// so that Conductor's ${...} interpolation never touches it.
	InputStep            = "step"
	InputEngineTries     = "engineTries"
	InputLogicalAttempts = "logicalAttempts"
	InputOnStepFailure   = "onStepFailure"
	// InputSink is false for a step that another step depends on: its
	// completion cannot end the run, so the worker does not ask the run
	// watcher to read the workflow's status. A task without the key
	// (compiled by an earlier version) counts as a sink.
	InputSink = "sink"
)

// WorkflowInputKeys lists the workflow input keys, in a fixed order.
var WorkflowInputKeys = []string{InputRunID, InputTenantID, InputProjectID, InputEnvironmentID, InputPlanID, InputPlanVersion}

// WorkflowInput returns the input of a run's workflow.
func WorkflowInput(runID, tenantID, projectID, environmentID, planID, planVersion string) map[string]any {
	return map[string]any{
		InputRunID: runID, InputTenantID: tenantID, InputProjectID: projectID,
		InputEnvironmentID: environmentID, InputPlanID: planID, InputPlanVersion: planVersion,
	}
}

// Compiled is a plan compiled for Conductor.
type Compiled struct {
	// Plan is the normalized copy of the plan that was compiled.
	Plan *Plan
	// Workflow is the workflow def. Do not register it by encoding it with
	// the SDK's types: their omitempty drops restartable=false and
	// retryDelaySeconds=0, and the server then applies its defaults (true,
	// 60 s). Register WorkflowDefJSON instead.
	Workflow model.WorkflowDef
	// TaskDefs are the task types the plan uses; register TaskDefsJSON,
	// for the reason above.
	TaskDefs []model.TaskDef
	// ContentHash is the lowercase hex SHA-256 of the normalized plan's
	// JSON (ContentHash). It is also in Workflow.Description.
	ContentHash string
	// RefByStep maps each stepId to its task's taskReferenceName.
	RefByStep map[string]string
}

// Compile validates p and compiles it: one SIMPLE task per step, of the
// step's executor's task type, with an inline task definition holding the
// step's retry budget and timeouts; FORK_JOIN/JOIN for parallel parts
// (dag.go tells how). p is not changed. A plan that does not validate gives
// the *ValidationError of Validate.
func Compile(p *Plan) (*Compiled, error) {
	if err := Validate(p); err != nil {
		return nil, err
	}
	n := p.Clone()
	n.Normalize()
	hash, err := ContentHash(n)
	if err != nil {
		return nil, err
	}
	c := &compiler{plan: n, refs: make(map[string]string, len(n.Steps)), dependedOn: map[string]bool{}, optional: map[string]bool{}}
	for _, s := range n.Steps {
		c.refs[s.StepID] = StepRef(s.StepID)
		for _, d := range s.DependsOn {
			c.dependedOn[d] = true
			// A join that lets failures through: Conductor's JOIN
			// tolerates an optional task's failure (and nothing else
			// depends on it, Validate checks).
			c.optional[d] = c.optional[d] || s.Join == JoinAllDone || s.Join == JoinAnySuccess
		}
	}
	index := make(map[string]int, len(n.Steps))
	for i, s := range n.Steps {
		index[s.StepID] = i
	}
	deps := make([][]int, len(n.Steps))
	for i, s := range n.Steps {
		for _, d := range s.DependsOn {
			deps[i] = append(deps[i], index[d])
		}
	}
	tasks, err := c.emit(newDAG(deps).layout())
	if err != nil {
		return nil, err
	}
	out := &Compiled{
		Plan:        n,
		ContentHash: hash,
		RefByStep:   c.refs,
		Workflow: model.WorkflowDef{
			Name:            WorkflowName("", n.PlanID, n.PlanVersion),
			Description:     workflowDescription(hash, n),
			Version:         WorkflowVersion,
			Tasks:           tasks,
			InputParameters: append([]string(nil), WorkflowInputKeys...),
			SchemaVersion:   2,
			Restartable:     false,
			OwnerEmail:      OwnerEmail,
			TimeoutPolicy:   "ALERT_ONLY",
			TimeoutSeconds:  0,
			// Conductor's status listener (workflow_publisher, 3.22+)
			// notifies the sidecar of its runs' pauses, resumes and ends
			// only for definitions that enable it; without a listener it
			// is a no-op.
			WorkflowStatusListenerEnabled: true,
		},
	}
	used := map[string]bool{}
	for _, s := range n.Steps {
		used[TaskType(s.Executor.Type)] = true
	}
	for _, t := range TaskTypes {
		// An external step's type is the outside worker's: its
		// definition rides inline, and none is registered (that would
		// replace the owner's own).
		if used[t] {
			out.TaskDefs = append(out.TaskDefs, TaskDefFor(t))
		}
	}
	return out, nil
}

// WorkflowDefJSON returns the JSON of c.Workflow with every field the
// server must see, including those the SDK's omitempty would drop:
// restartable, and retryDelaySeconds in every inline task definition. PUT
// it in a list ("[" + def + "]") to /metadata/workflow, an upsert, after
// checking that no def of the same name has another content hash
// (ContentHashOf).
func (c *Compiled) WorkflowDefJSON() ([]byte, error) {
	return exactJSON(c.Workflow, func(m map[string]any) {
		m["restartable"] = c.Workflow.Restartable
	})
}

// TaskDefsJSON returns the JSON list of c.TaskDefs with retryDelaySeconds
// always present, for POST /metadata/taskdefs (an upsert).
func (c *Compiled) TaskDefsJSON() ([]byte, error) {
	return exactJSON(c.TaskDefs, nil)
}

// exactJSON encodes v, applies top to the top-level object (if any), and
// sets retryDelaySeconds to 0 in every task definition that lacks it (an
// inline "taskDefinition", or a TaskDef in a list).
func exactJSON(v any, top func(map[string]any)) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode definitions: %w", err)
	}
	var tree any
	if err := json.Unmarshal(b, &tree); err != nil {
		return nil, fmt.Errorf("encode definitions: %w", err)
	}
	if m, ok := tree.(map[string]any); ok && top != nil {
		top(m)
	}
	if list, ok := tree.([]any); ok {
		for _, e := range list {
			if m, ok := e.(map[string]any); ok {
				setDefault(m, "retryDelaySeconds", 0)
			}
		}
	}
	var walk func(any)
	walk = func(x any) {
		switch y := x.(type) {
		case map[string]any:
			if td, ok := y["taskDefinition"].(map[string]any); ok {
				setDefault(td, "retryDelaySeconds", 0)
			}
			for _, e := range y {
				walk(e)
			}
		case []any:
			for _, e := range y {
				walk(e)
			}
		}
	}
	walk(tree)
	return json.Marshal(tree)
}

func setDefault(m map[string]any, key string, v any) {
	if _, ok := m[key]; !ok {
		m[key] = v
	}
}

// ContentHash returns the lowercase hex SHA-256 of the JSON of p after
// Normalize (p itself is not changed). Two plans with the same hash are the
// same plan; a second plan with the same planId and planVersion but another
// hash is a conflict.
func ContentHash(p *Plan) (string, error) {
	n := p.Clone()
	n.Normalize()
	b, err := json.Marshal(n)
	if err != nil {
		return "", fmt.Errorf("plan content hash: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// descriptionPrefix starts every compiled workflow's description, followed
// by the 64 hex digits of the content hash.
const descriptionPrefix = "sidecar plan sha256:"

func workflowDescription(hash string, p *Plan) string {
	return fmt.Sprintf("%s%s compiler=%d planId=%s planVersion=%s", descriptionPrefix, hash, CompilerVersion,
		strconv.Quote(p.PlanID), strconv.Quote(p.PlanVersion))
}

// ContentHashOf returns the content hash written in a compiled workflow
// def's description, as read back from Conductor (the description survives
// registration unchanged on 3.21.14), and false when def was not compiled
// by this package.
func ContentHashOf(def *model.WorkflowDef) (string, bool) {
	if def == nil || !strings.HasPrefix(def.Description, descriptionPrefix) {
		return "", false
	}
	h := def.Description[len(descriptionPrefix):]
	if len(h) < 64 {
		return "", false
	}
	h = h[:64]
	if _, err := hex.DecodeString(h); err != nil || strings.ToLower(h) != h {
		return "", false
	}
	return h, true
}

// TaskDefs returns the TaskDef of every task type.
func TaskDefs() []model.TaskDef {
	defs := make([]model.TaskDef, 0, len(TaskTypes))
	for _, t := range TaskTypes {
		defs = append(defs, TaskDefFor(t))
	}
	return defs
}

// TaskDefFor returns the registered TaskDef of a task type. Its settings
// apply only to a task without an inline definition, which compiled
// workflows never have: no retry, no timeout, the default step timeout
// plus the grace as response timeout.
func TaskDefFor(taskType string) model.TaskDef {
	return model.TaskDef{
		Name:                   taskType,
		Description:            fmt.Sprintf("sidecar %s steps; each workflow task carries its step's settings inline", ExecutorTypeOf(taskType)),
		RetryCount:             0,
		TimeoutSeconds:         0,
		TimeoutPolicy:          "RETRY",
		RetryLogic:             "FIXED",
		ResponseTimeoutSeconds: DefaultTimeoutSeconds + ResponseTimeoutGraceSeconds,
		OwnerEmail:             OwnerEmail,
		InputKeys:              append(append([]string(nil), WorkflowInputKeys...), InputStep, InputEngineTries, InputLogicalAttempts, InputOnStepFailure),
	}
}

// WorkflowName returns the workflow def name of a tenant's plan version:
// "sidecar_<tenantId>_<planId>_<planVersion>_<h>", each of the three
// parts kept to [A-Za-z0-9-] (anything else becomes '_') and to 40 bytes,
// and h the first 16 hex digits of SHA-256(tenantId "|" planId "|"
// planVersion), which keeps apart what the first parts confuse (no part
// may hold '|'). Plan ids are each tenant's: two tenants' plans under the
// same planId and planVersion are two definitions. With no tenant
// (tenantID "") it is the name a plan version had before plan ids were
// each tenant's, "sidecar_<planId>_<planVersion>_<h>" with h the first 8
// hex digits of SHA-256(planId "|" planVersion): Compile names a plan so,
// and runs started then keep that definition. Conductor accepts either
// name in URLs and definitions as is.
func WorkflowName(tenantID, planID, planVersion string) string {
	if tenantID == "" {
		sum := sha256.Sum256([]byte(planID + "|" + planVersion))
		return "sidecar_" + sanitizeName(planID) + "_" + sanitizeName(planVersion) + "_" + hex.EncodeToString(sum[:4])
	}
	sum := sha256.Sum256([]byte(tenantID + "|" + planID + "|" + planVersion))
	return "sidecar_" + sanitizeName(tenantID) + "_" + sanitizeName(planID) + "_" + sanitizeName(planVersion) + "_" + hex.EncodeToString(sum[:8])
}

// Named returns a copy of c whose workflow definition is called name
// (WorkflowName of the tenant that runs it); c is not changed.
func (c *Compiled) Named(name string) *Compiled {
	cp := *c
	cp.Workflow.Name = name
	return &cp
}

func sanitizeName(s string) string {
	const limit = 40
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < limit; i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// stepRefPrefix starts every step's taskReferenceName. Fork and join
// tasks are named fork_N and join_N, which no step reference can be.
const stepRefPrefix = "s_"

// StepRef returns the taskReferenceName of a step: "s_" then the stepId
// with every byte other than [A-Za-z0-9-] written as '_' and two uppercase
// hex digits ("deploy.eu 1" -> "s_deploy_2Eeu_201"). The mapping is
// injective and StepIDFromRef reverses it.
func StepRef(stepID string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(stepRefPrefix) + len(stepID))
	b.WriteString(stepRefPrefix)
	for i := 0; i < len(stepID); i++ {
		c := stepID[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('_')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

// StepIDFromRef returns the stepId of a step's taskReferenceName, and false
// when ref is not one StepRef makes.
func StepIDFromRef(ref string) (string, bool) {
	if !strings.HasPrefix(ref, stepRefPrefix) {
		return "", false
	}
	r := ref[len(stepRefPrefix):]
	b := make([]byte, 0, len(r))
	for i := 0; i < len(r); i++ {
		c := r[i]
		switch {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-':
			b = append(b, c)
		case c == '_' && i+2 < len(r) && isUpperHex(r[i+1]) && isUpperHex(r[i+2]):
			v, _ := strconv.ParseUint(r[i+1:i+3], 16, 8)
			if isRefByte(byte(v)) {
				return "", false // StepRef writes this byte as itself
			}
			b = append(b, byte(v))
			i += 2
		default:
			return "", false
		}
	}
	if len(b) == 0 {
		return "", false
	}
	return string(b), true
}

func isRefByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-'
}

func isUpperHex(c byte) bool { return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' }

// compiler turns a layout into workflow tasks.
type compiler struct {
	plan       *Plan
	refs       map[string]string
	dependedOn map[string]bool
	optional   map[string]bool
	forks      int
}

func (c *compiler) emit(b *block) ([]model.WorkflowTask, error) {
	switch {
	case b.series != nil:
		var out []model.WorkflowTask
		for _, x := range b.series {
			ts, err := c.emit(x)
			if err != nil {
				return nil, err
			}
			out = append(out, ts...)
		}
		return out, nil
	case b.parallel != nil:
		c.forks++
		n := c.forks
		fork := model.WorkflowTask{
			Name:              fmt.Sprintf("fork_%d", n),
			TaskReferenceName: fmt.Sprintf("fork_%d", n),
			Type_:             "FORK_JOIN",
		}
		join := model.WorkflowTask{
			Name:              fmt.Sprintf("join_%d", n),
			TaskReferenceName: fmt.Sprintf("join_%d", n),
			Type_:             "JOIN",
		}
		for i, x := range b.parallel {
			ts, err := c.emit(x)
			if err != nil {
				return nil, err
			}
			if last := ts[len(ts)-1]; last.TaskDefinition != nil && last.TaskDefinition.RetryCount > 0 {
				// The JOIN waits on a NOOP after a step Conductor may
				// retry, not on the step: a JOIN evaluated between the
				// step's FAILED and the decision that schedules its
				// retry fails the workflow (Conductor 3.32's system task
				// worker evaluates JOINs without the workflow's lock;
				// docs/conductor.md, "A retried task of a fork branch"). The NOOP is
				// scheduled, and completed at once, only once the step
				// ended for good.
				ts = append(ts, model.WorkflowTask{
					Name:              "noop",
					TaskReferenceName: fmt.Sprintf("join_%d_branch_%d", n, i+1),
					Type_:             "NOOP",
				})
			}
			fork.ForkTasks = append(fork.ForkTasks, ts)
			join.JoinOn = append(join.JoinOn, ts[len(ts)-1].TaskReferenceName)
		}
		return []model.WorkflowTask{fork, join}, nil
	}
	t, err := c.stepTask(&c.plan.Steps[b.step])
	if err != nil {
		return nil, err
	}
	return []model.WorkflowTask{t}, nil
}

func (c *compiler) stepTask(s *Step) (model.WorkflowTask, error) {
	stepJSON, err := json.Marshal(s)
	if err != nil {
		return model.WorkflowTask{}, fmt.Errorf("compile step %q: %w", s.StepID, err)
	}
	in := make(map[string]any, len(WorkflowInputKeys)+5)
	for _, k := range WorkflowInputKeys {
		in[k] = "${workflow.input." + k + "}"
	}
	in[InputStep] = base64.StdEncoding.EncodeToString(stepJSON)
	in[InputEngineTries] = s.Retries.EngineTries
	in[InputLogicalAttempts] = s.Retries.LogicalAttempts
	in[InputOnStepFailure] = c.plan.OnStepFailure
	in[InputSink] = !c.dependedOn[s.StepID]
	tt := TaskType(s.Executor.Type)
	responseTimeout := s.TimeoutSeconds + ResponseTimeoutGraceSeconds
	if s.Executor.Type == ExecutorExternal {
		// An outside worker: its own type, its own input, and no grace:
		// the step's timeout is the time Conductor gives the worker to
		// answer, so a worker that died is seen after it.
		tt = s.Executor.TaskType
		for k, v := range s.Executor.Input {
			in[k] = v
		}
		responseTimeout = s.TimeoutSeconds
	}
	return model.WorkflowTask{
		Name:              tt,
		TaskReferenceName: c.refs[s.StepID],
		Description:       "step " + strconv.Quote(s.StepID),
		Type_:             "SIMPLE",
		Optional:          c.optional[s.StepID],
		InputParameters:   in,
		TaskDefinition: &model.TaskDef{
			Name:                   tt,
			RetryCount:             int32(s.Retries.TotalTries() - 1),
			RetryLogic:             "FIXED",
			RetryDelaySeconds:      int32(s.Retries.DelaySeconds),
			TimeoutSeconds:         0,
			TimeoutPolicy:          "RETRY",
			ResponseTimeoutSeconds: responseTimeout,
			OwnerEmail:             OwnerEmail,
		},
	}, nil
}
