package e2e

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_PauseRacesAHeldFailure: operators pause runs whose step is
// failing under onStepFailure "pause" at the moment it fails, on the real
// Conductor. Each run ends PAUSED with its step held, one
// RunPaused per pause cycle, a log without invalid transitions, and
// Conductor's workflow PAUSED.
func TestE2E_PauseRacesAHeldFailure(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	const runs = 6
	ctx := context.Background()
	var started []string
	var workflows []string
	for i := range runs {
		// Each run's step fails after a different time around the
		// pause's moment: 0.5 s plus 0 – 250 ms.
		delay := strconv.FormatFloat(0.5+float64(i)*0.05, 'f', 2, 64)
		pl := mustPlan(t, `{"planId":"`+uniq("e2e-race")+`","planVersion":"1","onStepFailure":"pause","steps":[
			{"stepId":"fails","executor":{"type":"command","argv":["sh","-c","sleep `+delay+`; exit 1"]}}]}`)
		s := submit(t, p, pl, "req-1")
		started = append(started, s.RunID)
		workflows = append(workflows, s.WorkflowID)
	}
	for _, id := range started {
		sidecartest.WaitFor(t, "the step to start", 30*time.Second, func() bool {
			return eventIndex(allEvents(t, p, id), statestore.StepStarted, "fails", 0) >= 0
		})
	}
	// Pause every run 0.6 s after its step started: right where the
	// failures land.
	time.Sleep(600 * time.Millisecond)
	var wg sync.WaitGroup
	var mu sync.Mutex
	first := 0 // operator pauses that came first (the step's pause then found the run paused)
	for _, id := range started {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := p.client.Pause(ctx, id, 300, "operator")
			if err != nil && apiCode(err) != "409 ENGINE_CONFLICT" {
				t.Errorf("pause %s: %v", id, err)
				return
			}
			if v != nil && v.Notice == "" {
				mu.Lock()
				first++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("%d of %d operator pauses were recorded; the others found the run paused by its failure", first, runs)
	for i, id := range started {
		sidecartest.WaitFor(t, "the failure to be held", 30*time.Second, func() bool {
			v, err := p.client.Run(ctx, id)
			return err == nil && v.Status == statestore.RunStatusPaused && v.Step("fails") != nil && v.Step("fails").Held
		})
		evs := allEvents(t, p, id)
		validLog(t, evs)
		if n := count(evs, statestore.RunPaused, ""); n != 1 {
			t.Fatalf("run %s: %d RunPaused, want 1\n%v", id, n, types(evs))
		}
		sidecartest.WaitFor(t, "Conductor's workflow to be paused", 30*time.Second, func() bool { return conductorStatus(t, workflows[i]) == "PAUSED" })
		if _, err := p.client.Cancel(ctx, id, "test done"); err != nil {
			t.Fatal(err)
		}
	}
}
