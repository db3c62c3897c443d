package archive

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// segmentRuns returns n finished runs; every seventh has a payload of
// big bytes, so that a line is longer than a chunk.
func segmentRuns(t *testing.T, n, big int) []Run {
	t.Helper()
	ctx := context.Background()
	s := memstore.New(statestore.ProjectorOptions{})
	var runs []Run
	for i := range n {
		id := fmt.Sprintf("run-%d", i)
		done := storetest.Event(id, statestore.StepCompleted, "s1")
		if i%7 == 3 {
			done.Payload = json.RawMessage(`{"outputs":{"blob":"` + strings.Repeat("x", big) + `"}}`)
		}
		for _, w := range []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""), storetest.Event(id, statestore.StepStarted, "s1"), done, storetest.Event(id, statestore.RunCompleted, "")} {
			if _, err := s.Append(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		recs, err := s.Fetch(ctx, id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, Run{ID: id, Records: recs})
	}
	return runs
}

// TestBuildSegment checks that the segment decompresses to EncodeRecord's
// lines, run after run, each run's SHA-256 over its lines, for segments of
// one chunk and of many, and lines longer than a chunk.
func TestBuildSegment(t *testing.T) {
	for _, tc := range []struct{ runs, big int }{{1, 0}, {300, 100}, {40, 60000}} {
		t.Run(fmt.Sprintf("runs=%d,big=%d", tc.runs, tc.big), func(t *testing.T) {
			runs := segmentRuns(t, tc.runs, tc.big)
			seg, err := buildSegment(runs)
			if err != nil {
				t.Fatal(err)
			}
			defer seg.release()
			var want bytes.Buffer
			for i, r := range runs {
				start := want.Len()
				for j := range r.Records {
					line, err := EncodeRecord(&r.Records[j])
					if err != nil {
						t.Fatal(err)
					}
					want.Write(line)
					want.WriteByte('\n')
				}
				sum := sha256.Sum256(want.Bytes()[start:])
				if got := seg.m.Runs[i].SHA256; got != hex.EncodeToString(sum[:]) {
					t.Fatalf("run %d: SHA-256 %s, want %x", i, got, sum)
				}
			}
			zr, err := gzip.NewReader(bytes.NewReader(seg.data))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(zr)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want.Bytes()) || seg.m.RawBytes != int64(want.Len()) || !bytes.Equal(bytes.Join(seg.chunks, nil), want.Bytes()) {
				t.Fatalf("segment holds %d bytes (RawBytes %d), want the %d bytes of the lines", len(got), seg.m.RawBytes, want.Len())
			}
			if err := checkReadBack(seg, append([]byte(nil), seg.data...)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCheckReadBack checks that Write's read-back check refuses stored
// bytes that differ from those written, and lines that differ from those
// compressed (the lines the run hashes are over).
func TestCheckReadBack(t *testing.T) {
	for name, change := range map[string]func(seg *segment, back []byte) []byte{
		"ByteFlipped": func(_ *segment, back []byte) []byte { back[len(back)/2] ^= 1; return back },
		// The gzip header's OS byte: the stream still decompresses to the
		// same lines, but the bytes are not those the manifest's SHA-256 is of.
		"HeaderChanged": func(_ *segment, back []byte) []byte { back[9] ^= 1; return back },
		"Truncated":     func(_ *segment, back []byte) []byte { return back[:len(back)-1] },
		"Empty":         func(_ *segment, back []byte) []byte { return nil },
		"LineChanged": func(seg *segment, back []byte) []byte {
			c := seg.chunks[len(seg.chunks)/2]
			c[len(c)/2] ^= 1
			return back
		},
		"LinesMissing": func(seg *segment, back []byte) []byte {
			seg.chunks = seg.chunks[:len(seg.chunks)-1]
			return back
		},
		"LinesExtra": func(seg *segment, back []byte) []byte {
			seg.chunks = append(seg.chunks, []byte("{}\n"))
			return back
		},
	} {
		t.Run(name, func(t *testing.T) {
			seg, err := buildSegment(segmentRuns(t, 300, 100))
			if err != nil {
				t.Fatal(err)
			}
			defer seg.release()
			if len(seg.chunks) < 2 {
				t.Fatalf("%d chunks, want several", len(seg.chunks))
			}
			back := change(seg, append([]byte(nil), seg.data...))
			if err := checkReadBack(seg, back); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v, want ErrCorrupt", err)
			}
		})
	}
}
