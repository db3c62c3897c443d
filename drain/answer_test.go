package drain_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// readsFailAfter is the log's reads failing from a moment on (the store
// stopped answering reads between a request's append and its answer: a
// NATS node frozen); a fake, since the moment cannot be chosen on a real
// cluster.
type readsFailAfter struct {
	drain.SnapshotReader
	failing atomic.Bool
}

func (r *readsFailAfter) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	if r.failing.Load() {
		return nil, &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "fetch: context deadline exceeded"}
	}
	return r.SnapshotReader.ProjectSnapshot(ctx, runID)
}

// failingEngine makes the log's reads fail once Conductor was called.
type failingEngine struct {
	engine
	reads *readsFailAfter
}

func (e *failingEngine) Pause(ctx context.Context, wf string) error {
	e.reads.failing.Store(true)
	return e.engine.Pause(ctx, wf)
}

func (e *failingEngine) Resume(ctx context.Context, wf string) error {
	e.reads.failing.Store(true)
	return e.engine.Resume(ctx, wf)
}

// TestController_RecordedActionAnsweredWhenTheReadAfterFails: a pause or
// resume that was recorded (and reached Conductor) is answered with the
// state its own event left the run in when the log cannot be read after
// it, with a notice saying so, not 503 STORE_UNAVAILABLE as if it had not
// happened.
func TestController_RecordedActionAnsweredWhenTheReadAfterFails(t *testing.T) {
	ctx := context.Background()
	mem, _ := setup(t, "a")
	reads := &readsFailAfter{SnapshotReader: mem}
	eng := &failingEngine{reads: reads}
	c := drain.New(reads, emitter{mem}, eng, drain.Options{Logger: zaptest.NewLogger(t)})
	st, err := c.Pause(ctx, "r", drain.PauseRequest{Reason: "maint"})
	if err != nil {
		t.Fatalf("pause recorded and sent to Conductor, answered %v", err)
	}
	if st.Status != statestore.RunStatusPaused || st.Substatus != statestore.SubstatusDraining || !strings.Contains(st.Notice, "could not be read") {
		t.Fatalf("pause answered %+v, want PAUSED, DRAINING, with a notice", st)
	}
	reads.failing.Store(false)
	st, err = c.Resume(ctx, "r", drain.ResumeRequest{})
	if err != nil {
		t.Fatalf("resume recorded and sent to Conductor, answered %v", err)
	}
	if st.Status != statestore.RunStatusRunning || !strings.Contains(st.Notice, "could not be read") {
		t.Fatalf("resume answered %+v, want RUNNING with a notice", st)
	}
}
