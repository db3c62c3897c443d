package statestore

import (
	"strings"
	"time"
)

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

// ConductorWorkflowName returns the workflow name of a ConductorRunRef,
// or "" for a ref of another engine or none.
func ConductorWorkflowName(ref string) string {
	rest, ok := strings.CutPrefix(ref, conductorScheme)
	if !ok {
		return ""
	}
	if i := strings.LastIndexByte(rest, '/'); i >= 0 {
		return rest[:i]
	}
	return ""
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

// CodeEngineTask is the error code prefix of a step's failure recorded
// from Conductor's report of its task, not from a worker:
// ENGINE_TASK_<status> (FAILED, TIMED_OUT, CANCELED,
// FAILED_WITH_TERMINAL_ERROR, COMPLETED_WITH_ERRORS).
const CodeEngineTask = "ENGINE_TASK_"

// EngineTaskFailure is the error of a step's failure recorded from
// Conductor's report of its task in status: code CodeEngineTask+status,
// Conductor's reason (or a sentence naming the status when it gave none),
// and retryable as Conductor retries a task: a try that FAILED or TIMED_OUT
// is, a terminal error, a cancel or an optional task's COMPLETED_WITH_ERRORS
// is not. Plan runs and adopted runs record the same error.
func EngineTaskFailure(status, reason string) *StepError {
	if reason == "" {
		reason = "Conductor reported the task " + status
	}
	return &StepError{Code: CodeEngineTask + status, Message: reason, Retryable: status == "FAILED" || status == "TIMED_OUT"}
}

// EngineTime formats a Conductor epoch-millisecond time as RFC 3339 ("" for
// none).
func EngineTime(ms int64) string {
	if ms <= 0 {
		return ""
	}
	return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
}
