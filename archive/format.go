package archive

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// FormatVersion names the archive format in every manifest.
const FormatVersion = "sidecar-archive/1"

// Genesis is the Prev of an archive's first manifest: 64 zeros.
const Genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// Object name prefixes inside a destination.
const (
	manifestPrefix = "manifests/"
	segmentPrefix  = "segments/"
	segmentSuffix  = ".ndjson.gz"
)

// maxRawBytes bounds a segment's uncompressed size that a reader accepts
// (a manifest that declares more is corrupt): it keeps a hostile segment
// from inflating without bound.
const maxRawBytes = 1 << 30

// Manifest describes one segment: where it is, its hashes, the runs it
// holds, and its place in the archive's hash chain. Manifest seq n is the
// object manifests/<n, 12 digits>.json; seq numbers start at 1 and have no
// gaps.
type Manifest struct {
	// Format is FormatVersion.
	Format string `json:"format"`
	// Seq is the manifest's place in the archive (1, 2, ...).
	Seq uint64 `json:"seq"`
	// CreatedAt is when the writer made the segment (RFC 3339, UTC).
	CreatedAt string `json:"createdAt"`
	// Segment is the segment's object name.
	Segment string `json:"segment"`
	// SegmentSHA256 is the lowercase hex SHA-256 of the segment's stored
	// (compressed) bytes, and SegmentBytes their length.
	SegmentSHA256 string `json:"segmentSha256"`
	SegmentBytes  int64  `json:"segmentBytes"`
	// RawBytes is the length of the segment's NDJSON once decompressed.
	RawBytes int64 `json:"rawBytes"`
	// Records is the number of records (lines) in the segment.
	Records int64 `json:"records"`
	// Runs are the segment's runs in the order their records appear.
	Runs []RunEntry `json:"runs"`
	// Prev is the Chain of manifest Seq-1 (Genesis for the first).
	Prev string `json:"prev"`
	// Chain is the lowercase hex SHA-256 of this manifest encoded as JSON
	// (the encoding Write stores) with Chain empty and no Signature. It
	// covers Prev, so
	// each manifest commits to every one before it.
	Chain string `json:"chain"`
	// Signature is set when the writer had keys (Options.Keys): an
	// HMAC-SHA256 of Chain. It is not part of what Chain covers, so a
	// manifest reads and chains the same with or without it.
	Signature *Signature `json:"signature,omitempty"`
}

// RunEntry is one run of a segment: how many records it has, their
// SHA-256, and what a run list shows of it.
type RunEntry struct {
	RunID         string `json:"runId"`
	TenantID      string `json:"tenantId"`
	ProjectID     string `json:"projectId"`
	EnvironmentID string `json:"environmentId"`
	PlanID        string `json:"planId"`
	PlanVersion   string `json:"planVersion"`
	// Records is the run's record count and SHA256 the lowercase hex
	// SHA-256 of its lines in the segment, each with its newline.
	Records int64  `json:"records"`
	SHA256  string `json:"sha256"`
	// FirstRunSeq and LastRunSeq are the runSeq of its first and last record.
	FirstRunSeq int64 `json:"firstRunSeq"`
	LastRunSeq  int64 `json:"lastRunSeq"`
	// FirstPersistedAt and LastPersistedAt are their persistedAt.
	FirstPersistedAt string `json:"firstPersistedAt"`
	LastPersistedAt  string `json:"lastPersistedAt"`
	// LastEventType is the eventType of its last record (RunCompleted,
	// RunFailed, RunCancelled for a finished run).
	LastEventType string `json:"lastEventType"`
	// Labels are the run's labels as the projector takes them (its
	// RunStarted's, else its RunQueued's), so that a listing of archived
	// runs selects by them without reading the segment; absent when the
	// run has none.
	Labels map[string]string `json:"labels,omitempty"`
}

// Run is a run's records as Write takes them: every record of the run, in
// increasing runSeq, exactly as the store returned them.
type Run struct {
	ID      string
	Records []statestore.RunEventRecord
}

