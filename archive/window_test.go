package archive_test

import (
	"context"
	"errors"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
)

// indexWindow mirrors the package's: how many of the newest manifests
// the in-memory index of runs holds.
const indexWindow = 64

// TestArchive_IndexHoldsTheNewestManifests: what an Archive keeps in
// memory per archived run follows a window of the newest manifests, not
// the archive's history. A Refresh after a restart reads only that
// window, and a writer that wrote many segments does not index them all;
// LookupRead (retention's "archived before?") answers from the window, and
// Lookup, Records and NewestSeq still find every run, older ones through
// the catalog.
func TestArchive_IndexHoldsTheNewestManifests(t *testing.T) {
	ctx := context.Background()
	const n = 300
	d, _ := openDir(t)
	c := &counting{Destination: d}
	runs := writeSegments(t, c, n)
	old, recent := runs[5], runs[n-5]

	for name, a := range map[string]*archive.Archive{"the writer": nil, "after a restart": mustOpen(t, c)} {
		if a == nil {
			// The Archive writeSegments wrote with is gone; one that wrote
			// every segment itself:
			d2, _ := openDir(t)
			a = mustOpen(t, d2)
			for i := range n {
				if _, err := a.Write(ctx, runs[i:i+1]); err != nil {
					t.Fatal(err)
				}
			}
		} else {
			c.reset()
			if err := a.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			c.mu.Lock()
			read := c.manifests
			c.mu.Unlock()
			if read > indexWindow {
				t.Fatalf("%s: Refresh of %d manifests read %d of them, want at most the newest %d", name, n+1, read, indexWindow)
			}
		}
		if _, err := a.LookupRead(ctx, old.ID); !errors.Is(err, archive.ErrRunNotFound) {
			t.Fatalf("%s: LookupRead of a run %d manifests back: %v, want ErrRunNotFound (the index holds the newest %d manifests only)", name, n-5, err, indexWindow)
		}
		if e, err := a.LookupRead(ctx, recent.ID); err != nil || e.RunID != recent.ID {
			t.Fatalf("%s: LookupRead of a run of the newest manifests: %+v, %v", name, e, err)
		}
		if recs, err := a.Records(ctx, old.ID); err != nil || len(recs) != len(old.Records) {
			t.Fatalf("%s: records of an old run: %d, %v", name, len(recs), err)
		}
	}
	// The newest copy of run 1 is in manifest n/2+1, outside the window.
	a := mustOpen(t, c)
	head := a.Head().Seq
	if seq, err := a.NewestSeq(ctx, runs[1].ID, head); err != nil || seq != n/2+1 {
		t.Fatalf("NewestSeq of run 1: %d, %v; want %d", seq, err, n/2+1)
	}
	if seq, err := a.NewestSeq(ctx, old.ID, head); err != nil || seq != 6 {
		t.Fatalf("NewestSeq of run 5: %d, %v; want 6", seq, err)
	}
	if _, err := a.NewestSeq(ctx, "never archived", head); !errors.Is(err, archive.ErrRunNotFound) {
		t.Fatalf("NewestSeq of a run never archived: %v", err)
	}
}
