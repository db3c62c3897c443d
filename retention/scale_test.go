package retention_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// listingDest is a directory that counts the listings asked of it: on S3
// each is a LIST request, on a directory a walk of every manifest.
type listingDest struct {
	*archive.Dir
	lists atomic.Int64
}

func (d *listingDest) List(ctx context.Context, prefix string) ([]string, error) {
	d.lists.Add(1)
	return d.Dir.List(ctx, prefix)
}

// TestRetention_ArchiveListedPerSegment: working off a backlog, retention
// reads the archive's listing of manifests once per segment it archives,
// not once per run (which made each run's removal cost grow with the
// archive: a walk of every manifest, or an S3 LIST, per run); and it
// still finds a run that an earlier process archived but did not remove,
// and does not archive it again.
func TestRetention_ArchiveListedPerSegment(t *testing.T) {
	ctx := context.Background()
	const runs, batch = 30, 10
	h := newHot(t, runs, 0, nil)
	// An earlier process archived run-7 and died before removing it.
	earlier := h.archive(nil)
	if _, err := earlier.Write(ctx, []archive.Run{{ID: "run-7", Records: h.finished["run-7"]}}); err != nil {
		t.Fatal(err)
	}
	dest := &listingDest{Dir: archive.NewDir(h.dir)}
	arch := h.archive(dest)
	dest.lists.Store(0)
	r := h.retention(arch, h.remover(), retention.Options{BatchRuns: batch})
	res, err := r.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Removed != runs || res.Archived != runs-1 {
		t.Fatalf("pass: %+v, want %d removed and %d archived (run-7 was archived before)", res, runs, runs-1)
	}
	// One listing per due batch, and one for the last look that finds
	// nothing due: segments+1, whatever the number of runs.
	if n, most := dest.lists.Load(), int64(runs/batch+1); n > most {
		t.Fatalf("the archive was listed %d times for %d runs in %d segments, want at most %d", n, runs, runs/batch, most)
	}
	h.requireSafe(true)
}

// TestRetention_LedgerWrittenPerBatch: removing a segment's runs writes
// the JetStream removal ledger once with the archive's head, once before
// the batch's purges and once after, not twice per run (which made each
// removal a chain of round trips, one run at a time), and every run still
// leaves, accounted for.
func TestRetention_LedgerWrittenPerBatch(t *testing.T) {
	ctx := context.Background()
	const runs = 64
	h := newHot(t, runs, 0, nil)
	kv, err := h.js.KeyValue(ctx, natsstore.DefaultStateBucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, natsstore.DefaultStream+".removed", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	r := h.retention(h.archive(nil), h.remover(), retention.Options{BatchRuns: runs})
	res, err := r.Pass(ctx)
	if err != nil || res.Removed != runs {
		t.Fatalf("pass: %+v, %v; want %d removed", res, err, runs)
	}
	h.requireSafe(true)
	// The last write (the batch done) was acknowledged before the pass
	// returned; the watch has it once the ledger's value says so.
	writes := 0
	deadline := time.After(2 * time.Minute)
	for done := false; !done; {
		select {
		case e := <-w.Updates():
			writes++
			var l struct {
				Removed uint64 `json:"removed"`
				Batch   []any  `json:"batch"`
			}
			done = json.Unmarshal(e.Value(), &l) == nil && l.Removed == 4*runs && len(l.Batch) == 0
		case <-deadline:
			t.Fatalf("the ledger's last write did not arrive after %d writes", writes)
		}
	}
	if writes > 3 {
		t.Fatalf("the removal ledger was written %d times for %d runs in one segment, want 3 (the archive's head, pending, done)", writes, runs)
	}
}

// TestRetention_ForgettersRunConcurrently: the Forgetters of a segment's
// runs run for several runs at once, at most ForgetInFlight, each run's
// in order and before its records leave.
func TestRetention_ForgettersRunConcurrently(t *testing.T) {
	ctx := context.Background()
	const runs = 40
	h := newHot(t, runs, 0, nil)
	var in, most atomic.Int64
	deadline := time.Now().Add(2 * time.Minute) // a safety net for the whole pass
	var order sync.Map                          // runID -> Forgetters called, in order
	first := forgetFunc(func(ctx context.Context, runID string) error {
		n := in.Add(1)
		defer in.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		// Wait for a second run to be forgotten alongside, then a moment
		// for more to pile in.
		for most.Load() < 2 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
		order.Store(runID, "first")
		return nil
	})
	second := forgetFunc(func(ctx context.Context, runID string) error {
		if v, _ := order.Load(runID); v != "first" {
			return fmt.Errorf("run %s: second Forgetter before the first", runID)
		}
		if recs, err := h.store.Fetch(ctx, runID, 0, 0); err != nil || len(recs) == 0 {
			return fmt.Errorf("run %s: records gone before its Forgetters ran (%v)", runID, err)
		}
		order.Store(runID, "second")
		return nil
	})
	r := h.retention(h.archive(nil), h.remover(), retention.Options{BatchRuns: runs, Forgetters: []retention.Forgetter{first, second}})
	res, err := r.Pass(ctx)
	if err != nil || res.Removed != runs {
		t.Fatalf("pass: %+v, %v; want %d removed", res, err, runs)
	}
	if m := most.Load(); m < 2 || m > retention.ForgetInFlight {
		t.Fatalf("%d runs' Forgetters ran at once, want 2 to %d", m, retention.ForgetInFlight)
	}
	h.requireSafe(true)
}
