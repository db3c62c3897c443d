package statestore

import "strings"

// conductorScheme prefixes the engineRunRef of a Conductor workflow.
const conductorScheme = "conductor://"

// ConductorRunRef returns the engineRunRef of a Conductor workflow:
// conductor://<workflowName>/<workflowId>, or "" without a workflowId.
func ConductorRunRef(workflowName, workflowID string) string {
	if workflowID == "" {
		return ""
	}
	return conductorScheme + workflowName + "/" + workflowID
}

// ConductorWorkflowID returns the workflowId of a ConductorRunRef, or ""
// for a ref of another engine or none.
func ConductorWorkflowID(ref string) string {
	rest, ok := strings.CutPrefix(ref, conductorScheme)
	if !ok {
		return ""
	}
	if i := strings.LastIndexByte(rest, '/'); i >= 0 {
		return rest[i+1:]
	}
	return ""
}