// EncodeRecord is a record's line in a segment (without its newline): the
// contract's RunEventRecord as compact JSON without HTML escaping, so a
// payload stays byte for byte what the store holds.
func EncodeRecord(r *statestore.RunEventRecord) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// encodeManifest is the stored form of m: compact JSON and a newline
// (indenting a manifest of 200 runs cost about a tenth of a segment's
// write, and a third more bytes to write and read back).
func encodeManifest(m *Manifest) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// sealManifest sets m's Chain (and, with keys, its Signature) and returns
// m's stored form (encodeManifest's bytes) from one encoding: Chain is the
// manifest's last field but Signature, so the form with Chain empty and no
// Signature ends in `"chain":""}` and the stored form is that with the
// hash between the quotes and the signature after it.
func sealManifest(m *Manifest, keys *Keys) ([]byte, error) {
	m.Chain, m.Signature = "", nil
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	const tail = `"chain":""}`
	if !bytes.HasSuffix(b, []byte(tail)) {
		return nil, fmt.Errorf("encode manifest: it does not end with %s", tail)
	}
	m.Chain = hexSHA256(b)
	out := make([]byte, 0, len(b)+len(m.Chain)+160)
	out = append(out, b[:len(b)-len(`"}`)]...)
	out = append(out, m.Chain...)
	out = append(out, '"')
	if keys != nil {
		m.Signature = keys.sign(m.Chain)
		out = append(out, signatureField(m.Signature)...)
	}
	return append(out, "}\n"...), nil
}

// chainOf computes m's Chain: SHA-256 of m's compact JSON with Chain empty.
func chainOf(m *Manifest) (string, error) {
	c := *m
	c.Chain, c.Signature = "", nil
	b, err := json.Marshal(&c)
	if err != nil {
		return "", fmt.Errorf("encode manifest: %w", err)
	}
	return hexSHA256(b), nil
}

func hexSHA256(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// manifestName is the object name of manifest seq.
func manifestName(seq uint64) string { return fmt.Sprintf("%s%012d.json", manifestPrefix, seq) }

// parseManifestName returns the seq of a manifest object name.
func parseManifestName(name string) (uint64, bool) {
	s, ok := strings.CutPrefix(name, manifestPrefix)
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".json")
	if !ok || len(s) != 12 {
		return 0, false
	}
	var n uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, n > 0
}

// checkRuns validates runs for Write: each has records, all of its own
// runId, in strictly increasing runSeq, and no run twice.
func checkRuns(runs []Run) error {
	if len(runs) == 0 {
		return newError(CodeInputInvalid, nil, "no runs to archive")
	}
	seen := make(map[string]bool, len(runs))
	for _, r := range runs {
		switch {
		case r.ID == "":
			return newError(CodeInputInvalid, nil, "a run without an id")
		case seen[r.ID]:
			return newError(CodeInputInvalid, nil, "run %q given twice", r.ID)
		case len(r.Records) == 0:
			return newError(CodeInputInvalid, nil, "run %q has no records", r.ID)
		}
		seen[r.ID] = true
		var last int64
		for i := range r.Records {
			rec := &r.Records[i]
			if rec.RunID != r.ID {
				return newError(CodeInputInvalid, nil, "run %q: record %d belongs to run %q", r.ID, i, rec.RunID)
			}
			if rec.RunSeq <= last {
				return newError(CodeInputInvalid, nil, "run %q: runSeq %d after %d", r.ID, rec.RunSeq, last)
			}
			last = rec.RunSeq
		}
	}
	return nil
}

// segment is a segment built by buildSegment: its stored (compressed)
// bytes, the NDJSON lines they hold (in chunks, in order: chunk i is
// what the gzip member data[ends[i-1]:ends[i]] decompresses to), and its
// manifest without Seq, Prev and Chain. release hands its buffers back for
// the next segment; data may not be used after it.
type segment struct {
	data   []byte
	chunks [][]byte
	ends   []int
	m      *Manifest
	comp   *bytes.Buffer
}

// SegmentLevel is the gzip level of segments. Levels 2 to 4 of
// compress/flate run about twice as fast as the default (6) on NDJSON
// records, and the output is about 3 % larger.
const SegmentLevel = 4

