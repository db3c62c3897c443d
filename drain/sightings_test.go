package drain_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
)

// graceEnv is a replica's Follower that is not alone, over runs the
// sidecar paused and resumed (pause cycle 1, RUNNING), whose workflows
// Conductor shows PAUSED; the engine ledger is Keys on a real JetStream
// KV.
type graceEnv struct {
	mem    *memstore.Store
	keys   *drain.Keys
	clock  *testClock
	engine *statusEngine
	f      *drain.Follower
}

// statusEngine is the engine fake with the workflow status the test sets.
type statusEngine struct {
	*engine
	mu     sync.Mutex
	status string
}

func (e *statusEngine) WorkflowStatus(context.Context, string) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.status, nil
}

func (e *statusEngine) set(status string) {
	e.mu.Lock()
	e.status = status
	e.mu.Unlock()
}

func newGraceEnv(t *testing.T, maxSightings int, runs ...string) *graceEnv {
	t.Helper()
	ctx := context.Background()
	e := &graceEnv{mem: memstore.New(statestore.ProjectorOptions{}), clock: &testClock{}}
	e.keys, _ = openKeys(t)
	c := drain.New(e.mem, emitter{e.mem}, &engine{}, drain.Options{Ledger: e.keys, Logger: zaptest.NewLogger(t)})
	for _, r := range runs {
		startRun(t, e.mem, r)
		if _, err := c.Pause(ctx, r, drain.PauseRequest{Reason: "test"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Resume(ctx, r, drain.ResumeRequest{Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	e.engine = &statusEngine{engine: &engine{}, status: drain.EnginePaused}
	e.f = drain.NewFollower(e.mem, emitter{e.mem}, e.engine, e.keys,
		drain.FollowerOptions{MaxSightings: maxSightings, Now: e.clock.Now, Logger: zaptest.NewLogger(t)})
	return e
}

// check has the Follower check run (its workflow as e.engine says) and
// fails unless it did want; what it did must show in the log.
func (e *graceEnv) check(t *testing.T, run, want, why string) {
	t.Helper()
	before := eventTypes(t, e.mem, run)
	status, _ := e.engine.WorkflowStatus(context.Background(), "wf-"+run)
	did, err := e.f.Saw(context.Background(), run, "wf-"+run, status)
	if err != nil {
		t.Fatal(err)
	}
	after := eventTypes(t, e.mem, run)
	if did != want || (want == "") != (after == before) {
		t.Fatalf("%s: %s: the Follower did %q and the log went from %q to %q, want %q", run, why, did, before, after, want)
	}
}

// TestFollower_ConductorMoveLastsTheGrace: a Follower that may not be
// alone puts a difference between Conductor and the log down to an
// action in Conductor only when two checks at least the grace apart saw
// the same difference: the same log state and cycle, the same engine
// ledger note and revision, the same status in Conductor.
func TestFollower_ConductorMoveLastsTheGrace(t *testing.T) {
	t.Run("decided once it lasted the grace", func(t *testing.T) {
		e := newGraceEnv(t, 0, "r")
		e.check(t, "r", "", "first check")
		e.check(t, "r", "", "second check at once")
		e.clock.Advance(drain.DefaultGrace / 2)
		e.check(t, "r", "", "half the grace after the first check")
		e.clock.Advance(drain.DefaultGrace / 2)
		e.check(t, "r", drain.FollowConductorPaused, "the grace after the first check")
	})
	t.Run("a ledger note in between starts it over", func(t *testing.T) {
		e := newGraceEnv(t, 0, "r")
		e.check(t, "r", "", "first check")
		// Another replica's late pause of cycle 1 lands and notes the
		// ledger, and its settle's resume notes it again: the same state,
		// a later revision.
		ctx := context.Background()
		if err := e.keys.NoteEngine(ctx, "r", true, 1); err != nil {
			t.Fatal(err)
		}
		if err := e.keys.NoteEngine(ctx, "r", false, 1); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(drain.DefaultGrace)
		e.check(t, "r", "", "the grace after the first check, the ledger noted in between")
		e.clock.Advance(drain.DefaultGrace)
		e.check(t, "r", drain.FollowConductorPaused, "the grace after the second check")
	})
	t.Run("a check in step starts it over", func(t *testing.T) {
		e := newGraceEnv(t, 0, "r")
		e.check(t, "r", "", "first check")
		// The late call's correction lands: in step again.
		e.engine.set(drain.EngineRunning)
		e.check(t, "r", "", "a check in step")
		e.clock.Advance(drain.DefaultGrace)
		// Paused in Conductor, with the log, the ledger and its revision
		// as at the first check: a new difference.
		e.engine.set(drain.EnginePaused)
		e.check(t, "r", "", "the first check of a new difference")
		e.clock.Advance(drain.DefaultGrace)
		e.check(t, "r", drain.FollowConductorPaused, "a grace later")
	})
	t.Run("a run never paused is decided at once", func(t *testing.T) {
		e := newGraceEnv(t, 0)
		startRun(t, e.mem, "fresh")
		e.check(t, "fresh", drain.FollowConductorPaused, "first check of a run never paused (no call of the sidecar's to land late)")
	})
	t.Run("past the cap a difference is decided later, never at once", func(t *testing.T) {
		e := newGraceEnv(t, 1, "a", "b")
		e.check(t, "a", "", "first check")
		e.check(t, "b", "", "first check, nothing remembered (full)")
		e.clock.Advance(drain.DefaultGrace)
		e.check(t, "b", "", "a grace later, but never remembered")
		e.check(t, "a", drain.FollowConductorPaused, "a grace after the first check")
		e.check(t, "b", "", "remembered now")
		e.clock.Advance(drain.DefaultGrace)
		e.check(t, "b", drain.FollowConductorPaused, "a grace after it was remembered")
	})
	t.Run("a full memory drops what is too old to be checked again", func(t *testing.T) {
		e := newGraceEnv(t, 1, "gone", "b")
		e.check(t, "gone", "", "first check (never checked again)")
		e.clock.Advance(time.Hour)
		e.check(t, "b", "", "first check")
		e.clock.Advance(drain.DefaultGrace)
		e.check(t, "b", drain.FollowConductorPaused, "a grace after the first check")
	})
}
