package plan

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// TaskInput is what a worker needs from a compiled step task's input.
type TaskInput struct {
	RunID, TenantID, ProjectID, EnvironmentID, PlanID, PlanVersion string
	// Step is the step, normalized (defaults applied) and validated on its
	// own (its dependsOn is not checked: the other steps are not here).
	Step Step
	// EngineTries (E) and LogicalAttempts (L) of the step's retry policy,
	// both >= 1; the task's Conductor retryCount budget is E*L-1.
	EngineTries, LogicalAttempts int
	// OnStepFailure is "fail" or "pause".
	OnStepFailure string
	// Sink is false when another step of the plan depends on this one, so
	// that its completion cannot end the run (InputSink; true when the key
	// is missing).
	Sink bool
}

// Attempts derives the step's attempt ids from the Conductor task's
// retryCount r (0 for the first try, +1 per retry, never reset):
// engineAttemptId = r mod E + 1, logicalAttemptId = r div E + 1.
// A negative r counts as 0.
func (in *TaskInput) Attempts(retryCount int) (engineAttemptID, logicalAttemptID int64) {
	e := max(in.EngineTries, 1)
	r := max(retryCount, 0)
	return int64(r%e + 1), int64(r/e + 1)
}

// DecodeTaskInput decodes and checks the input of a compiled step task
// (Conductor's task inputData). It refuses, with a *ValidationError of code
// TASK_INPUT_INVALID, anything Compile would not produce: a missing or
// empty id, an id the event contract refuses, a step that is not strict
// base64 of a valid step's JSON, attempts counts that are not integers in
// range or disagree with the step, an unknown failure policy. Unknown keys
// are ignored, so that a newer compiler may add some. It never panics.
func DecodeTaskInput(input map[string]any) (*TaskInput, error) {
	var ps problems
	if input == nil {
		ps.add(CodeMissingField, "", "", "the task has no input")
		return nil, ps.err(CodeTaskInputInvalid)
	}
	in := &TaskInput{}
	for _, f := range []struct {
		key    string
		dst    *string
		noPipe bool
	}{
		{InputRunID, &in.RunID, true},
		{InputTenantID, &in.TenantID, false},
		{InputProjectID, &in.ProjectID, false},
		{InputEnvironmentID, &in.EnvironmentID, false},
		{InputPlanID, &in.PlanID, true},
		{InputPlanVersion, &in.PlanVersion, true},
	} {
		v, ok := inputString(&ps, input, f.key)
		if !ok {
			continue
		}
		switch err := statestore.CheckID(v, f.noPipe); {
		case v == "":
			ps.add(CodeBadID, f.key, "", "is empty (was the workflow started with %s?)", f.key)
		case err != nil:
			ps.add(CodeBadID, f.key, "", "%v", err)
		default:
			*f.dst = v
		}
	}
	stepOK := decodeStep(&ps, input, &in.Step)
	in.EngineTries, _ = inputInt(&ps, input, InputEngineTries, MaxEngineTries)
	in.LogicalAttempts, _ = inputInt(&ps, input, InputLogicalAttempts, MaxLogicalAttempts)
	if stepOK {
		r := in.Step.Retries
		if in.EngineTries != 0 && in.EngineTries != r.EngineTries {
			ps.add(CodeBadRetries, InputEngineTries, in.Step.StepID, "is %d but the step's retries.engineTries is %d", in.EngineTries, r.EngineTries)
		}
		if in.LogicalAttempts != 0 && in.LogicalAttempts != r.LogicalAttempts {
			ps.add(CodeBadRetries, InputLogicalAttempts, in.Step.StepID, "is %d but the step's retries.logicalAttempts is %d", in.LogicalAttempts, r.LogicalAttempts)
		}
	}
	if v, ok := inputString(&ps, input, InputOnStepFailure); ok {
		if v != OnFailureFail && v != OnFailurePause {
			ps.add(CodeBadPolicy, InputOnStepFailure, "", "must be %q or %q, got %q", OnFailureFail, OnFailurePause, v)
		}
		in.OnStepFailure = v
	}
	if _, ok := input[InputSink].(bool); !ok && input[InputSink] != nil {
		ps.add(CodeBadType, InputSink, "", "must be a boolean, got %T", input[InputSink])
	}
	in.Sink = IsSink(input)
	if err := ps.err(CodeTaskInputInvalid); err != nil {
		return nil, err
	}
	return in, nil
}

