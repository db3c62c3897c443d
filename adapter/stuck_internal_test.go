package adapter

import (
	"testing"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// TestAllDone: a workflow has nothing left to do when every task is
// terminal, or when only JOINs are in progress with every other task
// terminal (a JOIN completes when Conductor decides the workflow, so one
// left in progress over finished branches is a decide Conductor lost); any
// other task in progress or scheduled is work to do.
func TestAllDone(t *testing.T) {
	task := func(typ, status string) model.Task {
		return model.Task{TaskType: typ, Status: model.TaskResultStatus(status)}
	}
	for _, tc := range []struct {
		name  string
		tasks []model.Task
		want  bool
	}{
		{"None", nil, false},
		{"AllCompleted", []model.Task{task("sidecar_noop", "COMPLETED"), task("HTTP", "FAILED")}, true},
		{"JoinOverFinishedBranches", []model.Task{task("FORK", "COMPLETED"), task("a", "COMPLETED"), task("b", "COMPLETED"), task("JOIN", "IN_PROGRESS")}, true},
		{"ExclusiveJoin", []model.Task{task("a", "COMPLETED"), task("EXCLUSIVE_JOIN", "IN_PROGRESS")}, true},
		{"JoinWaitingForABranch", []model.Task{task("FORK", "COMPLETED"), task("a", "COMPLETED"), task("b", "IN_PROGRESS"), task("JOIN", "IN_PROGRESS")}, false},
		{"Scheduled", []model.Task{task("a", "COMPLETED"), task("b", "SCHEDULED")}, false},
		{"OnlyAJoin", []model.Task{task("JOIN", "IN_PROGRESS")}, false},
		{"WaitInProgress", []model.Task{task("a", "COMPLETED"), task("WAIT", "IN_PROGRESS")}, false},
	} {
		if got := allDone(tc.tasks); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
