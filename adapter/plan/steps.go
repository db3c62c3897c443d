package plan

import (
	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// StepsOf reads the steps of a plan back from the workflow definition
// Compile made of it: each step task carries its step, normalized, in its
// input (InputStep). Steps come in the order the definition holds them
// (a fork's branches in turn). A task that is not a compiled step (an
// adopted workflow's, a system task) is skipped; a definition with none
// gives no steps and no error.
func StepsOf(def *model.WorkflowDef) []Step {
	var out []Step
	var walk func(tasks []model.WorkflowTask)
	walk = func(tasks []model.WorkflowTask) {
		for i := range tasks {
			t := &tasks[i]
			for _, branch := range t.ForkTasks {
				walk(branch)
			}
			if t.Type_ != "SIMPLE" {
				continue
			}
			var ps problems
			var st Step
			if decodeStep(&ps, t.InputParameters, &st) {
				out = append(out, st)
			}
		}
	}
	if def != nil {
		walk(def.Tasks)
	}
	return out
}
