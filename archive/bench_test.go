package archive_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/archive/archivetest"
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
			benchWriteVsRaw(b, n, func(dir string) archive.Destination { return archive.NewDir(filepath.Join(dir, "archive")) })
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
