package retention_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/retention"
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
