package drain_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestController_NoPauseOrResumeOnceCancelRequested: once the run's
// cancel is requested (RunCancelRequested in the log, RunCancelled not
// yet: the terminate is in flight), a pause and a resume, single or bulk,
// answer INVALID_TRANSITION, append nothing and call Conductor for
// nothing: Cancel wins, and a pause or resume sent to a workflow being
// terminated could undo the terminate.
func TestController_NoPauseOrResumeOnceCancelRequested(t *testing.T) {
	ctx := context.Background()
	cancelRequested := storetest.Event("r", statestore.RunCancelRequested, "")
	refused := func(t *testing.T, what string, err error) {
		t.Helper()
		var se *statestore.Error
		if !errors.Is(err, statestore.ErrInvalidTransition) || !errors.As(err, &se) || !strings.Contains(se.Message, "cancel") {
			t.Fatalf("%s of a run whose cancel is requested: %v, want INVALID_TRANSITION naming the cancel", what, err)
		}
	}
	check := func(t *testing.T, mem interface {
		Fetch(context.Context, string, int64, int) ([]statestore.RunEventRecord, error)
	}, eng *engine, events, calls int) {
		t.Helper()
		recs, _ := mem.Fetch(ctx, "r", 0, 0)
		if len(recs) != events || len(eng.calls) != calls {
			t.Fatalf("refused requests left the log %s (want %d events) and called Conductor %v (want %d calls)", types(recs), events, eng.calls, calls)
		}
	}
	t.Run("Running", func(t *testing.T) {
		mem, eng := setup(t, "a")
		c := newController(t, mem, eng, nil, nil)
		mem.Append(ctx, cancelRequested)
		_, err := c.Pause(ctx, "r", drain.PauseRequest{})
		refused(t, "pause", err)
		_, err = c.Resume(ctx, "r", drain.ResumeRequest{})
		refused(t, "resume", err)
		for _, o := range c.PauseMany(ctx, []string{"r"}, drain.PauseRequest{}) {
			refused(t, "bulk pause", o.Err)
		}
		check(t, mem, eng, 3, 0)
	})
	t.Run("Paused", func(t *testing.T) {
		mem, eng := setup(t, "a")
		c := newController(t, mem, eng, nil, nil)
		if _, err := c.Pause(ctx, "r", drain.PauseRequest{}); err != nil {
			t.Fatal(err)
		}
		recs, _ := mem.Fetch(ctx, "r", 0, 0)
		calls := len(eng.calls)
		mem.Append(ctx, cancelRequested)
		_, err := c.Resume(ctx, "r", drain.ResumeRequest{})
		refused(t, "resume", err)
		_, err = c.Pause(ctx, "r", drain.PauseRequest{})
		refused(t, "pause", err)
		for _, o := range c.ResumeMany(ctx, []string{"r"}, drain.ResumeRequest{}) {
			refused(t, "bulk resume", o.Err)
		}
		for _, o := range c.PauseMany(ctx, []string{"r"}, drain.PauseRequest{}) {
			refused(t, "bulk pause", o.Err)
		}
		check(t, mem, eng, len(recs)+1, calls)
	})
}

// heldTerminate is the engine fake whose terminates wait for release
// once entered is told.
type heldTerminate struct {
	*engine
	entered chan struct{}
	release chan struct{}
}

func (e heldTerminate) Terminate(ctx context.Context, wf, reason string) error {
	e.entered <- struct{}{}
	<-e.release
	return e.engine.Terminate(ctx, wf, reason)
}

func (e heldTerminate) WorkflowStatus(context.Context, string) (string, error) {
	return drain.EngineRunning, nil
}

