package retention_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/statestore"
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

// stallingLog is the hot log whose first tail stops delivering after a
// few records, as a consumer does that the server stopped serving (an
// ordered consumer whose resets failed while the server was busy); tails
// opened after it are the log's own.
type stallingLog struct {
	hotLog
	opened atomic.Int64
	after  int
}

func (l *stallingLog) Follow(ctx context.Context, afterSeq uint64) (statestore.LogTail, error) {
	t, err := l.hotLog.Follow(ctx, afterSeq)
	if err != nil || l.opened.Add(1) > 1 {
		return t, err
	}
	return &stallingTail{LogTail: t, left: l.after}, nil
}

type stallingTail struct {
	statestore.LogTail
	left    int
	through uint64
}

func (t *stallingTail) Next(ctx context.Context, limit int) ([]statestore.RunEventRecord, uint64, error) {
	if t.left <= 0 {
		return nil, t.through, nil // nothing, ever again
	}
	recs, through, err := t.LogTail.Next(ctx, min(limit, t.left))
	t.left -= len(recs)
	t.through = through
	return recs, through, err
}

// TestRetention_TailThatStops: a reader of the log that stops delivering
// while the log holds more (its last position behind the log's last
// sequence) is replaced at the next pass from where it stopped, and the
// runs after it leave; a pass does not take "nothing arrived" for "read
// to the end".
func TestRetention_TailThatStops(t *testing.T) {
	ctx := context.Background()
	const runs = 20
	h := newHot(t, runs, 0, nil)
	log := &stallingLog{hotLog: h.store, after: 10}
	r, err := retention.New(log, h.archive(nil), h.remover(), retention.Options{
		RetainFinished: time.Hour, Logger: zaptest.NewLogger(t),
		Now: func() time.Time { return time.Now().Add(2 * time.Hour) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(ctx) })
	removed := 0
	for range 3 {
		res, err := r.Pass(ctx)
		if err != nil {
			t.Fatal(err)
		}
		removed += res.Removed
	}
	if removed != runs {
		t.Fatalf("removed %d of %d finished runs in 3 passes, the log's reader having stopped after 10 records", removed, runs)
	}
	h.requireSafe(true)
}
