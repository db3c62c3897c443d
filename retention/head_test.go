package retention_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestRetention_AnArchiveWithoutTheNotedHeadTakesNoRun: runs that left
// hot state went to an archive whose head the store noted; a process that
// starts with an archive that does not hold that head (the volume not
// mounted yet: an empty directory; the wrong prefix) archives nothing
// there and removes nothing, rather than start a new archive that the
// next runs leave hot state for, out of the real one's reach. With the
// real archive back, the runs go there.
func TestRetention_AnArchiveWithoutTheNotedHeadTakesNoRun(t *testing.T) {
	ctx := context.Background()
	h := newHot(t, 2, 2, nil)
	r := h.retention(h.archive(nil), h.remover(), retention.Options{})
	if res, err := r.Pass(ctx); err != nil || res.Removed != 2 {
		t.Fatalf("first pass: %+v %v, want 2 removed", res, err)
	}
	r.Close(ctx)
	for _, id := range h.open { // they end: due at the next pass
		if _, err := h.store.Append(ctx, storetest.Event(id, statestore.RunCompleted, "")); err != nil {
			t.Fatal(err)
		}
		recs, err := h.store.Fetch(ctx, id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		h.finished[id] = recs
	}
	h.open = nil

	empty := archive.NewDir(t.TempDir()) // a mount point whose volume is not there
	r2 := h.retention(h.archive(empty), h.remover(), retention.Options{})
	if res, err := r2.Pass(ctx); !errors.Is(err, archive.ErrUnavailable) || res.Removed != 0 {
		t.Fatalf("a pass on an archive without the noted head: %+v %v, want ErrUnavailable, nothing removed", res, err)
	}
	if left, _ := os.ReadDir(empty.String()[len("file://"):]); len(left) != 0 {
		t.Fatalf("the other archive got %d entries", len(left))
	}
	for id, want := range h.finished {
		if _, done := map[string]bool{"run-0": true, "run-1": true}[id]; done {
			continue
		}
		if got, _ := h.store.Fetch(ctx, id, 0, 0); len(got) != len(want) {
			t.Fatalf("run %s left hot state: %d of %d records", id, len(got), len(want))
		}
	}
	r2.Close(ctx)

	// Another archive, one of its own manifests in it (another prefix).
	other := archive.NewDir(t.TempDir())
	oa := h.archive(other)
	if _, err := oa.Write(ctx, []archive.Run{{ID: "run-2", Records: h.finished["run-2"]}}); err != nil {
		t.Fatal(err)
	}
	r4 := h.retention(h.archive(other), h.remover(), retention.Options{})
	if res, err := r4.Pass(ctx); !errors.Is(err, archive.ErrCorrupt) || res.Removed != 0 {
		t.Fatalf("a pass on another archive: %+v %v, want ErrCorrupt (its manifest 1 is not the noted one), nothing removed", res, err)
	}
	if rep, err := archive.Verify(ctx, other, archive.VerifyOptions{}); err != nil || rep.Manifests != 1 {
		t.Fatalf("the other archive after the pass: %+v %v, want its one manifest", rep, err)
	}
	r4.Close(ctx)

	r3 := h.retention(h.archive(nil), h.remover(), retention.Options{})
	if res, err := r3.Pass(ctx); err != nil || res.Removed != 2 {
		t.Fatalf("a pass with the real archive back: %+v %v, want 2 removed", res, err)
	}
	h.requireSafe(true)
}

// TestRetention_RemovedBeforeHeadsWereNotedNeedsAnArchive: a store whose
// runs were removed before it noted archive heads (the ledger counts
// removed records, names no head) takes no run for an archive that holds
// no manifest at all.
func TestRetention_RemovedBeforeHeadsWereNotedNeedsAnArchive(t *testing.T) {
	ctx := context.Background()
	h := newHot(t, 2, 0, nil)
	recs := h.finished["run-0"]
	if err := h.remover().RemoveRuns(ctx, []statestore.Removal{{RunID: "run-0", LastRunSeq: uint64(recs[len(recs)-1].RunSeq), Records: uint64(len(recs))}}); err != nil {
		t.Fatal(err)
	}
	delete(h.finished, "run-0")
	empty := archive.NewDir(t.TempDir())
	r := h.retention(h.archive(empty), h.remover(), retention.Options{})
	if res, err := r.Pass(ctx); !errors.Is(err, archive.ErrUnavailable) || res.Removed != 0 {
		t.Fatalf("a pass on an empty archive after removals: %+v %v, want ErrUnavailable, nothing removed", res, err)
	}
	if got, _ := h.store.Fetch(ctx, "run-1", 0, 0); len(got) != len(h.finished["run-1"]) {
		t.Fatalf("run-1 left hot state")
	}
}
