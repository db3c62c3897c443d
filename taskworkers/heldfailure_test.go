package taskworkers

import (
	"encoding/json"
	"testing"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// TestHeldFailureOf: a failure held on a task is found on that task as
// Conductor hands it back (its output decoded from JSON), and not on a
// task of another try that carries a copy of it (a retry, or a rerun from
// Conductor's UI, whose retryCount differs): that try must run.
func TestHeldFailureOf(t *testing.T) {
	held := func(retryCount int32) map[string]any {
		b, _ := json.Marshal(map[string]any{heldFailureKey: heldFailure{RetryCount: retryCount, Reason: "COMMAND_FAILED: exit status 1"}})
		var out map[string]any
		_ = json.Unmarshal(b, &out)
		return out
	}
	for _, tt := range []struct {
		name string
		task model.Task
		want bool
	}{
		{"HandedBack", model.Task{RetryCount: 2, OutputData: held(2)}, true},
		{"AnotherTry", model.Task{RetryCount: 3, OutputData: held(2)}, false},
		{"NoOutput", model.Task{RetryCount: 0}, false},
		{"Garbled", model.Task{OutputData: map[string]any{heldFailureKey: "no"}}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, ok := heldFailureOf(&tt.task)
			if ok != tt.want || ok && f.Reason != "COMMAND_FAILED: exit status 1" {
				t.Fatalf("heldFailureOf: %+v %v, want found=%v", f, ok, tt.want)
			}
		})
	}
}
