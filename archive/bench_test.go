package archive_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/archive/archivetest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// BenchmarkArchive_WriteVsRaw measures, in the same run on the same disk,
// Archive.Write of a segment of 200 and 2,000 runs (encode, gzip, write and
// fsync, read back and check, write and read back the manifest) against a
// raw sequential gzip write of the same NDJSON bytes to one file with one
// fsync, alternating. It reports MB/s of uncompressed NDJSON and two
// ratios: "ratio" against a raw write at gzip's default level (the target
// is >= 0.5), and "ratio-same-level" against a raw write at the archive's
// own level (archive.SegmentLevel).
func BenchmarkArchive_WriteVsRaw(b *testing.B) {
	for _, n := range []int{200, 2000} {
		b.Run(fmt.Sprintf("runs=%d", n), func(b *testing.B) {
			benchWriteVsRaw(b, n, func(dir string) archive.Destination { return newDir(b, filepath.Join(dir, "archive")) })
		})
	}
	// The same into a bucket of the S3-compatible server (on loopback, its
	// files on the same disk), when SIDECAR_TEST_S3SERVER names it.
	if os.Getenv(archivetest.EnvBinary) == "" {
		return
	}
	srv := archivetest.StartS3(b)
	buckets := 0
	for _, n := range []int{200, 2000} {
		b.Run(fmt.Sprintf("dest=s3,runs=%d", n), func(b *testing.B) {
			benchWriteVsRaw(b, n, func(string) archive.Destination { buckets++; return srv.Bucket(fmt.Sprintf("bench-%d", buckets), "") })
		})
	}
}

func benchWriteVsRaw(b *testing.B, n int, dest func(dir string) archive.Destination) {
	ctx := context.Background()
	runs := finishedRuns(b, "bench", n)
	var raw bytes.Buffer
	for _, r := range runs {
		for i := range r.Records {
			line, err := archive.EncodeRecord(&r.Records[i])
			if err != nil {
				b.Fatal(err)
			}
			raw.Write(line)
			raw.WriteByte('\n')
		}
	}
	dir := b.TempDir()
	a := mustOpen(b, dest(dir))
	// The raw writers are reused, as the archive reuses its own.
	zDefault := gzip.NewWriter(nil)
	zSame, err := gzip.NewWriterLevel(nil, archive.SegmentLevel)
	if err != nil {
		b.Fatal(err)
	}
	rawWrite := func(zw *gzip.Writer) time.Duration {
		start := time.Now()
		f, err := os.Create(filepath.Join(dir, "raw.gz"))
		if err != nil {
			b.Fatal(err)
		}
		zw.Reset(f)
		if _, err := zw.Write(raw.Bytes()); err != nil {
			b.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var tArchive, tDefault, tSame time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := a.Write(ctx, runs); err != nil {
			b.Fatal(err)
		}
		tArchive += time.Since(start)
		tDefault += rawWrite(zDefault)
		tSame += rawWrite(zSame)
	}
	mb := float64(raw.Len()) * float64(b.N) / 1e6
	b.ReportMetric(mb/tArchive.Seconds(), "archive-MB/s")
	b.ReportMetric(mb/tDefault.Seconds(), "raw-MB/s")
	b.ReportMetric(tDefault.Seconds()/tArchive.Seconds(), "ratio")
	b.ReportMetric(tSame.Seconds()/tArchive.Seconds(), "ratio-same-level")
}

// BenchmarkArchive_LookupAfterRestart measures the first Lookup of a run
// by a new Archive (a process after a restart) in archives of 500 and
// 5,000 segments of 200 runs (100,000 and 1,000,000 runs) on a directory,
// each Open and Lookup of a different run. The archives are written
// through Write (so with the catalog this version builds) into
// SIDECAR_BENCH_ARCHIVE_DIR when it is set, and kept there: a binary of
// another version measures its lookups on the same archives. Without it,
// only 500 segments, in a temporary directory. "later" is the lookups
// that follow in the same process, each of a different run.
func BenchmarkArchive_LookupAfterRestart(b *testing.B) {
	ctx := context.Background()
	base, sizes := os.Getenv("SIDECAR_BENCH_ARCHIVE_DIR"), []int{500, 5000}
	if base == "" {
		base, sizes = b.TempDir(), []int{500}
	}
	const perSegment = 200
	tmpl := finishedRuns(b, "tmpl", 1)[0].Records[0]
	runID := func(seg, i int) string { return fmt.Sprintf("lookup-%d-%d", seg, i) }
	for _, segments := range sizes {
		dest := newDir(b, filepath.Join(base, fmt.Sprintf("segments-%d", segments)))
		a := mustOpen(b, dest)
		have := uint64(0)
		if h := a.Head(); h != nil {
			have = h.Seq
		}
		// The writes that complete a range of the catalog's level 1 and
		// up (every 128th, 512th, 2,048th) are timed apart from the others.
		var plain []time.Duration
		for seg := int(have); seg < segments; seg++ {
			runs := make([]archive.Run, perSegment)
			for i := range runs {
				rec := tmpl
				rec.RunID = runID(seg, i)
				runs[i] = archive.Run{ID: rec.RunID, Records: []statestore.RunEventRecord{rec}}
			}
			start := time.Now()
			if _, err := a.Write(ctx, runs); err != nil {
				b.Fatal(err)
			}
			d := time.Since(start)
			if seq := seg + 1; seq%128 == 0 {
				w := 128
				for seq%(w*4) == 0 {
					w *= 4
				}
				b.Logf("write of manifest %d (completes a range of %d manifests): %v", seq, w, d)
			} else {
				plain = append(plain, d)
			}
		}
		if len(plain) > 0 {
			slices.Sort(plain)
			b.Logf("%d other writes: median %v, 99th percentile %v, max %v", len(plain), plain[len(plain)/2], plain[len(plain)*99/100], plain[len(plain)-1])
		}
		b.Run(fmt.Sprintf("segments=%d", segments), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				a := mustOpen(b, dest)
				k := i * 7919
				id := runID(k%segments, k%perSegment)
				if e, err := a.Lookup(ctx, id); err != nil || e.RunID != id {
					b.Fatalf("lookup of %q: %+v, %v", id, e, err)
				}
			}
		})
		// Later lookups of one process: each of a different run.
		b.Run(fmt.Sprintf("segments=%d/later", segments), func(b *testing.B) {
			a := mustOpen(b, dest)
			for i := 0; b.Loop(); i++ {
				k := i*7919 + 1
				id := runID(k%segments, k%perSegment)
				if e, err := a.Lookup(ctx, id); err != nil || e.RunID != id {
					b.Fatalf("lookup of %q: %+v, %v", id, e, err)
				}
			}
		})
	}
}

// newDir is the archive in directory root, made as serve makes it at start
// (a writer never makes it).
func newDir(tb testing.TB, root string) *archive.Dir {
	tb.Helper()
	d := archive.NewDir(root)
	if err := d.CheckWritable(); err != nil {
		tb.Fatal(err)
	}
	return d
}