// chunkSize is the size of the blocks of lines buildSegment compresses
// as one gzip member each (a chunk ends with the line that reaches it):
// members are compressed, and checked, on all of the machine's cores. Each
// member starts its dictionary afresh, which makes a segment about 3 %
// larger than one stream of the same lines.
const chunkSize = 64 << 10

// Buffers and compressors reused from one segment to the next: a gzip
// writer allocates about 1 MB of tables, and a segment's buffer is the
// size of the segment.
var (
	compPool   = sync.Pool{New: func() any { return new(bytes.Buffer) }}
	memberPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}
	gzwPool    = sync.Pool{New: func() any {
		zw, err := gzip.NewWriterLevel(io.Discard, SegmentLevel)
		if err != nil { // not with a valid SegmentLevel
			return gzip.NewWriter(io.Discard)
		}
		return zw
	}}
	gzrPool sync.Pool // *gzip.Reader, made on first use (NewReader needs a stream)
)

func (s *segment) release() {
	if s.comp != nil && s.comp.Cap() <= 64<<20 {
		s.comp.Reset()
		compPool.Put(s.comp)
	}
	*s = segment{}
}

// member is a chunk of lines and, once a compressor took it, its gzip
// member (comp) or the error compressing it.
type member struct {
	lines []byte
	comp  *bytes.Buffer
	err   error
}

func (mb *member) compress(zw *gzip.Writer) {
	mb.comp = memberPool.Get().(*bytes.Buffer)
	zw.Reset(mb.comp)
	if _, mb.err = zw.Write(mb.lines); mb.err == nil {
		mb.err = zw.Close()
	}
}

// chunker is the writer buildSegment's JSON encoder writes lines to: it
// hashes them into the current run's SHA-256, cuts them into chunks of
// about chunkSize and sends each full chunk to the compressors, keeping
// it for the check of the compressed bytes. A chunk sent is never written
// again.
type chunker struct {
	cur     []byte
	out     chan<- *member
	members []*member
	run     hash.Hash
	n       int64
}

func (c *chunker) Write(p []byte) (int, error) {
	c.run.Write(p)
	c.cur = append(c.cur, p...)
	c.n += int64(len(p))
	if c.n > maxRawBytes {
		return 0, fmt.Errorf("more than %d bytes of records in one segment", int64(maxRawBytes))
	}
	if len(c.cur) >= chunkSize {
		c.flush()
	}
	return len(p), nil
}

func (c *chunker) flush() {
	if len(c.cur) == 0 {
		return
	}
	mb := &member{lines: c.cur}
	c.members = append(c.members, mb)
	c.out <- mb
	c.cur = make([]byte, 0, chunkSize+chunkSize/4)
}

// buildSegment encodes runs as a segment: each record a line of compact
// JSON (EncodeRecord's bytes and a newline), each run's SHA-256 over its
// lines, and the lines compressed with gzip (SegmentLevel), a chunk of
// lines a gzip member. The caller's goroutine encodes and hashes while
// GOMAXPROCS goroutines compress the chunks; the members, concatenated in
// order, are one gzip stream of every line (RFC 1952 §2.2), which every
// gzip reader (zcat, Go's gzip.Reader) reads whole.
func buildSegment(runs []Run) (*segment, error) {
	jobs := make(chan *member, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			zw := gzwPool.Get().(*gzip.Writer)
			defer gzwPool.Put(zw)
			for mb := range jobs {
				mb.compress(zw)
			}
		})
	}
	ck := &chunker{cur: make([]byte, 0, chunkSize+chunkSize/4), out: jobs, run: sha256.New()}
	m, err := encodeRuns(runs, ck)
	if err == nil {
		ck.flush()
	}
	close(jobs)
	wg.Wait()
	seg := &segment{comp: compPool.Get().(*bytes.Buffer)}
	for _, mb := range ck.members {
		if err == nil {
			err = mb.err
		}
		if err == nil {
			seg.comp.Write(mb.comp.Bytes())
			seg.ends = append(seg.ends, seg.comp.Len())
			seg.chunks = append(seg.chunks, mb.lines)
		}
		if mb.comp != nil && mb.comp.Cap() <= 4*chunkSize {
			mb.comp.Reset()
			memberPool.Put(mb.comp)
		}
	}
	if err != nil {
		seg.release()
		return nil, err
	}
	seg.m = m
	seg.data = seg.comp.Bytes()
	m.RawBytes = ck.n
	m.SegmentBytes = int64(len(seg.data))
	m.SegmentSHA256 = hexSHA256(seg.data)
	return seg, nil
}

