package plan

import (
	"errors"
	"strings"
	"testing"
)

func externalPlan(x ExecutorSpec) *Plan {
	return &Plan{PlanID: "p", PlanVersion: "1", Steps: []Step{
		{StepID: "a", Executor: ExecutorSpec{Type: ExecutorNoop}},
		{StepID: "b", Executor: x, DependsOn: []string{"a"}, TimeoutSeconds: 30},
	}}
}

func TestCompile_External(t *testing.T) {
	c, err := Compile(externalPlan(ExecutorSpec{Type: ExecutorExternal, TaskType: "resize_image", Input: map[string]string{"size": "${workflow.input.size}"}}))
	if err != nil {
		t.Fatal(err)
	}
	wt := c.Workflow.Tasks[1]
	if wt.Name != "resize_image" || wt.Type_ != "SIMPLE" {
		t.Fatalf("got task %q of type %q, want resize_image SIMPLE", wt.Name, wt.Type_)
	}
	if got := wt.InputParameters["size"]; got != "${workflow.input.size}" {
		t.Fatalf("input size: got %v", got)
	}
	if got := wt.TaskDefinition.ResponseTimeoutSeconds; got != 30 {
		t.Fatalf("responseTimeoutSeconds: got %d, want the step's timeout 30", got)
	}
	for _, d := range c.TaskDefs {
		if d.Name == "resize_image" {
			t.Fatal("an external task type is registered; it must ride inline only")
		}
	}
	// The worker's decoder reads the task input back.
	in := map[string]any{}
	for k, v := range wt.InputParameters {
		in[k] = v
	}
	for _, k := range WorkflowInputKeys {
		in[k] = "x"
	}
	a, err := DecodeTaskInput(in)
	if err != nil {
		t.Fatal(err)
	}
	if a.Step.Executor.Type != ExecutorExternal || a.Step.Executor.TaskType != "resize_image" {
		t.Fatalf("decoded executor %+v", a.Step.Executor)
	}
}

func TestValidate_External(t *testing.T) {
	tests := []struct {
		name string
		x    ExecutorSpec
		want string
	}{
		{"NoTaskType", ExecutorSpec{Type: ExecutorExternal}, "taskType"},
		{"BadTaskType", ExecutorSpec{Type: ExecutorExternal, TaskType: "a b"}, "taskType"},
		{"SidecarType", ExecutorSpec{Type: ExecutorExternal, TaskType: TaskTypeNoop}, "own workers"},
		{"ReservedInput", ExecutorSpec{Type: ExecutorExternal, TaskType: "t", Input: map[string]string{InputRunID: "x"}}, "task input key"},
		{"TaskTypeOnNoop", ExecutorSpec{Type: ExecutorNoop, TaskType: "t"}, "field of the external executor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(externalPlan(tt.x))
			var ve *ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want a plan validation error", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want a problem about %s", err, tt.want)
			}
		})
	}
}
