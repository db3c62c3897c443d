package retention_test

import (
	"context"
	"testing"

	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestRetention_RunReadWhileItRan: a run whose state was read while it
// ran (as serve's API, watcher and workers do all the time) is removed
// once due: whether it ended is decided from its records, not from a
// snapshot the store cached before its end.
func TestRetention_RunReadWhileItRan(t *testing.T) {
	ctx := context.Background()
	h := newHot(t, 0, 0, nil)
	const id = "read-while-running"
	appendAs := func(w *statestore.RunEventWrite) {
		t.Helper()
		w.TenantID = "tenant_acme"
		if _, err := h.store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	appendAs(storetest.Event(id, statestore.RunStarted, ""))
	if snap, err := h.store.ProjectSnapshot(ctx, id); err != nil || snap.Status != statestore.RunStatusRunning {
		t.Fatalf("snapshot while running: %+v %v", snap, err)
	}
	appendAs(storetest.Event(id, statestore.RunCompleted, ""))
	recs, err := h.store.Fetch(ctx, id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	h.finished[id] = recs
	r := h.retention(h.archive(nil), h.remover(), retention.Options{})
	res, err := r.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Removed != 1 || res.Archived != 1 {
		t.Fatalf("pass: %+v, want the finished run archived and removed", res)
	}
	h.requireSafe(true)
}

// TestRetention_RunNotEndedByItsRecordsStays: a run queued on a terminal
// event that did not end it (cancel wins: RunCompleted after
// RunCancelRequested leaves the run to its RunCancelled) is not removed
// when due; its RunCancelled queues it again, and then it leaves.
func TestRetention_RunNotEndedByItsRecordsStays(t *testing.T) {
	ctx := context.Background()
	h := newHot(t, 0, 0, nil)
	const id = "cancel-wins"
	appendAs := func(w *statestore.RunEventWrite) {
		t.Helper()
		w.TenantID = "tenant_acme"
		if _, err := h.store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	appendAs(storetest.Event(id, statestore.RunStarted, ""))
	appendAs(storetest.Event(id, statestore.RunCancelRequested, ""))
	appendAs(storetest.Event(id, statestore.RunCompleted, ""))
	r := h.retention(h.archive(nil), h.remover(), retention.Options{})
	if res, err := r.Pass(ctx); err != nil || res.Archived != 0 || res.Removed != 0 {
		t.Fatalf("pass before RunCancelled: %+v %v, want nothing archived or removed", res, err)
	}
	if recs, err := h.store.Fetch(ctx, id, 0, 0); err != nil || len(recs) != 3 {
		t.Fatalf("run %s has %d records (%v) before its RunCancelled, want all 3", id, len(recs), err)
	}
	appendAs(storetest.Event(id, statestore.RunCancelled, ""))
	recs, err := h.store.Fetch(ctx, id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	h.finished[id] = recs
	if res, err := r.Pass(ctx); err != nil || res.Archived != 1 || res.Removed != 1 {
		t.Fatalf("pass after RunCancelled: %+v %v, want the run archived and removed", res, err)
	}
	h.requireSafe(true)
}