// IsSink reports whether a step task's input says that no other step
// depends on the step (InputSink). A task without the key, or with a value
// that is not a boolean, counts as a sink: its completion may end the run.
func IsSink(input map[string]any) bool {
	v, ok := input[InputSink].(bool)
	return v || !ok
}

func inputString(ps *problems, input map[string]any, key string) (string, bool) {
	raw, present := input[key]
	if !present || raw == nil {
		ps.add(CodeMissingField, key, "", "is missing")
		return "", false
	}
	s, ok := raw.(string)
	if !ok {
		ps.add(CodeBadType, key, "", "must be a string, got %T", raw)
		return "", false
	}
	return s, true
}

// inputInt accepts the integer forms a JSON decoder may give (float64,
// json.Number, Go integers) in 1..limit.
func inputInt(ps *problems, input map[string]any, key string, limit int) (int, bool) {
	raw, present := input[key]
	if !present || raw == nil {
		ps.add(CodeMissingField, key, "", "is missing")
		return 0, false
	}
	var v int64
	ok := true
	switch x := raw.(type) {
	case float64:
		ok = x == math.Trunc(x) && math.Abs(x) < 1<<53
		v = int64(x)
	case float32:
		ok = float64(x) == math.Trunc(float64(x)) && math.Abs(float64(x)) < 1<<24
		v = int64(x)
	case json.Number:
		n, err := strconv.ParseInt(string(x), 10, 64)
		ok, v = err == nil, n
	case int:
		v = int64(x)
	case int32:
		v = int64(x)
	case int64:
		v = x
	default:
		ok = false
	}
	if !ok {
		ps.add(CodeBadType, key, "", "must be an integer, got %v", raw)
		return 0, false
	}
	if v < 1 || v > int64(limit) {
		ps.add(CodeBadRetries, key, "", "must be between 1 and %d, got %d", limit, v)
		return 0, false
	}
	return int(v), true
}

// decodeStep decodes the base64 step JSON into s, normalizes it and
// checks it; it reports whether the step is usable.
func decodeStep(ps *problems, input map[string]any, s *Step) bool {
	enc, ok := inputString(ps, input, InputStep)
	if !ok {
		return false
	}
	if len(enc) > base64.StdEncoding.EncodedLen(MaxStepBytes) {
		ps.add(CodeTooLarge, InputStep, "", "is %d bytes of base64; the step limit is %d bytes", len(enc), MaxStepBytes)
		return false
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(enc)
	if err != nil {
		ps.add(CodeBadType, InputStep, "", "is not standard base64: %v", err)
		return false
	}
	if !utf8.Valid(raw) {
		ps.add(CodeSyntax, InputStep, "", "the step JSON is not valid UTF-8")
		return false
	}
	var st Step
	if err := decodeStrict(raw, stepSchema, &st); err != nil {
		var ve *ValidationError
		if !errors.As(err, &ve) {
			ps.add(CodeSyntax, InputStep, "", "%v", err)
			return false
		}
		for _, p := range ve.Problems {
			path := InputStep
			if p.Path != "" {
				path = joinField(InputStep, p.Path)
			}
			ps.add(p.Code, path, p.StepID, "%s", p.Message)
		}
		return false
	}
	before := len(ps.list) + ps.dropped
	checkID(ps, InputStep+".stepId", st.StepID, st.StepID)
	for k, d := range st.DependsOn {
		checkID(ps, fmt.Sprintf("%s.dependsOn[%d]", InputStep, k), st.StepID, d)
	}
	validateStep(ps, &st, InputStep)
	if len(ps.list)+ps.dropped != before {
		return false
	}
	st.normalize()
	*s = st
	return true
}
