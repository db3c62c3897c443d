package statestore

import "testing"

// A failure Conductor reported is retryable as Conductor retries a task,
// whoever records it (a plan run's worker or watcher, the adopter).
func TestEngineTaskFailure(t *testing.T) {
	for _, tt := range []struct {
		status, reason string
		want           StepError
	}{
		{"FAILED", "boom", StepError{Code: "ENGINE_TASK_FAILED", Message: "boom", Retryable: true}},
		{"TIMED_OUT", "", StepError{Code: "ENGINE_TASK_TIMED_OUT", Message: "Conductor reported the task TIMED_OUT", Retryable: true}},
		{"FAILED_WITH_TERMINAL_ERROR", "bad input", StepError{Code: "ENGINE_TASK_FAILED_WITH_TERMINAL_ERROR", Message: "bad input"}},
		{"CANCELED", "", StepError{Code: "ENGINE_TASK_CANCELED", Message: "Conductor reported the task CANCELED"}},
		{"COMPLETED_WITH_ERRORS", "", StepError{Code: "ENGINE_TASK_COMPLETED_WITH_ERRORS", Message: "Conductor reported the task COMPLETED_WITH_ERRORS"}},
	} {
		if got := EngineTaskFailure(tt.status, tt.reason); *got != tt.want {
			t.Errorf("EngineTaskFailure(%q, %q) = %+v, want %+v", tt.status, tt.reason, *got, tt.want)
		}
	}
}
