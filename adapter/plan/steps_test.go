package plan

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// TestStepsOf: the steps of a compiled plan read back from its workflow
// definition, as Conductor returns it (JSON), are the plan's, dependsOn
// included; tasks that are not compiled steps are skipped.
func TestStepsOf(t *testing.T) {
	p := validPlan()
	c := mustCompile(t, p)
	raw, err := c.WorkflowDefJSON()
	if err != nil {
		t.Fatal(err)
	}
	var def model.WorkflowDef
	if err := json.Unmarshal(raw, &def); err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, s := range StepsOf(&def) {
		got[s.StepID] = s.DependsOn
	}
	want := map[string][]string{}
	for _, s := range p.Steps {
		want[s.StepID] = s.DependsOn
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("StepsOf: got %v, want %v", got, want)
	}
	def.Tasks = append(def.Tasks, model.WorkflowTask{Type_: "SIMPLE", TaskReferenceName: "adopted", InputParameters: map[string]interface{}{"x": 1}})
	if n := len(StepsOf(&def)); n != len(p.Steps) {
		t.Fatalf("a task without a step counted: %d steps, want %d", n, len(p.Steps))
	}
	if StepsOf(nil) != nil {
		t.Fatal("StepsOf(nil) is not empty")
	}
}
