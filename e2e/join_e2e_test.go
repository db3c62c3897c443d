package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_JoinPolicies: the join policies of the Core Events Specification
// v1.0 on the real Conductor, for a → {b, c} → d: all_success (the default)
// fails the run on a failed branch and never runs d; all_done runs d whatever
// the branches did; any_success runs d when one branch succeeded and fails it
// with JOIN_NOT_PASSABLE when none did.
func TestE2E_JoinPolicies(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	fail := plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c", "exit 3"}}
	ok := plan.ExecutorSpec{Type: plan.ExecutorNoop}
	for i, c := range []struct {
		join       string
		b, c       plan.ExecutorSpec
		status     string
		dRan       bool
		dErrorCode string
	}{
		{"", fail, ok, statestore.RunStatusFailed, false, ""},
		{plan.JoinAllDone, fail, fail, statestore.RunStatusCompleted, true, ""},
		{plan.JoinAnySuccess, fail, ok, statestore.RunStatusCompleted, true, ""},
		{plan.JoinAnySuccess, fail, fail, statestore.RunStatusFailed, true, "JOIN_NOT_PASSABLE"},
	} {
		name := c.join
		if name == "" {
			name = "default"
		}
		t.Run(fmt.Sprintf("%d_%s", i, name), func(t *testing.T) {
			pl := &plan.Plan{PlanID: uniq("e2e-join"), PlanVersion: "1", Steps: []plan.Step{
				{StepID: "a", Executor: ok},
				{StepID: "b", Executor: c.b, DependsOn: []string{"a"}},
				{StepID: "c", Executor: c.c, DependsOn: []string{"a"}},
				{StepID: "d", Executor: ok, DependsOn: []string{"b", "c"}, Join: c.join},
			}}
			started := submit(t, p, pl, "req")
			v := waitTerminal(t, p, started.RunID, 60*time.Second)
			evs := allEvents(t, p, started.RunID)
			if v.Status != c.status {
				t.Fatalf("run %s, want %s; log %v", v.Status, c.status, types(evs))
			}
			if ran := eventIndex(evs, statestore.StepStarted, "d", 0) >= 0; ran != c.dRan {
				t.Fatalf("step d started: %v, want %v; log %v", ran, c.dRan, types(evs))
			}
			if c.dErrorCode != "" {
				d := v.Step("d")
				if d == nil || d.Status != statestore.StepStatusFailed || d.Error == nil || d.Error.Code != c.dErrorCode {
					t.Fatalf("step d %+v, want FAILED %s", d, c.dErrorCode)
				}
				if !strings.Contains(d.Error.Message, "none of b, c succeeded") {
					t.Fatalf("message %q", d.Error.Message)
				}
			}
			if _, alerts := statestore.Reduce(nil, evs); len(alerts) != 0 {
				t.Fatalf("the log raises %v", alerts)
			}
		})
	}
}
