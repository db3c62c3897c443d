package archive_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
)

// counting is a Destination that counts the objects read and the
// listings made of the Destination it wraps.
type counting struct {
	archive.Destination
	mu          sync.Mutex
	gets, lists int
}

func (c *counting) Get(ctx context.Context, name string) ([]byte, error) {
	c.mu.Lock()
	c.gets++
	c.mu.Unlock()
	return c.Destination.Get(ctx, name)
}

func (c *counting) List(ctx context.Context, prefix string) ([]string, error) {
	c.mu.Lock()
	c.lists++
	c.mu.Unlock()
	return c.Destination.List(ctx, prefix)
}

// reset returns the reads and listings counted since the last reset.
func (c *counting) reset() (gets, lists int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	gets, lists = c.gets, c.lists
	c.gets, c.lists = 0, 0
	return gets, lists
}

// writeSegments archives n segments of one run each, then the first run
// again (a second copy, one record shorter) in segment n+1.
func writeSegments(t testing.TB, d archive.Destination, n int) []archive.Run {
	t.Helper()
	ctx := context.Background()
	a := mustOpen(t, d)
	runs := finishedRuns(t, "seg", n)
	for i := range n {
		if _, err := a.Write(ctx, runs[i:i+1]); err != nil {
			t.Fatal(err)
		}
	}
	again := runs[0]
	again.Records = again.Records[:len(again.Records)-1]
	if _, err := a.Write(ctx, []archive.Run{again}); err != nil {
		t.Fatal(err)
	}
	return runs
}

// lookupReadBound is what one lookup after a restart may read, whatever
// the archive holds (up to 2^21 manifests): the catalog's shard of the
// run in at most 3 ranges of each of its 8 levels, the manifests after
// the last full range (at most 31), the probe for a manifest newer than
// the head, and the manifest the catalog names.
const lookupReadBound = 3*8 + 31 + 2

// TestArchive_LookupAfterRestart: a new Archive (a process after a
// restart) finds a run reading a bounded number of objects and listing
// nothing, however many segments the archive holds, and finds its newest
// copy; a run never archived is not found at the same cost. On every
// destination (S3 with SIDECAR_TEST_S3SERVER).
func TestArchive_LookupAfterRestart(t *testing.T) {
	sizes := map[string]int{"Dir": 680, "S3": 170}
	for name, newDest := range destinations(t) {
		t.Run(name, func(t *testing.T) { testLookupAfterRestart(t, newDest(t), sizes[name]) })
	}
}

func testLookupAfterRestart(t *testing.T, dest archive.Destination, n int) {
	ctx := context.Background()
	runs := writeSegments(t, dest, n)
	for _, i := range []int{0, 1, n / 2, n - 1} {
		c := &counting{Destination: dest}
		a := mustOpen(t, c)
		c.reset()
		e, err := a.Lookup(ctx, runs[i].ID)
		if err != nil {
			t.Fatal(err)
		}
		gets, lists := c.reset()
		t.Logf("lookup of run %d of %d segments after a restart: %d objects read, %d listings", i, n, gets, lists)
		want := int64(len(runs[i].Records))
		if i == 0 {
			want-- // its newest copy
		}
		if e.RunID != runs[i].ID || e.Records != want {
			t.Fatalf("run %d: entry %+v, want %d records", i, e, want)
		}
		if gets > lookupReadBound || lists > 0 {
			t.Fatalf("lookup of run %d of %d segments after a restart: %d objects read, %d listings (want at most %d and 0)", i, n, gets, lists, lookupReadBound)
		}
		recs, err := a.Records(ctx, runs[i].ID)
		if err != nil || int64(len(recs)) != want {
			t.Fatalf("records of run %d: %d, %v", i, len(recs), err)
		}
	}
	c := &counting{Destination: dest}
	a := mustOpen(t, c)
	c.reset()
	if _, err := a.Lookup(ctx, "never archived"); !errors.Is(err, archive.ErrRunNotFound) {
		t.Fatalf("lookup of a run never archived: %v", err)
	}
	if gets, lists := c.reset(); gets > lookupReadBound || lists > 0 {
		t.Fatalf("lookup of a run never archived, %d segments: %d objects read, %d listings", n, gets, lists)
	}
	if rep := mustVerify(t, dest, archive.VerifyOptions{}); len(rep.Problems) != 0 {
		t.Fatalf("verify: %+v", rep.Problems)
	}
}