// encodeRuns writes every record of runs to ck and returns the manifest's
// runs and counts.
func encodeRuns(runs []Run, ck *chunker) (*Manifest, error) {
	enc := json.NewEncoder(ck)
	enc.SetEscapeHTML(false)
	m := &Manifest{Format: FormatVersion, Runs: make([]RunEntry, 0, len(runs))}
	for _, r := range runs {
		ck.run.Reset()
		for i := range r.Records {
			// Encode writes the record as EncodeRecord does, and a newline,
			// in one Write; a record it cannot encode writes nothing.
			if err := enc.Encode(&r.Records[i]); err != nil {
				return nil, newError(CodeInputInvalid, err, "run %q: encode record %d", r.ID, i)
			}
		}
		first, last := &r.Records[0], &r.Records[len(r.Records)-1]
		m.Records += int64(len(r.Records))
		m.Runs = append(m.Runs, RunEntry{
			RunID: r.ID, TenantID: first.TenantID, ProjectID: first.ProjectID,
			EnvironmentID: first.EnvironmentID, PlanID: first.PlanID, PlanVersion: first.PlanVersion,
			Records: int64(len(r.Records)), SHA256: hex.EncodeToString(ck.run.Sum(nil)),
			FirstRunSeq: first.RunSeq, LastRunSeq: last.RunSeq,
			FirstPersistedAt: first.PersistedAt, LastPersistedAt: last.PersistedAt,
			LastEventType: last.EventType, Labels: labelsOf(r.Records),
		})
	}
	return m, nil
}

// labelsOf returns a run's labels: its RunStarted's, else its
// RunQueued's (the projector's rule), nil when it has none.
func labelsOf(recs []statestore.RunEventRecord) map[string]string {
	var queued, started map[string]string
	for i := range recs {
		r := &recs[i]
		if r.EventType != statestore.RunStarted && r.EventType != statestore.RunQueued {
			continue
		}
		var p struct {
			Labels map[string]string `json:"labels"`
		}
		if json.Unmarshal(r.Payload, &p) != nil || len(p.Labels) == 0 {
			continue
		}
		if r.EventType == statestore.RunStarted {
			started = p.Labels
		} else {
			queued = p.Labels
		}
	}
	if started != nil {
		return started
	}
	return queued
}

// checkReadBack checks what the destination returned for a segment just
// written: the same bytes as were written, whose SHA-256 and size the
// manifest records and whose lines checkLines proved. Equal bytes
// decompress to the same lines, so the lines need not be decompressed
// from the copy read back again.
func checkReadBack(seg *segment, back []byte) error {
	if !bytes.Equal(back, seg.data) {
		m := seg.m
		return newError(CodeCorrupt, nil, "segment %s: %d bytes read back differ from the %d written (SHA-256 %s)", m.Segment, len(back), len(seg.data), m.SegmentSHA256)
	}
	return nil
}

