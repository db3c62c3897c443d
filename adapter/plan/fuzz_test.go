package plan

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// FuzzParse feeds documents to Parse and Validate: they never panic, every
// failure is a *ValidationError with problems, and a plan that validates
// compiles, runs its steps in dependency order, and gives task inputs that
// DecodeTaskInput accepts.
func FuzzParse(f *testing.F) {
	f.Add([]byte(richJSON))
	f.Add([]byte(richYAML))
	for _, name := range []string{"diamond.json", "diamond.yaml", "quickstart.yaml"} {
		if b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "local", "plans", name)); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"planId":"p","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}},{"stepId":"b","executor":{"type":"noop"},"dependsOn":["a"]}]}`))
	f.Add([]byte("planId: p\nplanVersion: '1'\nsteps: [{stepId: a, executor: {type: noop}, dependsOn: [a]}]\n"))
	f.Add([]byte(`{"planId":"p","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"http","method":"GET","url":"http://x/${secret:A}"},"secrets":[{"name":"A","ref":"env:A"}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			requireProblems(t, err)
			return
		}
		if err := Validate(p); err != nil {
			requireProblems(t, err)
			return
		}
		c, err := Compile(p)
		if err != nil {
			t.Fatalf("a valid plan does not compile: %v", err)
		}
		checkCompiledOrder(t, c.Plan, c, false, 1, newRand(uint64(len(data))))
		wfIn := WorkflowInput("run", "t", "p", "e", p.PlanID, p.PlanVersion)
		var walk func([]model.WorkflowTask)
		walk = func(ts []model.WorkflowTask) {
			for _, wt := range ts {
				if wt.Type_ == "SIMPLE" {
					if _, err := DecodeTaskInput(conductorInput(t, wt, wfIn)); err != nil {
						t.Fatalf("task input of %s: %v", wt.TaskReferenceName, err)
					}
				}
				for _, b := range wt.ForkTasks {
					walk(b)
				}
			}
		}
		walk(c.Workflow.Tasks)
	})
}

func requireProblems(t *testing.T, err error) {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Code != CodePlanInvalid || len(ve.Problems) == 0 {
		t.Fatalf("error %v is not a PLAN_INVALID with problems", err)
	}
	for _, p := range ve.Problems {
		if p.Code == "" || p.Message == "" {
			t.Fatalf("problem without code or message: %+v", p)
		}
	}
}