// TestFollower_CompletesACancelCutShort: the Follower, told that the
// workflow of a run whose cancel is requested still runs, completes the
// cancel (terminate, RunCancelled requestedBy sidecar), unless the
// Controller's own cancel of the run is under way in this process: then
// the terminate is the Controller's alone.
func TestFollower_CompletesACancelCutShort(t *testing.T) {
	ctx := context.Background()
	t.Run("CutShort", func(t *testing.T) {
		mem, eng := setup(t, "a")
		mem.Append(ctx, storetest.WithPayload(storetest.Event("r", statestore.RunCancelRequested, ""),
			statestore.RunCancelRequestedPayload{Reason: "stop", RequestedBy: "op"}))
		f := drain.NewFollower(mem, emitter{mem}, followEngine{engine: eng, status: drain.EngineRunning}, &ledger{}, drain.FollowerOptions{Calls: drain.NewCalls()})
		action, err := f.Saw(ctx, "r", "wf1", drain.EngineRunning)
		if err != nil || action != drain.FollowCancelCompleted {
			t.Fatalf("Saw: %q %v, want %q", action, err, drain.FollowCancelCompleted)
		}
		snap, _ := mem.ProjectSnapshot(ctx, "r")
		if snap.Status != statestore.RunStatusCancelled || len(eng.calls) != 1 || eng.calls[0] != "terminate wf1" {
			t.Fatalf("run %s, Conductor calls %v: want CANCELLED after one terminate", snap.Status, eng.calls)
		}
		// The cancel is the operator's: completing it does not make it
		// the sidecar's.
		recs, _ := mem.Fetch(ctx, "r", 0, 0)
		if got := storetest.RequestedBy(recs[len(recs)-1:], "op"); len(got) != 1 || got[0] != statestore.RunCancelled {
			t.Fatalf("RunCancelled %s: want requestedBy op, who requested the cancel", recs[len(recs)-1].Payload)
		}
	})
	t.Run("ControllerCancelUnderWay", func(t *testing.T) {
		mem, eng := setup(t, "a")
		held := heldTerminate{engine: eng, entered: make(chan struct{}, 4), release: make(chan struct{})}
		calls := drain.NewCalls()
		c := drain.New(mem, emitter{mem}, held, drain.Options{Calls: calls, Logger: zaptest.NewLogger(t)})
		f := drain.NewFollower(mem, emitter{mem}, held, &ledger{}, drain.FollowerOptions{Calls: calls})
		done := make(chan error, 1)
		go func() {
			_, err := c.Cancel(ctx, "r", "operator", "op")
			done <- err
		}()
		<-held.entered // RunCancelRequested is in, the terminate under way
		type sawResult struct {
			action string
			err    error
		}
		saw := make(chan sawResult, 1)
		go func() {
			action, err := f.Saw(ctx, "r", "wf1", drain.EngineRunning)
			saw <- sawResult{action, err}
		}()
		select {
		case r := <-saw:
			if r.err != nil || r.action != "" {
				t.Errorf("Saw while the Controller's cancel terminates: %q %v, want nothing done", r.action, r.err)
			}
		case <-held.entered:
			t.Error("the Follower terminated the workflow while the Controller's cancel was under way")
		}
		close(held.release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		recs, _ := mem.Fetch(ctx, "r", 0, 0)
		var payload struct{ RequestedBy string }
		_ = json.Unmarshal(recs[len(recs)-1].Payload, &payload)
		if got := types(recs); !strings.HasSuffix(got, "RunCancelRequested RunCancelled") || payload.RequestedBy != "op" {
			t.Fatalf("log %s, RunCancelled by %q: want the Controller's RunCancelled", got, payload.RequestedBy)
		}
	})
}

// TestController_CancelledNamesWhoseCancelWasRecorded: a cancel that finds
// another principal's cancel already recorded completes it, and its
// RunCancelled names that principal and reason, not its own (two cancels
// racing: only the first one's RunCancelRequested is in the log).
func TestController_CancelledNamesWhoseCancelWasRecorded(t *testing.T) {
	ctx := context.Background()
	mem, eng := setup(t, "a")
	mem.Append(ctx, storetest.WithPayload(storetest.Event("r", statestore.RunCancelRequested, ""),
		statestore.RunCancelRequestedPayload{Reason: "by-acme", RequestedBy: "acme-op"}))
	c := drain.New(mem, emitter{mem}, eng, drain.Options{Logger: zaptest.NewLogger(t)})
	if _, err := c.Cancel(ctx, "r", "by-admin", "admin"); err != nil {
		t.Fatal(err)
	}
	recs, _ := mem.Fetch(ctx, "r", 0, 0)
	last := recs[len(recs)-1]
	var p statestore.RunCancelledPayload
	_ = json.Unmarshal(last.Payload, &p)
	if last.EventType != statestore.RunCancelled || p.RequestedBy != "acme-op" || p.Reason != "by-acme" {
		t.Fatalf("log %s ends with %s %s; want RunCancelled by acme-op, reason by-acme: the cancel recorded", types(recs), last.EventType, last.Payload)
	}
}
