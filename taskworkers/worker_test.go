package taskworkers

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func TestAssignment_Attempts(t *testing.T) {
	// Conductor retryCount r with E engine tries per logical attempt:
	// engine = r mod E + 1, logical = r div E + 1.
	tests := []struct {
		e, r            int
		engine, logical int64
	}{
		{1, 0, 1, 1}, {1, 1, 1, 2}, {1, 4, 1, 5},
		{2, 0, 1, 1}, {2, 1, 2, 1}, {2, 2, 1, 2}, {2, 3, 2, 2},
		{3, 5, 3, 2}, {3, 6, 1, 3},
		{0, 3, 1, 4}, // E missing counts as 1
	}
	for _, tt := range tests {
		a := &Assignment{EngineTries: tt.e}
		if engine, logical := a.Attempts(tt.r); engine != tt.engine || logical != tt.logical {
			t.Errorf("E=%d r=%d: got engine %d logical %d, want %d %d", tt.e, tt.r, engine, logical, tt.engine, tt.logical)
		}
	}
}

// flakySink appends to a real memstore but fails while down is set: the
// store outage a test cannot cause in memstore itself.
type flakySink struct {
	store *memstore.Store
	down  atomic.Bool
}

func (f *flakySink) Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	if f.down.Load() {
		return statestore.AppendResult{}, &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "down"}
	}
	return f.store.Append(ctx, w)
}

func TestOutbox_FlushKeepsOrder(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	sink := &flakySink{store: mem}
	if _, err := mem.Append(ctx, storetest.Event("r", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	o := newOutbox(sink, zaptest.NewLogger(t), nil)
	sink.down.Store(true)
	o.add(storetest.Event("r", statestore.StepStarted, "a"))
	o.add(storetest.Event("r", statestore.StepStarted, "b"))
	if err := o.flush(ctx, "r"); !errors.Is(err, statestore.ErrUnavailable) {
		t.Fatalf("flush while down: %v", err)
	}
	sink.down.Store(false)
	if err := o.flush(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Append(ctx, storetest.Event("r", statestore.StepCompleted, "a")); err != nil {
		t.Fatal(err)
	}
	recs, _ := mem.Fetch(ctx, "r", 0, 0)
	var got []string
	for _, r := range recs {
		got = append(got, r.EventType+":"+r.StepID)
	}
	want := "[RunStarted: StepStarted:a StepStarted:b StepCompleted:a]"
	if g := fmtList(got); g != want {
		t.Fatalf("log order %s, want %s", g, want)
	}
	snap, _ := mem.ProjectSnapshot(ctx, "r")
	if snap.Inconsistent {
		t.Fatal("replayed outbox produced an invalid transition")
	}
	if err := o.flush(ctx, "r"); err != nil || o.sizeLocked() != 0 {
		t.Fatalf("second flush: %v, %d left", err, o.sizeLocked())
	}
}

func fmtList(s []string) string {
	out := "["
	for i, v := range s {
		if i > 0 {
			out += " "
		}
		out += v
	}
	return out + "]"
}
