package plan

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// conductorInput does what Conductor does to a compiled task's input
// parameters: ${workflow.input.KEY} replaced by the workflow input, and a
// JSON round trip (numbers become float64).
func conductorInput(t testing.TB, wt model.WorkflowTask, wfInput map[string]any) map[string]any {
	t.Helper()
	in := map[string]any{}
	for k, v := range wt.InputParameters {
		if s, ok := v.(string); ok && strings.HasPrefix(s, "${workflow.input.") {
			v = wfInput[strings.TrimSuffix(strings.TrimPrefix(s, "${workflow.input."), "}")]
		}
		in[k] = v
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func compiledInput(t testing.TB) (*Compiled, map[string]any) {
	t.Helper()
	c := mustCompile(t, validPlan())
	wfIn := WorkflowInput("run-1", "tenant", "project", "env", "deploy", "2026.1")
	return c, conductorInput(t, c.Workflow.Tasks[0], wfIn)
}

func TestDecodeTaskInput(t *testing.T) {
	t.Run("RoundTrip", func(t *testing.T) {
		c, in := compiledInput(t)
		got, err := DecodeTaskInput(in)
		if err != nil {
			t.Fatal(err)
		}
		want := &TaskInput{RunID: "run-1", TenantID: "tenant", ProjectID: "project", EnvironmentID: "env", PlanID: "deploy", PlanVersion: "2026.1",
			Step: c.Plan.Steps[0], EngineTries: 3, LogicalAttempts: 2, OnStepFailure: OnFailurePause}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("got %+v\nwant %+v", got, want)
		}
	})
	t.Run("EveryStep", func(t *testing.T) {
		c := mustCompile(t, validPlan())
		wfIn := WorkflowInput("r", "t", "p", "e", "deploy", "2026.1")
		dependedOn := map[string]bool{}
		for _, s := range c.Plan.Steps {
			for _, d := range s.DependsOn {
				dependedOn[d] = true
			}
		}
		if len(dependedOn) == 0 || len(dependedOn) == len(c.Plan.Steps) {
			t.Fatalf("the plan needs sinks and steps with dependents; depended on: %v", dependedOn)
		}
		var walk func([]model.WorkflowTask)
		n := 0
		walk = func(ts []model.WorkflowTask) {
			for _, wt := range ts {
				if wt.Type_ == "SIMPLE" {
					got, err := DecodeTaskInput(conductorInput(t, wt, wfIn))
					if err != nil {
						t.Fatal(err)
					}
					if StepRef(got.Step.StepID) != wt.TaskReferenceName {
						t.Fatalf("step %q in task %q", got.Step.StepID, wt.TaskReferenceName)
					}
					if got.Sink != !dependedOn[got.Step.StepID] {
						t.Fatalf("step %q: sink %v, but depended on: %v", got.Step.StepID, got.Sink, dependedOn[got.Step.StepID])
					}
					n++
				}
				for _, b := range wt.ForkTasks {
					walk(b)
				}
			}
		}
		walk(c.Workflow.Tasks)
		if n != 4 {
			t.Fatalf("decoded %d steps", n)
		}
	})
	t.Run("IntegerForms", func(t *testing.T) {
		for _, v := range []any{3, int64(3), int32(3), float64(3), float32(3), json.Number("3")} {
			_, in := compiledInput(t)
			in[InputEngineTries] = v
			if _, err := DecodeTaskInput(in); err != nil {
				t.Fatalf("%T: %v", v, err)
			}
		}
	})
	t.Run("SinkMissing", func(t *testing.T) {
		// A task compiled before InputSink existed may end the run.
		_, in := compiledInput(t)
		if in[InputSink] != false {
			t.Fatalf("the first step of validPlan has dependents; sink = %v", in[InputSink])
		}
		delete(in, InputSink)
		if got, err := DecodeTaskInput(in); err != nil || !got.Sink {
			t.Fatalf("got %+v, %v want Sink true", got, err)
		}
	})
	t.Run("UnknownKeysIgnored", func(t *testing.T) {
		_, in := compiledInput(t)
		in["addedLater"] = map[string]any{"x": 1}
		if _, err := DecodeTaskInput(in); err != nil {
			t.Fatal(err)
		}
	})

	stepJSON := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	bad := []struct {
		name   string
		change func(in map[string]any)
		code   string
		path   string
	}{
		{"RunIDMissing", func(in map[string]any) { delete(in, InputRunID) }, CodeMissingField, InputRunID},
		{"RunIDNull", func(in map[string]any) { in[InputRunID] = nil }, CodeMissingField, InputRunID},
		{"RunIDEmpty", func(in map[string]any) { in[InputRunID] = "" }, CodeBadID, InputRunID},
		{"RunIDPipe", func(in map[string]any) { in[InputRunID] = "a|b" }, CodeBadID, InputRunID},
		{"RunIDNumber", func(in map[string]any) { in[InputRunID] = 7.0 }, CodeBadType, InputRunID},
		{"TenantTooLong", func(in map[string]any) { in[InputTenantID] = strings.Repeat("t", 300) }, CodeBadID, InputTenantID},
		{"PlanVersionNotUTF8", func(in map[string]any) { in[InputPlanVersion] = "\xff" }, CodeBadID, InputPlanVersion},
		{"StepMissing", func(in map[string]any) { delete(in, InputStep) }, CodeMissingField, InputStep},
		{"StepNotString", func(in map[string]any) { in[InputStep] = map[string]any{"stepId": "x"} }, CodeBadType, InputStep},
		{"StepNotBase64", func(in map[string]any) { in[InputStep] = "not base64!" }, CodeBadType, InputStep},
		{"StepURLBase64", func(in map[string]any) { in[InputStep] = base64.URLEncoding.EncodeToString([]byte(`{"stepId":"?>?"}`)) }, CodeBadType, InputStep},
		{"StepNotJSON", func(in map[string]any) { in[InputStep] = stepJSON("stepId: x") }, CodeSyntax, InputStep},
		{"StepUnknownField", func(in map[string]any) {
			in[InputStep] = stepJSON(`{"stepId":"s","executor":{"type":"noop"},"extra":1}`)
		}, CodeUnknownField, "step.extra"},
		{"StepInvalid", func(in map[string]any) {
			in[InputStep] = stepJSON(`{"stepId":"s","executor":{"type":"command","argv":[]},"retries":{"engineTries":3,"logicalAttempts":2}}`)
		}, CodeBadExecutor, "step.executor.argv"},
		{"StepIDPipe", func(in map[string]any) {
			in[InputStep] = stepJSON(`{"stepId":"a|b","executor":{"type":"noop"},"retries":{"engineTries":3,"logicalAttempts":2}}`)
		}, CodeBadID, "step.stepId"},
		{"StepTooLarge", func(in map[string]any) { in[InputStep] = strings.Repeat("A", 2*MaxStepBytes) }, CodeTooLarge, InputStep},
		{"EngineTriesZero", func(in map[string]any) { in[InputEngineTries] = 0.0 }, CodeBadRetries, InputEngineTries},
		{"EngineTriesFraction", func(in map[string]any) { in[InputEngineTries] = 2.5 }, CodeBadType, InputEngineTries},
		{"EngineTriesString", func(in map[string]any) { in[InputEngineTries] = "3" }, CodeBadType, InputEngineTries},
		{"EngineTriesHuge", func(in map[string]any) { in[InputEngineTries] = 1e300 }, CodeBadType, InputEngineTries},
		{"EngineTriesDisagree", func(in map[string]any) { in[InputEngineTries] = 2.0 }, CodeBadRetries, InputEngineTries},
		{"LogicalAttemptsMissing", func(in map[string]any) { delete(in, InputLogicalAttempts) }, CodeMissingField, InputLogicalAttempts},
		{"LogicalAttemptsDisagree", func(in map[string]any) { in[InputLogicalAttempts] = 1.0 }, CodeBadRetries, InputLogicalAttempts},
		{"PolicyUnknown", func(in map[string]any) { in[InputOnStepFailure] = "" }, CodeBadPolicy, InputOnStepFailure},
		{"PolicyMissing", func(in map[string]any) { delete(in, InputOnStepFailure) }, CodeMissingField, InputOnStepFailure},
		{"SinkString", func(in map[string]any) { in[InputSink] = "false" }, CodeBadType, InputSink},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, in := compiledInput(t)
			tc.change(in)
			_, err := DecodeTaskInput(in)
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Code != CodeTaskInputInvalid || !errors.Is(err, ErrTaskInputInvalid) {
				t.Fatalf("got %v, want a TASK_INPUT_INVALID error", err)
			}
			if !ve.Has(tc.code, tc.path) {
				t.Fatalf("got %v, want %s at %s", ve.Problems, tc.code, tc.path)
			}
		})
	}
	t.Run("Nil", func(t *testing.T) {
		if _, err := DecodeTaskInput(nil); !errors.Is(err, ErrTaskInputInvalid) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestTaskInput_Attempts(t *testing.T) {
	in := &TaskInput{EngineTries: 3, LogicalAttempts: 2}
	want := [][2]int64{{1, 1}, {2, 1}, {3, 1}, {1, 2}, {2, 2}, {3, 2}, {1, 3}}
	for r, w := range want {
		if e, l := in.Attempts(r); e != w[0] || l != w[1] {
			t.Errorf("Attempts(%d) = (%d, %d), want %v", r, e, l, w)
		}
	}
	if e, l := in.Attempts(-5); e != 1 || l != 1 {
		t.Errorf("Attempts(-5) = (%d, %d)", e, l)
	}
	if e, l := (&TaskInput{}).Attempts(4); e != 1 || l != 5 {
		t.Errorf("zero E: (%d, %d)", e, l)
	}
}

func FuzzDecodeTaskInput(f *testing.F) {
	_, in := compiledInput(f)
	b, _ := json.Marshal(in)
	f.Add(b)
	f.Add([]byte(`{"step":"e30=","engineTries":1e400}`))
	f.Add([]byte(`{"runId":"r","step":"eyJzdGVwSWQiOiJzIiwiZXhlY3V0b3IiOnsidHlwZSI6Im5vb3AifX0="}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var m map[string]any
		if json.Unmarshal(data, &m) != nil {
			return
		}
		got, err := DecodeTaskInput(m)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) == 0 {
				t.Fatalf("error %v is not a TASK_INPUT_INVALID with problems", err)
			}
			return
		}
		if got.EngineTries < 1 || got.LogicalAttempts < 1 || got.RunID == "" {
			t.Fatalf("accepted %+v", got)
		}
		var ps problems
		validateStep(&ps, &got.Step, "step")
		if len(ps.list) != 0 {
			t.Fatalf("accepted an invalid step: %v", ps.list)
		}
	})
}
