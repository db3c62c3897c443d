package drain_test

import (
	"context"
	"errors"
	"strings"
	"testing"

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
