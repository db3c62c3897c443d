package archive

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// seedSegment builds a segment of two small runs.
func seedSegment(t testing.TB) ([]byte, *Manifest, []byte) {
	t.Helper()
	ctx := context.Background()
	s := memstore.New(statestore.ProjectorOptions{})
	var runs []Run
	for i := range 2 {
		id := fmt.Sprintf("run-%d", i)
		for _, w := range []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""), storetest.Event(id, statestore.RunCompleted, "")} {
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
	seg, err := buildSegment(runs)
	if err != nil {
		t.Fatal(err)
	}
	data, m := append([]byte(nil), seg.data...), seg.m
	seg.release()
	m.Seq, m.Prev, m.Segment, m.CreatedAt = 1, Genesis, "segments/1-a.ndjson.gz", "2026-01-01T00:00:00Z"
	if m.Chain, err = chainOf(m); err != nil {
		t.Fatal(err)
	}
	enc, err := encodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	return data, m, enc
}

// FuzzDecodeSegment hands decodeSegment arbitrary decompressed content
// under a manifest whose sizes and segment hash match it (as a forger
// would make them): it never panics, and what it accepts hashes to the
// manifest's per-run SHA-256, so it is the original content.
func FuzzDecodeSegment(f *testing.F) {
	data, m, _ := seedSegment(f)
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		f.Fatal(err)
	}
	var raw bytes.Buffer
	if _, err := raw.ReadFrom(zr); err != nil {
		f.Fatal(err)
	}
	orig := raw.Bytes()
	f.Add(orig)
	f.Add(orig[:len(orig)-1])
	f.Add([]byte{})
	f.Add([]byte("\n\n\n\n"))
	f.Add(bytes.Replace(orig, []byte(`"runSeq":1`), []byte(`"runSeq":9`), 1))
	f.Fuzz(func(t *testing.T, body []byte) {
		var comp bytes.Buffer
		zw := gzip.NewWriter(&comp)
		zw.Write(body)
		zw.Close()
		fm := *m
		fm.SegmentBytes, fm.SegmentSHA256, fm.RawBytes = int64(comp.Len()), hexSHA256(comp.Bytes()), int64(len(body))
		runs, err := decodeSegment(&fm, comp.Bytes())
		if err != nil {
			return
		}
		if !bytes.Equal(body, orig) {
			t.Fatalf("accepted content that is not the original:\n%q", body)
		}
		if len(runs) != 2 || len(runs[0]) != 2 {
			t.Fatalf("got %d runs", len(runs))
		}
	})
}

// FuzzParseManifest: any bytes as a manifest never panic, and a manifest
// that parses has a Chain that is its own hash.
func FuzzParseManifest(f *testing.F) {
	_, _, enc := seedSegment(f)
	f.Add(enc)
	f.Add([]byte("{}"))
	f.Add(bytes.Replace(enc, []byte(`"records": 4`), []byte(`"records": 5`), 1))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseManifest(b, 1)
		if err != nil {
			return
		}
		c, err := chainOf(m)
		if err != nil || c != m.Chain {
			t.Fatalf("accepted a manifest whose chain is not its hash")
		}
		if _, err := json.Marshal(m); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzDecodeSegmentBytes: arbitrary stored bytes under a manifest that
// matches their size and hash (a gzip bomb, garbage) never panic.
func FuzzDecodeSegmentBytes(f *testing.F) {
	data, m, _ := seedSegment(f)
	f.Add(data)
	f.Add(append(bytes.Clone(data), data...)) // two gzip members
	f.Add([]byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, b []byte) {
		fm := *m
		fm.SegmentBytes, fm.SegmentSHA256 = int64(len(b)), hexSHA256(b)
		_, _ = decodeSegment(&fm, b)
	})
}

// FuzzParseShard: any bytes as a catalog shard never panic, and a shard
// that parses encodes back to exactly its bytes (one form per content, so
// verify's byte comparison and two writers' shards agree).
func FuzzParseShard(f *testing.F) {
	key := runKey("run-1")
	l, first, s := 1, uint64(129), shardOf(shardBits(1), key)
	f.Add(encodeShard(l, first, s, []catalogEntry{{key: key, seq: 130}, {key: key, seq: 200}}))
	f.Add(encodeShard(l, first, s, nil))
	f.Add([]byte(shardHeader(l, first, s) + "zz 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := parseShard(l, first, s, b)
		if err != nil {
			return
		}
		if got := encodeShard(l, first, s, entries); !bytes.Equal(got, b) {
			t.Fatalf("parsed %q, encodes to %q", b, got)
		}
	})
}
