package plan

import (
	"errors"
	"strings"
	"testing"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// diamondWith is a → {b, c} → d, d joined with join.
func diamondWith(join string) *Plan {
	noop := ExecutorSpec{Type: ExecutorNoop}
	return &Plan{PlanID: "j", PlanVersion: "1", Steps: []Step{
		{StepID: "a", Executor: noop},
		{StepID: "b", Executor: noop, DependsOn: []string{"a"}},
		{StepID: "c", Executor: noop, DependsOn: []string{"a"}},
		{StepID: "d", Executor: noop, DependsOn: []string{"b", "c"}, Join: join},
	}}
}

func TestValidate_Joins(t *testing.T) {
	for _, j := range []string{"", JoinAllSuccess, JoinAllDone, JoinAnySuccess} {
		if err := Validate(diamondWith(j)); err != nil {
			t.Errorf("join %q: %v", j, err)
		}
	}
	bad := func(name string, p *Plan, want string) {
		t.Helper()
		err := Validate(p)
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Problems[0].Code != CodeBadJoin || !strings.Contains(ve.Problems[0].Message, want) {
			t.Errorf("%s: %v, want BAD_JOIN saying %q", name, err, want)
		}
	}
	bad("unknown", diamondWith("any"), `got "any"`)
	one := diamondWith(JoinAllDone)
	one.Steps[3].DependsOn = []string{"b"}
	bad("one dependency", one, "two dependencies or more")
	shared := diamondWith(JoinAnySuccess)
	shared.Steps = append(shared.Steps, Step{StepID: "e", Executor: ExecutorSpec{Type: ExecutorNoop}, DependsOn: []string{"b"}})
	bad("shared dependency", shared, `dependency "b" has other dependents`)
	paused := diamondWith(JoinAllDone)
	paused.OnStepFailure = OnFailurePause
	bad("pause", paused, "needs onStepFailure")
}

// TestCompile_Joins: the dependencies of an all_done or any_success join
// are optional tasks in Conductor (its JOIN then tolerates their
// failure); nothing else is.
func TestCompile_Joins(t *testing.T) {
	for _, c := range []struct {
		join     string
		optional bool
	}{{"", false}, {JoinAllSuccess, false}, {JoinAllDone, true}, {JoinAnySuccess, true}} {
		compiled, err := Compile(diamondWith(c.join))
		if err != nil {
			t.Fatal(err)
		}
		opt := map[string]bool{}
		var walk func(ts []model.WorkflowTask)
		walk = func(ts []model.WorkflowTask) {
			for _, t := range ts {
				if id, ok := StepIDFromRef(t.TaskReferenceName); ok {
					opt[id] = t.Optional
				}
				for _, branch := range t.ForkTasks {
					walk(branch)
				}
			}
		}
		walk(compiled.Workflow.Tasks)
		if opt["a"] || opt["d"] || opt["b"] != c.optional || opt["c"] != c.optional {
			t.Errorf("join %q: optional tasks %v, want b and c %v, a and d false", c.join, opt, c.optional)
		}
	}
}
