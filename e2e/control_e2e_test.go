package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_CLIResumeReasonAndIdleStep: `sidecar status` shows a step whose
// try ended without an outcome (steps[].idle) as IDLE with the reason the
// try ended, not as RUNNING; `sidecar resume RUN --reason R` records R in
// RunResumed, as the API does.
func TestE2E_CLIResumeReasonAndIdleStep(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	server := "http://" + p.addr
	marker := filepath.Join(t.TempDir(), "tried")
	pl := &plan.Plan{PlanID: uniq("e2e-cli-idle"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "flaky", Retries: plan.RetryPolicy{EngineTries: 2},
			Executor: plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c",
				"if [ -e " + marker + " ]; then exit 0; fi; touch " + marker + "; sleep 2; exit 1"}}},
	}}
	started := submit(t, p, pl, uniq("req"))
	sidecartest.WaitFor(t, "flaky to start", time.Minute, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "flaky", 0) >= 0
	})
	if code, out, errOut := sidecartest.Run(t, "pause", started.RunID, "--reason", "maintenance", "--server", server); code != 0 {
		t.Fatalf("pause: exit %d\n%s%s", code, out, errOut)
	}
	// The try fails while the run is paused: held, and recorded ended.
	sidecartest.WaitFor(t, "the try to end", 2*time.Minute, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.RunStepTryEnded, "", 0) >= 0
	})
	code, out, errOut := sidecartest.Run(t, "status", started.RunID, "--server", server)
	if code != 0 {
		t.Fatalf("status: exit %d\n%s%s", code, out, errOut)
	}
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "step ") && strings.Contains(l, "flaky") {
			line = l
		}
	}
	if !strings.Contains(line, "IDLE") || strings.Contains(line, "RUNNING") || !strings.Contains(line, statestore.TryEndedEngineTryFailed) {
		t.Fatalf("status shows the idle step as %q, want IDLE with the reason %s:\n%s", line, statestore.TryEndedEngineTryFailed, out)
	}

	if code, out, errOut := sidecartest.Run(t, "resume", started.RunID, "--reason", "dependency back", "--server", server); code != 0 {
		t.Fatalf("resume: exit %d\n%s%s", code, out, errOut)
	}
	evs := allEvents(t, p, started.RunID)
	i := eventIndex(evs, statestore.RunResumed, "", 0)
	if i < 0 {
		t.Fatalf("no RunResumed after resume\n%v", types(evs))
	}
	var payload struct{ Reason string }
	_ = json.Unmarshal(evs[i].Payload, &payload)
	if payload.Reason != "dependency back" {
		t.Fatalf("RunResumed records reason %q, want the CLI's --reason (payload %s)", payload.Reason, evs[i].Payload)
	}
	if v := waitTerminal(t, p, started.RunID, 2*time.Minute); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s after resume, want COMPLETED", v.Status)
	}
}
