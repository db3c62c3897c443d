package adapter

import "github.com/conductor-sdk/conductor-go/sdk/model"

// PlanHashVariable is the workflow variable in which RegisterPlan records
// the plan's content hash in the workflow definition it registers, so that a
// definition registered by another deployment (or by hand) under the same
// name and version is detected as a conflict.
const PlanHashVariable = "sidecarPlanHash"

// EmbeddedPlanHash returns the plan content hash recorded in def, or "" if
// def carries none.
func EmbeddedPlanHash(def *model.WorkflowDef) string {
	if def == nil {
		return ""
	}
	h, _ := def.Variables[PlanHashVariable].(string)
	return h
}

// stampPlanHash returns a copy of def whose variables record hash.
func stampPlanHash(def model.WorkflowDef, hash string) model.WorkflowDef {
	vars := make(map[string]any, len(def.Variables)+1)
	for k, v := range def.Variables {
		vars[k] = v
	}
	vars[PlanHashVariable] = hash
	def.Variables = vars
	return def
}
