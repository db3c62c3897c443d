package archive_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
)

// TestArchive_DirectoryThatWentAwayIsNotMadeAgain: a file:// archive
// whose directory disappears under a writer (a volume unmounted, the
// directory moved) takes no more writes, and the directory is not made
// again: a writer that made it and chained on from the head it knew
// wrote the next manifests where no one looks, and the real archive,
// back, had a hole (and the runs of that manifest had left hot state).
// Back, the archive takes the writes again, chained as before.
func TestArchive_DirectoryThatWentAwayIsNotMadeAgain(t *testing.T) {
	ctx := context.Background()
	dir, root := openDir(t)
	a := mustOpen(t, dir)
	if _, err := a.Write(ctx, finishedRuns(t, "first", 2)); err != nil {
		t.Fatal(err)
	}
	away := root + ".away"
	if err := os.Rename(root, away); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(ctx, finishedRuns(t, "second", 2)); !errors.Is(err, archive.ErrUnavailable) {
		t.Fatalf("a write with the archive's directory gone: %v, want ErrUnavailable", err)
	}
	if _, err := os.Stat(root); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the archive's directory was made again (%v)", err)
	}
	if err := os.Rename(away, root); err != nil {
		t.Fatal(err)
	}
	m, err := a.Write(ctx, finishedRuns(t, "second", 2))
	if err != nil {
		t.Fatalf("a write with the directory back: %v", err)
	}
	if m.Seq != 2 {
		t.Fatalf("manifest %d written, want 2", m.Seq)
	}
	if rep := mustVerify(t, dir, archive.VerifyOptions{}); len(rep.Problems) != 0 || rep.Runs != 4 {
		t.Fatalf("verify after the directory came back: %d runs, problems %v", rep.Runs, rep.Problems)
	}
}

// TestArchive_DirectoryEmptiedUnderTheWriter: the directory is there but
// no longer holds the archive the writer wrote to (a mount point whose
// volume went away, a directory replaced by an empty one): the manifest
// the writer would chain on to is missing, so nothing is written, rather
// than a manifest after a gap in a directory nobody reads.
func TestArchive_DirectoryEmptiedUnderTheWriter(t *testing.T) {
	ctx := context.Background()
	dir, root := openDir(t)
	a := mustOpen(t, dir)
	if _, err := a.Write(ctx, finishedRuns(t, "first", 2)); err != nil {
		t.Fatal(err)
	}
	away := filepath.Join(t.TempDir(), "volume")
	if err := os.Rename(root, away); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(root, 0o750); err != nil { // the bare mount point
		t.Fatal(err)
	}
	if _, err := a.Write(ctx, finishedRuns(t, "second", 2)); !errors.Is(err, archive.ErrUnavailable) {
		t.Fatalf("a write to an emptied directory: %v, want ErrUnavailable", err)
	}
	if left, _ := os.ReadDir(root); len(left) != 0 {
		t.Fatalf("the emptied directory got %d entries", len(left))
	}
	if err := os.Remove(root); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(away, root); err != nil {
		t.Fatal(err)
	}
	if m, err := a.Write(ctx, finishedRuns(t, "second", 2)); err != nil || m.Seq != 2 {
		t.Fatalf("a write with the volume back: %v (%+v)", err, m)
	}
	if rep := mustVerify(t, dir, archive.VerifyOptions{}); len(rep.Problems) != 0 || rep.Runs != 4 {
		t.Fatalf("verify after the volume came back: %d runs, problems %v", rep.Runs, rep.Problems)
	}
}

// TestDir_PutNeverMakesTheRoot: a write makes the directories of its
// object under the archive's directory, never that directory itself
// (only CheckWritable, at start, does): the guard that stays when the
// directory goes away between the writer's read of its head and its
// write.
func TestDir_PutNeverMakesTheRoot(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "archive")
	d := archive.NewDir(root)
	for _, put := range map[string]func() error{
		"Put":    func() error { return d.Put(ctx, "segments/s.ndjson.gz", []byte("x")) },
		"PutNew": func() error { return d.PutNew(ctx, "manifests/000000000001.json", []byte("x")) },
		"top":    func() error { return d.Put(ctx, "object", []byte("x")) },
	} {
		if err := put(); !errors.Is(err, archive.ErrUnavailable) {
			t.Fatalf("a write with no directory: %v, want ErrUnavailable", err)
		}
		if _, err := os.Stat(root); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("a write made the archive's directory (%v)", err)
		}
	}
	if err := d.CheckWritable(); err != nil {
		t.Fatal(err)
	}
	if err := d.Put(ctx, "catalog/0/shard.json", []byte("x")); err != nil {
		t.Fatalf("a write under the directory: %v", err)
	}
}

