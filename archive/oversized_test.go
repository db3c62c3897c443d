package archive_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/archive/archivetest"
)

// oversize is the size a damaged or hostile object is made to have:
// sparse on disk, so it costs no space, but a reader that reads it whole
// allocates it.
const oversize = 512 << 20

// TestArchive_AnOversizedObjectIsNotReadWhole: a segment larger than its
// manifest says, and a manifest larger than any the writer makes, are
// refused as corrupt without being read whole, by a run's read and by
// Verify, on a directory and on S3. Before, each read allocated the
// object's size (a 1 GiB segment in place of a 1 KB one took serve from
// 72 MB to 2.1 GB on one status call).
func TestArchive_AnOversizedObjectIsNotReadWhole(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		// open gives the destination and the file on disk of an object.
		open func(t *testing.T) (archive.Destination, func(name string) string)
	}{
		{"dir", func(t *testing.T) (archive.Destination, func(string) string) {
			dir, root := openDir(t)
			return dir, func(name string) string { return filepath.Join(root, name) }
		}},
		{"s3", func(t *testing.T) (archive.Destination, func(string) string) {
			srv := archivetest.StartS3(t)
			return srv.Bucket("oversized", "a"), func(name string) string { return srv.ObjectFile("oversized", "a/"+name) }
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dest, file := c.open(t)
			a := mustOpen(t, dest)
			runs := finishedRuns(t, "o-"+c.name, 3)
			var ms []*archive.Manifest
			for _, r := range runs {
				m, err := a.Write(ctx, []archive.Run{r})
				if err != nil {
					t.Fatal(err)
				}
				ms = append(ms, m)
			}
			grow(t, file(ms[0].Segment))
			grow(t, file(fmt.Sprintf("manifests/%012d.json", ms[1].Seq)))

			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			if _, err := mustOpen(t, dest).Records(ctx, runs[0].ID); !errors.Is(err, archive.ErrCorrupt) {
				t.Fatalf("the run of the oversized segment: %v, want ErrCorrupt", err)
			}
			if _, err := mustOpen(t, dest).Records(ctx, runs[1].ID); !errors.Is(err, archive.ErrCorrupt) && !errors.Is(err, archive.ErrRunNotFound) {
				t.Fatalf("the run of the oversized manifest: %v, want ErrCorrupt or not found", err)
			}
			rep := mustVerify(t, dest, archive.VerifyOptions{})
			runtime.ReadMemStats(&after)
			if len(rep.Problems) == 0 {
				t.Fatalf("Verify found nothing: %+v", rep)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > oversize/8 {
				t.Fatalf("reading the oversized objects allocated %d MiB, want far less than their %d MiB", got>>20, oversize>>20)
			}
		})
	}
}

// grow makes the file at p a sparse file of oversize bytes, its first
// bytes kept.
func grow(t *testing.T, p string) {
	t.Helper()
	if err := os.Truncate(p, oversize); err != nil {
		t.Fatal(err)
	}
}
