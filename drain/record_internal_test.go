package drain

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

type memEmitter struct{ s *memstore.Store }

func (e memEmitter) Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	w.EventID = uuid.NewString()
	return e.s.Append(ctx, w)
}

func (e memEmitter) EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	w.EventID = uuid.NewString()
	return e.s.AppendIf(ctx, w, lastSeq)
}

// TestFollower_RecordGuard: the Follower's (and the Controller's) record
// of a pause or resume is checked against the state it was decided on: an
// event that state does not allow is refused with INVALID_TRANSITION and
// nothing is appended, conditional or not.
func TestFollower_RecordGuard(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	mem.Append(ctx, storetest.Event("r", statestore.RunStarted, ""))
	snap, err := mem.ProjectSnapshot(ctx, "r")
	if err != nil || snap.Status != statestore.RunStatusRunning {
		t.Fatalf("snapshot %+v %v, want RUNNING", snap, err)
	}
	for _, c := range []struct {
		event       string
		cycle       int64
		conditional bool
	}{
		{statestore.RunResumed, 1, false}, // no pause to close
		{statestore.RunResumed, 1, true},
		{statestore.RunPaused, 2, true}, // skips cycle 1
		{statestore.RunPaused, 2, false},
	} {
		_, err := record(ctx, memEmitter{mem}, snap, c.event, c.cycle, map[string]any{"requestedBy": statestore.RequestedByConductor, "reason": "test"}, time.Now, c.conditional)
		if !errors.Is(err, statestore.ErrInvalidTransition) {
			t.Errorf("%s cycle %d (conditional %v) on RUNNING: %v, want INVALID_TRANSITION", c.event, c.cycle, c.conditional, err)
		}
	}
	if recs, _ := mem.Fetch(ctx, "r", 0, 0); len(recs) != 1 {
		t.Fatalf("log has %d events, want RunStarted alone", len(recs))
	}
}
