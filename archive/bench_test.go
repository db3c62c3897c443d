package archive_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/archive"
)

// BenchmarkArchive_WriteVsRaw measures, in the same run on the same disk,
// Archive.Write of a segment of 200 and 2,000 runs (encode, gzip, write and fsync,
// read back and check every hash, write and read back the manifest)
// against a raw sequential gzip write of the same NDJSON bytes with one
// fsync. It reports both rates in MB/s of uncompressed NDJSON and their
// ratio (the target is >= 0.5).
func BenchmarkArchive_WriteVsRaw(b *testing.B) {
	for _, n := range []int{200, 2000} {
		b.Run(fmt.Sprintf("runs=%d", n), func(b *testing.B) { benchWriteVsRaw(b, n) })
	}
}

func benchWriteVsRaw(b *testing.B, n int) {
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
	a := mustOpen(b, archive.NewDir(filepath.Join(dir, "archive")))
	var tArchive, tRaw time.Duration
	zw := gzip.NewWriter(io.Discard) // reused, as the archive reuses its writer
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := a.Write(ctx, runs); err != nil {
			b.Fatal(err)
		}
		tArchive += time.Since(start)

		start = time.Now()
		f, err := os.Create(filepath.Join(dir, "raw.gz"))
		if err != nil {
			b.Fatal(err)
		}
		zw.Reset(f)
		zw.Write(raw.Bytes())
		zw.Close()
		f.Sync()
		f.Close()
		tRaw += time.Since(start)
	}
	mb := float64(raw.Len()) * float64(b.N) / 1e6
	b.ReportMetric(mb/tArchive.Seconds(), "archive-MB/s")
	b.ReportMetric(mb/tRaw.Seconds(), "raw-MB/s")
	b.ReportMetric(tRaw.Seconds()/tArchive.Seconds(), "ratio")
}
