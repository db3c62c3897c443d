package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_ScheduledResumeAcrossARestart: `pause --for` records the resume
// time with the pause (status shows it); the sidecar is killed, the time
// passes while none runs, and the restarted sidecar resumes the run at
// start (one RunResumed, requestedBy schedule); the run completes. A
// resume time in the past, or two of them, is refused.
func TestE2E_ScheduledResumeAcrossARestart(t *testing.T) {
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	p := startServe(t, dataDir, addr)
	ctx := context.Background()
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-scheduled")+`","planVersion":"1","steps":[
		{"stepId":"slow","executor":{"type":"sleep","seconds":1}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["slow"]}]}`)
	started := submit(t, p, pl, uniq("req"))
	sidecartest.WaitFor(t, "slow to start", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "slow", 0) >= 0
	})
	for _, bad := range []httpapi.PauseOptions{
		{ResumeAt: time.Now().Add(-time.Minute)},
		{ResumeAt: time.Now().Add(time.Hour), ResumeAfter: time.Hour},
	} {
		var apiErr *httpapi.Error
		if _, err := p.client.PauseWith(ctx, started.RunID, bad); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest {
			t.Fatalf("pause %+v: %v, want 400", bad, err)
		}
	}
	v, err := p.client.PauseWith(ctx, started.RunID, httpapi.PauseOptions{Reason: "maintenance", ResumeAfter: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if v.Pause == nil || v.Pause.ResumeAt == "" {
		t.Fatalf("the pause's view has no resumeAt: %+v", v.Pause)
	}
	// The drain ends first, so the run is found at start by the schedule
	// alone, not through the drain index.
	sidecartest.WaitFor(t, "the drain to end", 30*time.Second, func() bool {
		v, err := p.client.Run(ctx, started.RunID)
		return err == nil && v.Pause != nil && v.Pause.DrainEndedAt != ""
	})
	p.stop(syscall.SIGKILL)
	time.Sleep(6 * time.Second) // the resume falls due while no sidecar runs
	restarted := time.Now()
	p = startServe(t, dataDir, addr)
	if v := waitTerminal(t, p, started.RunID, 60*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s, want COMPLETED", v.Status)
	}
	var resumed []statestore.RunEventRecord
	for _, e := range allEvents(t, p, started.RunID) {
		if e.EventType == statestore.RunResumed {
			resumed = append(resumed, e)
		}
	}
	var payload struct{ RequestedBy string }
	if len(resumed) == 1 {
		_ = json.Unmarshal(resumed[0].Payload, &payload)
	}
	if len(resumed) != 1 || payload.RequestedBy != drain.RequestedBySchedule {
		t.Fatalf("%d RunResumed (requestedBy %q), want one by %q", len(resumed), payload.RequestedBy, drain.RequestedBySchedule)
	}
	// At start, from the schedule: not at the monitor's first full pass
	// (30 s later), which would also find it.
	if at, _ := time.Parse(time.RFC3339Nano, resumed[0].PersistedAt); at.Sub(restarted) > 10*time.Second {
		t.Fatalf("resumed %v after the restart, want at start", at.Sub(restarted))
	}
}
