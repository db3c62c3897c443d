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
