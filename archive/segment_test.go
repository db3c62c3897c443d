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
			if err := errors.Join(seg.checkLines(), checkReadBack(seg, append([]byte(nil), seg.data...))); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// alteredDir is a Dir whose Get hands back what alter makes of the
// stored bytes: a store that damages what it keeps.
type alteredDir struct {
	*Dir
	alter func([]byte) []byte
}

func (d alteredDir) Get(ctx context.Context, name string, limit int64) ([]byte, error) {
	b, err := d.Dir.Get(ctx, name, limit)
	if err != nil {
		return nil, err
	}
	return d.alter(b), nil
}

// TestStoreSegment checks that Write's checks of a segment refuse stored
// bytes that differ from those written (checkReadBack), and compressed
// bytes that do not decompress to the lines the run hashes are over
// (checkLines), and that an unchanged segment passes.
func TestStoreSegment(t *testing.T) {
	ctx := context.Background()
	t.Run("OK", func(t *testing.T) {
		seg, err := buildSegment(segmentRuns(t, 300, 100))
		if err != nil {
			t.Fatal(err)
		}
		defer seg.release()
		seg.m.Segment = "segments/1-00.ndjson.gz"
		ran := false
		if err := storeSegment(ctx, NewDir(t.TempDir()), seg, func() { ran = true }); err != nil || !ran {
			t.Fatalf("got %v (also ran: %v), want nil", err, ran)
		}
	})
	// stored damages what the destination gives back; lines, what the
	// compressed bytes are checked against (a compressor that lost or
	// changed lines).
	type damage struct {
		stored func([]byte) []byte
		lines  func(seg *segment)
	}
	for name, d := range map[string]damage{
		"ByteFlipped": {stored: func(back []byte) []byte { back[len(back)/2] ^= 1; return back }},
		// The gzip header's OS byte: the stream still decompresses to the
		// same lines, but the bytes are not those the manifest's SHA-256 is of.
		"HeaderChanged": {stored: func(back []byte) []byte { back[9] ^= 1; return back }},
		"Truncated":     {stored: func(back []byte) []byte { return back[:len(back)-1] }},
		"Empty":         {stored: func([]byte) []byte { return nil }},
		"LineChanged": {lines: func(seg *segment) {
			c := seg.chunks[len(seg.chunks)/2]
			c[len(c)/2] ^= 1
		}},
		"LineShort": {lines: func(seg *segment) {
			i := len(seg.chunks) / 2
			seg.chunks[i] = seg.chunks[i][:len(seg.chunks[i])-1]
		}},
		"LinesMissing": {lines: func(seg *segment) { seg.chunks = seg.chunks[:len(seg.chunks)-1] }},
		"LinesExtra":   {lines: func(seg *segment) { seg.chunks = append(seg.chunks, []byte("{}\n")) }},
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
			seg.m.Segment = "segments/1-00.ndjson.gz"
			dest := alteredDir{Dir: NewDir(t.TempDir()), alter: func(b []byte) []byte { return b }}
			if d.stored != nil {
				dest.alter = d.stored
			}
			if d.lines != nil {
				d.lines(seg)
			}
			if err := storeSegment(ctx, dest, seg, nil); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v, want ErrCorrupt", err)
			}
		})
	}
}

// gzipMembers cuts data into its gzip members, each decompressed on its
// own; a member that does not decompress fails the test.
func gzipMembers(t *testing.T, data []byte) [][]byte {
	t.Helper()
	var out [][]byte
	r := bytes.NewReader(data)
	for r.Len() > 0 {
		zr, err := gzip.NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		zr.Multistream(false)
		b, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestBuildSegment_Members checks that a segment of more lines than a
// member holds is several gzip members (so that they are compressed and
// checked on several cores), each whole lines, together the segment's
// lines in order; a segment of fewer lines is one member.
func TestBuildSegment_Members(t *testing.T) {
	for _, tc := range []struct{ runs, minMembers, maxMembers int }{{1, 1, 1}, {300, 3, 1 << 20}} {
		t.Run(fmt.Sprintf("runs=%d", tc.runs), func(t *testing.T) {
			seg, err := buildSegment(segmentRuns(t, tc.runs, 100))
			if err != nil {
				t.Fatal(err)
			}
			defer seg.release()
			members := gzipMembers(t, seg.data)
			if len(members) < tc.minMembers || len(members) > tc.maxMembers {
				t.Fatalf("%d gzip members, want %d to %d", len(members), tc.minMembers, tc.maxMembers)
			}
			for i, b := range members {
				if len(b) == 0 || b[len(b)-1] != '\n' {
					t.Fatalf("member %d of %d does not end with a whole line", i, len(members))
				}
			}
			if got := bytes.Join(members, nil); int64(len(got)) != seg.m.RawBytes || !bytes.Equal(got, bytes.Join(seg.chunks, nil)) {
				t.Fatalf("members hold %d bytes, want the segment's %d lines' bytes", len(got), seg.m.RawBytes)
			}
		})
	}
}

// TestSealManifest checks that the manifest's stored form made from one
// encoding is encodeManifest's, and its Chain chainOf's.
func TestSealManifest(t *testing.T) {
	seg, err := buildSegment(segmentRuns(t, 20, 100))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.release()
	m := seg.m
	m.Seq, m.Prev, m.Segment, m.CreatedAt = 7, Genesis, "segments/1-00.ndjson.gz", "2026-01-02T03:04:05Z"
	enc, err := sealManifest(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := chainOf(m)
	if err != nil {
		t.Fatal(err)
	}
	want, err := encodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	if m.Chain != chain || !bytes.Equal(enc, want) {
		t.Fatalf("sealed chain %s, want %s; stored form differs from encodeManifest's: %v", m.Chain, chain, !bytes.Equal(enc, want))
	}
	if _, err := parseManifest(enc, 7); err != nil {
		t.Fatal(err)
	}
}

// TestDecodeSegment_Members checks that a reader takes a segment of
// several gzip members whole, and that moving, dropping, doubling or
// changing a member is found even under a manifest whose segment size and
// SHA-256 were made to match (a forger who knows the format).
func TestDecodeSegment_Members(t *testing.T) {
	seg, err := buildSegment(segmentRuns(t, 300, 100))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.release()
	if len(seg.ends) < 3 {
		t.Fatalf("%d members, want 3 or more", len(seg.ends))
	}
	m := *seg.m
	m.Seq, m.Segment = 1, "segments/1-00.ndjson.gz"
	member := func(i int) []byte {
		start := 0
		if i > 0 {
			start = seg.ends[i-1]
		}
		return seg.data[start:seg.ends[i]]
	}
	rest := func(from int) []byte { return seg.data[seg.ends[from-1]:] }
	join := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	runs, err := decodeSegment(&m, seg.data)
	if err != nil || len(runs) != 300 {
		t.Fatalf("decode: %d runs, %v; want 300", len(runs), err)
	}
	for name, data := range map[string][]byte{
		"Dropped":  join(member(0), rest(2)),
		"Swapped":  join(member(1), member(0), rest(2)),
		"Doubled":  join(member(0), member(0), rest(1)),
		"LastCut":  seg.data[:seg.ends[len(seg.ends)-2]],
		"FlipByte": func() []byte { b := bytes.Clone(seg.data); b[seg.ends[0]+len(member(1))/2] ^= 1; return b }(),
	} {
		t.Run(name, func(t *testing.T) {
			fm := m
			fm.SegmentBytes, fm.SegmentSHA256 = int64(len(data)), hexSHA256(data)
			if _, err := decodeSegment(&fm, data); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v, want ErrCorrupt", err)
			}
		})
	}
}
