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
// nothing is appended, whether it is appended as it is (record) or
// fenced on the run's runSeq (statestore.Fenced, with runEvent).
func TestFollower_RecordGuard(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	mem.Append(ctx, storetest.Event("r", statestore.RunStarted, ""))
	snap, err := mem.ProjectSnapshot(ctx, "r")
	if err != nil || snap.Status != statestore.RunStatusRunning {
		t.Fatalf("snapshot %+v %v, want RUNNING", snap, err)
	}
	for _, c := range []struct {
		payload     statestore.Payload
		cycle       int64
		conditional bool
	}{
		{statestore.RunResumedPayload{RequestedBy: statestore.RequestedByConductor, Reason: "test"}, 1, false}, // no pause to close
		{statestore.RunResumedPayload{RequestedBy: statestore.RequestedByConductor, Reason: "test"}, 1, true},
		{statestore.RunPausedPayload{RequestedBy: statestore.RequestedByConductor, Reason: "test"}, 2, true}, // skips cycle 1
		{statestore.RunPausedPayload{RequestedBy: statestore.RequestedByConductor, Reason: "test"}, 2, false},
	} {
		if c.conditional {
			_, _, err = statestore.Fenced(ctx, mem, memEmitter{mem}, "r", func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
				return runEvent(s, c.payload, c.cycle, time.Now)
			})
		} else {
			_, err = record(ctx, memEmitter{mem}, snap, c.payload, c.cycle, time.Now)
		}
		if !errors.Is(err, statestore.ErrInvalidTransition) {
			t.Errorf("%s cycle %d (conditional %v) on RUNNING: %v, want INVALID_TRANSITION", c.payload.EventType(), c.cycle, c.conditional, err)
		}
	}
	if recs, _ := mem.Fetch(ctx, "r", 0, 0); len(recs) != 1 {
		t.Fatalf("log has %d events, want RunStarted alone", len(recs))
	}
}