// TestArchive_OneManifestLostCostsOnlyItsRuns: a process that reads an
// archive one of whose manifests is missing (or does not check) finds the
// runs of every other manifest, before and after it, under the catalog's
// ranges and past them; a run of the lost manifest answers its error
// (the run may be there). One lost object took every archived run from
// status, events and audit after a restart.
func TestArchive_OneManifestLostCostsOnlyItsRuns(t *testing.T) {
	ctx := context.Background()
	for _, lost := range []struct {
		name string
		do   func(path string) error
		want error
	}{
		{"Missing", os.Remove, archive.ErrObjectNotFound},
		{"Damaged", func(path string) error { return os.WriteFile(path, []byte("{not a manifest"), 0o640) }, archive.ErrCorrupt},
	} {
		t.Run(lost.name, func(t *testing.T) {
			dir, root := openDir(t)
			w := mustOpen(t, dir)
			var ms []*archive.Manifest
			for i := range 36 { // a full catalog range (32) and 4 past it
				m, err := w.Write(ctx, finishedRuns(t, fmt.Sprintf("m%d", i+1), 1))
				if err != nil {
					t.Fatal(err)
				}
				ms = append(ms, m)
			}
			for _, seq := range []uint64{2, 34} { // one under the range, one past it
				if err := lost.do(filepath.Join(root, "manifests", fmt.Sprintf("%012d.json", seq))); err != nil {
					t.Fatal(err)
				}
			}
			r := mustOpen(t, dir) // a process after a restart: nothing cached
			for _, m := range ms {
				_, err := r.Lookup(ctx, m.Runs[0].RunID)
				switch m.Seq {
				case 2, 34:
					if !errors.Is(err, lost.want) {
						t.Fatalf("a run of lost manifest %d: %v, want %v", m.Seq, err, lost.want)
					}
				default:
					if err != nil {
						t.Fatalf("a run of manifest %d, manifests 2 and 34 lost: %v", m.Seq, err)
					}
				}
			}
			if _, err := r.Lookup(ctx, "never-archived"); !errors.Is(err, lost.want) {
				t.Fatalf("a run of no manifest, two lost: %v, want %v (it may be in one)", err, lost.want)
			}
		})
	}
}

// TestArchive_ReadsOfAnArchiveWithoutItsHeadAreUnavailable: an archive
// whose destination lacks the newest manifest the process knows of (it
// wrote or read it; or hot state noted it: Expect) is not the archive,
// and a read there answers ErrUnavailable, not "no such run": a run that
// left hot state was not taken for one never archived while a volume was
// unmounted, and the listing did not end as if the archive were empty.
func TestArchive_ReadsOfAnArchiveWithoutItsHeadAreUnavailable(t *testing.T) {
	ctx := context.Background()
	dir, root := openDir(t)
	w := mustOpen(t, dir)
	var ms []*archive.Manifest
	for i := range 2 {
		m, err := w.Write(ctx, finishedRuns(t, fmt.Sprintf("m%d", i+1), 1))
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	first := ms[0].Runs[0].RunID
	if err := os.Rename(root, root+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(root, 0o750); err != nil { // the bare mount point
		t.Fatal(err)
	}
	unavailable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, archive.ErrUnavailable) {
			t.Fatalf("%s: %v, want ErrUnavailable", what, err)
		}
	}
	// The writer itself, its volume gone.
	_, err := w.Lookup(ctx, first)
	unavailable("a lookup by the writer", err)
	_, err = w.ManifestSeqs(ctx)
	unavailable("the listing's manifests", err)
	// A process after a restart, told the head hot state noted.
	r := mustOpen(t, dir)
	r.Expect(ms[1].Seq, ms[1].Chain)
	_, err = r.Lookup(ctx, first)
	unavailable("a lookup after a restart", err)
	_, err = r.Records(ctx, first)
	unavailable("a run's records after a restart", err)
	_, err = r.ManifestSeqs(ctx)
	unavailable("the listing after a restart", err)
	// The volume back: every read answers again.
	if err := os.Remove(root); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(root+".away", root); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Lookup(ctx, first); err != nil {
		t.Fatalf("a lookup with the volume back: %v", err)
	}
	if _, err := r.Lookup(ctx, "never-archived"); !errors.Is(err, archive.ErrRunNotFound) {
		t.Fatalf("a run never archived, the volume back: %v, want ErrRunNotFound", err)
	}
	if seqs, err := r.ManifestSeqs(ctx); err != nil || len(seqs) != 2 {
		t.Fatalf("the listing with the volume back: %v %v", seqs, err)
	}
}
