package drain_test

import (
	"context"
	"fmt"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
)

// TestPauseMany_NotesTheLedgerOfEveryRun: a bulk pause notes in the
// engine ledger (Keys on a real JetStream KV) every run whose workflow
// Conductor's bulk call paused, with the run's pause cycle, and none
// whose workflow Conductor refused; another replica's Follower, seeing
// the workflows paused in Conductor, then takes none of them for a
// pause made in Conductor and records nothing. A bulk resume does the
// same for the resumes.
func TestPauseMany_NotesTheLedgerOfEveryRun(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	var runs []string
	for i := range 40 {
		runs = append(runs, fmt.Sprintf("r%02d", i))
	}
	runs = append(runs, "busy", "refused")
	for _, r := range runs {
		if r == "busy" {
			startRun(t, mem, r, "a")
		} else {
			startRun(t, mem, r)
		}
	}
	a, b := openKeys(t) // two replicas sharing the bucket
	eng := &bulkEngine{refuse: map[string]error{"wf-refused": &adapter.Error{Code: adapter.CodeEngineUnavailable, Op: "pause"}}}
	c := drain.New(mem, emitter{mem}, eng, drain.Options{Ledger: a, Logger: zaptest.NewLogger(t)})

	check := func(action, status string, paused bool) {
		t.Helper()
		f := drain.NewFollower(mem, emitter{mem}, followEngine{&engine{}, status}, b, drain.FollowerOptions{Logger: zaptest.NewLogger(t)})
		for _, r := range runs {
			if r == "refused" {
				continue
			}
			gotPaused, gotCycle, err := b.EngineState(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			if gotPaused != paused || gotCycle != 1 {
				t.Errorf("after the bulk %s, %s's ledger note is paused=%v cycle %d, want paused=%v cycle 1", action, r, gotPaused, gotCycle, paused)
			}
			before := eventTypes(t, mem, r)
			did, err := f.Saw(ctx, r, "wf-"+r, status)
			if err != nil {
				t.Fatal(err)
			}
			if after := eventTypes(t, mem, r); did != "" || after != before {
				t.Errorf("after the bulk %s, the Follower seeing %s's workflow %s did %q and the log went from %q to %q, want nothing", action, r, status, did, before, after)
			}
		}
	}

	for _, o := range c.PauseMany(ctx, runs, drain.PauseRequest{Reason: "incident", RequestedBy: "ops"}) {
		if o.Err != nil && o.RunID != "refused" {
			t.Fatalf("pause %s: %v", o.RunID, o.Err)
		}
	}
	if paused, cycle, err := b.EngineState(ctx, "refused"); err != nil || paused || cycle != 0 {
		t.Errorf("refused's ledger note is paused=%v cycle %d (%v), want none: Conductor did not pause its workflow", paused, cycle, err)
	}
	check("pause", drain.EnginePaused, true)

	runs = runs[:len(runs)-1] // refused stays paused in the log only
	for _, o := range c.ResumeMany(ctx, runs, drain.ResumeRequest{RequestedBy: "ops"}) {
		if o.Err != nil {
			t.Fatalf("resume %s: %v", o.RunID, o.Err)
		}
	}
	check("resume", drain.EngineRunning, false)
}
