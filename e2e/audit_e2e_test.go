package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_Audit: `sidecar audit RUN` lists the run's control actions from
// its log, in order, with who and why, and what became of them (the
// drain's end); --since leaves out older ones; `audit --plan P` (or -l)
// lists those of every run the filter selects.
// auditEntry is a line of "sidecar audit -o json", as a user's script
// reads it.
type auditEntry struct {
	At     string `json:"at"`
	RunID  string `json:"runId"`
	Action string `json:"action"`
	By     string `json:"by"`
	Reason string `json:"reason"`
	Cycle  int64  `json:"cycle"`
	StepID string `json:"stepId"`
	Detail string `json:"detail"`
	RunSeq int64  `json:"runSeq"`
}

func TestE2E_Audit(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	ctx := context.Background()
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-audit")+`","planVersion":"1","steps":[
		{"stepId":"slow","executor":{"type":"sleep","seconds":1}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["slow"]}]}`)
	started := submit(t, p, pl, uniq("req"))
	sidecartest.WaitFor(t, "slow to start", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "slow", 0) >= 0
	})
	if _, err := p.client.Pause(ctx, started.RunID, 120, "db maintenance"); err != nil {
		t.Fatal(err)
	}
	sidecartest.WaitFor(t, "the drain to end", 30*time.Second, func() bool {
		v, err := p.client.Run(ctx, started.RunID)
		return err == nil && v.Pause != nil && v.Pause.DrainEndedAt != ""
	})
	if _, err := p.client.Resume(ctx, started.RunID); err != nil {
		t.Fatal(err)
	}
	waitTerminal(t, p, started.RunID, 60*time.Second)
	server := "http://" + p.addr

	code, out, errOut := sidecartest.Run(t, "audit", started.RunID, "--server", server, "-o", "json")
	if code != 0 {
		t.Fatalf("audit: exit %d: %s", code, errOut)
	}
	var entries []auditEntry
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var actions []string
	for _, e := range entries {
		actions = append(actions, e.Action)
	}
	if strings.Join(actions, ",") != "pause,drain completed,resume" {
		t.Fatalf("actions %v, want pause, drain completed, resume", actions)
	}
	if e := entries[0]; e.Reason != "db maintenance" || e.Cycle != 1 || !strings.Contains(e.Detail, "drain timeout 120s") {
		t.Fatalf("pause entry %+v", e)
	}
	code, out, _ = sidecartest.Run(t, "audit", started.RunID, "--server", server)
	if code != 0 || !strings.Contains(out, "db maintenance") || !strings.Contains(out, "drain completed") {
		t.Fatalf("table: exit %d\n%s", code, out)
	}
	code, out, _ = sidecartest.Run(t, "audit", started.RunID, "--server", server, "--since", time.Now().Add(time.Minute).UTC().Format(time.RFC3339))
	if code != 0 || !strings.Contains(out, "no control actions") {
		t.Fatalf("--since the future: exit %d\n%s", code, out)
	}
	if code, _, _ = sidecartest.Run(t, "audit", started.RunID, "--server", server, "--since", "yesterday"); code != sidecartest.ExitUsage {
		t.Fatalf("--since yesterday: exit %d, want usage", code)
	}

	// Many runs by filter: the same actions, each with its run.
	code, out, errOut = sidecartest.Run(t, "audit", "--plan", pl.PlanID, "--server", server, "-o", "json")
	var many []auditEntry
	if code != 0 || json.Unmarshal([]byte(out), &many) != nil || len(many) != 3 {
		t.Fatalf("audit --plan: exit %d: %s%s", code, out, errOut)
	}
	for i, e := range many {
		if e.RunID != started.RunID || e.Action != entries[i].Action {
			t.Fatalf("audit --plan entry %d: %+v, want %s of %s", i, e, entries[i].Action, started.RunID)
		}
	}
	if code, out, _ = sidecartest.Run(t, "audit", "--plan", pl.PlanID, "--server", server); code != 0 || !strings.Contains(out, "RUN") || !strings.Contains(out, started.RunID) {
		t.Fatalf("audit --plan table: exit %d\n%s", code, out)
	}
	// --since lists only the runs changed since (an action is an event of
	// its run): the run acted on a moment ago, and none after its last event.
	if code, out, errOut = sidecartest.Run(t, "audit", "--plan", pl.PlanID, "--since", "1h", "--server", server, "-o", "json"); code != 0 || json.Unmarshal([]byte(out), &many) != nil || len(many) != 3 {
		t.Fatalf("audit --plan --since 1h: exit %d: %s%s", code, out, errOut)
	}
	if code, out, errOut = sidecartest.Run(t, "audit", "--plan", pl.PlanID, "--since", time.Now().Add(time.Minute).UTC().Format(time.RFC3339), "--server", server); code != 0 || !strings.Contains(out, "no control actions") {
		t.Fatalf("audit --plan --since a minute ahead: exit %d: %s%s", code, out, errOut)
	}
	if code, _, _ = sidecartest.Run(t, "audit", "--server", server); code != sidecartest.ExitUsage {
		t.Fatalf("audit without a run or a filter: exit %d, want usage", code)
	}
}