// checkLines checks that the segment's bytes decompress to exactly the
// lines whose counts and per-run SHA-256 the manifest records: each gzip
// member to its chunk of lines, its CRC-32 and length checked, on
// GOMAXPROCS goroutines (Write runs it while the segment is being
// stored).
func (s *segment) checkLines() error {
	if len(s.ends) != len(s.chunks) || len(s.ends) == 0 || s.ends[len(s.ends)-1] != len(s.data) {
		return newError(CodeCorrupt, nil, "segment %s: %d gzip members for %d chunks of lines", s.m.Segment, len(s.ends), len(s.chunks))
	}
	errs := make([]error, len(s.chunks))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(s.chunks)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(s.chunks); i = int(next.Add(1) - 1) {
				errs[i] = s.checkMember(i)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// checkMember checks that member i decompresses to chunk i and nothing
// more.
func (s *segment) checkMember(i int) error {
	start := 0
	if i > 0 {
		start = s.ends[i-1]
	}
	name := s.m.Segment
	if start > s.ends[i] {
		return newError(CodeCorrupt, nil, "segment %s: member %d ends before it starts", name, i)
	}
	data := s.data[start:s.ends[i]]
	zr, _ := gzrPool.Get().(*gzip.Reader)
	var err error
	if zr != nil {
		err = zr.Reset(bytes.NewReader(data))
	} else {
		zr, err = gzip.NewReader(bytes.NewReader(data))
	}
	if err != nil {
		return newError(CodeCorrupt, err, "segment %s: member %d is not gzip", name, i)
	}
	defer gzrPool.Put(zr)
	buf := make([]byte, 16<<10)
	c := s.chunks[i]
	for len(c) > 0 {
		want := c[:min(len(c), len(buf))]
		c = c[len(want):]
		n, err := io.ReadFull(zr, buf[:len(want)])
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return newError(CodeCorrupt, err, "segment %s: member %d: decompress", name, i)
		}
		if !bytes.Equal(buf[:n], want) {
			return newError(CodeCorrupt, nil, "segment %s: member %d: decompressed lines differ from those written", name, i)
		}
	}
	// The member ends here, its CRC-32 and length check, and no other
	// member follows in its bytes.
	switch n, err := io.ReadFull(zr, buf[:1]); {
	case n != 0:
		return newError(CodeCorrupt, nil, "segment %s: member %d decompresses to more lines than were written", name, i)
	case !errors.Is(err, io.EOF):
		return newError(CodeCorrupt, err, "segment %s: member %d: decompress", name, i)
	}
	return nil
}

// segmentLimit is the most a reader takes of m's segment: the size m
// says, within what any segment may be.
func segmentLimit(m *Manifest) int64 { return max(0, min(m.SegmentBytes, maxRawBytes)) }

// decodeSegment checks data against m and returns the records of every
// run of m, in m.Runs' order. Any difference (size, hash, count, a run's
// SHA-256, a line that does not parse or is not its run's, runSeq out of
// order) is an error matching ErrCorrupt that names it.
func decodeSegment(m *Manifest, data []byte) ([][]statestore.RunEventRecord, error) {
	if int64(len(data)) != m.SegmentBytes {
		return nil, newError(CodeCorrupt, nil, "segment %s: %d bytes, manifest %d says %d", m.Segment, len(data), m.Seq, m.SegmentBytes)
	}
	if got := hexSHA256(data); got != m.SegmentSHA256 {
		return nil, newError(CodeCorrupt, nil, "segment %s: SHA-256 %s, manifest %d says %s", m.Segment, got, m.Seq, m.SegmentSHA256)
	}
	if m.RawBytes < 0 || m.RawBytes > maxRawBytes {
		return nil, newError(CodeCorrupt, nil, "manifest %d: rawBytes %d out of range", m.Seq, m.RawBytes)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, newError(CodeCorrupt, err, "segment %s: not gzip", m.Segment)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, m.RawBytes+1))
	if err != nil {
		return nil, newError(CodeCorrupt, err, "segment %s: decompress", m.Segment)
	}
	if int64(len(raw)) != m.RawBytes {
		return nil, newError(CodeCorrupt, nil, "segment %s: %d bytes decompressed, manifest %d says %d", m.Segment, len(raw), m.Seq, m.RawBytes)
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, len(raw)+1)
	sc.Split(scanLines)
	out := make([][]statestore.RunEventRecord, 0, len(m.Runs))
	var total int64
	for _, e := range m.Runs {
		if e.Records <= 0 || e.Records > m.Records {
			return nil, newError(CodeCorrupt, nil, "manifest %d: run %q: records %d out of range", m.Seq, e.RunID, e.Records)
		}
		h := sha256.New()
		recs := make([]statestore.RunEventRecord, 0, e.Records)
		var last int64
		for i := int64(0); i < e.Records; i++ {
			if !sc.Scan() {
				return nil, newError(CodeCorrupt, nil, "segment %s: run %q: %d records, manifest %d says %d", m.Segment, e.RunID, i, m.Seq, e.Records)
			}
			line := sc.Bytes()
			h.Write(line)
			var rec statestore.RunEventRecord
			if err := json.Unmarshal(bytes.TrimSuffix(line, []byte("\n")), &rec); err != nil {
				return nil, newError(CodeCorrupt, err, "segment %s: run %q: record %d does not parse", m.Segment, e.RunID, i)
			}
			if rec.RunID != e.RunID {
				return nil, newError(CodeCorrupt, nil, "segment %s: run %q: record %d belongs to run %q", m.Segment, e.RunID, i, rec.RunID)
			}
			if rec.RunSeq <= last {
				return nil, newError(CodeCorrupt, nil, "segment %s: run %q: runSeq %d after %d", m.Segment, e.RunID, rec.RunSeq, last)
			}
			last = rec.RunSeq
			recs = append(recs, rec)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != e.SHA256 {
			return nil, newError(CodeCorrupt, nil, "segment %s: run %q: SHA-256 %s, manifest %d says %s", m.Segment, e.RunID, got, m.Seq, e.SHA256)
		}
		if recs[0].RunSeq != e.FirstRunSeq || last != e.LastRunSeq {
			return nil, newError(CodeCorrupt, nil, "segment %s: run %q: runSeq %d..%d, manifest %d says %d..%d", m.Segment, e.RunID, recs[0].RunSeq, last, m.Seq, e.FirstRunSeq, e.LastRunSeq)
		}
		total += e.Records
		out = append(out, recs)
	}
	if sc.Scan() {
		return nil, newError(CodeCorrupt, nil, "segment %s: more records than manifest %d lists", m.Segment, m.Seq)
	}
	if err := sc.Err(); err != nil {
		return nil, newError(CodeCorrupt, err, "segment %s: read lines", m.Segment)
	}
	if total != m.Records {
		return nil, newError(CodeCorrupt, nil, "manifest %d: runs hold %d records, manifest says %d", m.Seq, total, m.Records)
	}
	return out, nil
}

// scanLines is bufio.ScanLines keeping each line's newline, so that a run's
// SHA-256 is over the exact bytes of the segment; a last line without a
// newline is returned as it is (and so fails its run's hash).
func scanLines(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i+1], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// checkManifest checks what a manifest can say of itself: format, seq,
// names, hashes well formed, its Chain.
func checkManifest(m *Manifest, seq uint64) error {
	switch {
	case m.Format != FormatVersion:
		return newError(CodeCorrupt, nil, "manifest %d: format %q, want %q", seq, m.Format, FormatVersion)
	case m.Seq != seq:
		return newError(CodeCorrupt, nil, "manifest %d: says seq %d", seq, m.Seq)
	case !strings.HasPrefix(m.Segment, segmentPrefix) || !strings.HasSuffix(m.Segment, segmentSuffix) || strings.Contains(m.Segment, ".."):
		return newError(CodeCorrupt, nil, "manifest %d: segment name %q", seq, m.Segment)
	case !isHex64(m.SegmentSHA256) || !isHex64(m.Prev) || !isHex64(m.Chain):
		return newError(CodeCorrupt, nil, "manifest %d: a hash is not 64 lowercase hex digits", seq)
	case len(m.Runs) == 0:
		return newError(CodeCorrupt, nil, "manifest %d: lists no runs", seq)
	case m.Signature != nil && (len(m.Signature.KeyID) != 16 || !isHex(m.Signature.KeyID) || len(m.Signature.MAC) != 64 || !isHex(m.Signature.MAC)):
		return newError(CodeCorrupt, nil, "manifest %d: its signature's key id or MAC is not lowercase hex of the right length", seq)
	}
	got, err := chainOf(m)
	if err != nil {
		return newError(CodeCorrupt, err, "manifest %d", seq)
	}
	if got != m.Chain {
		return newError(CodeCorrupt, nil, "manifest %d: chain %s, its content hashes to %s", seq, m.Chain, got)
	}
	return nil
}

func isHex64(s string) bool { return len(s) == 64 && isHex(s) }

func isHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// parseManifest decodes a manifest object and checks it (checkManifest).
func parseManifest(b []byte, seq uint64) (*Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, newError(CodeCorrupt, err, "manifest %d does not parse", seq)
	}
	if err := checkManifest(&m, seq); err != nil {
		return nil, err
	}
	return &m, nil
}
