package archive

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"
)

// The catalog tells a reader which manifests list a run without reading
// every manifest. It is not part of what the archive proves: the
// manifests and their chain stay the truth, and every answer the catalog
// gives is checked against the manifest it names.
//
//	catalog/<level>/<first>-<last>/<shards>-<shard>
//
// A range of level 0 covers catalogSpan consecutive manifests, one of
// level l the catalogFanout ranges of level l-1 that follow each other
// (32, 128, 512, 2048, ... manifests); ranges are aligned (level l's
// ranges start at 1, 1+width, 1+2*width, ...). A range is cut into
// 2^shardBits(l) shards by the first bits of its runs' keys (the first 8
// bytes of the SHA-256 of the runId, big-endian), so a lookup reads one
// shard of a range: with 200-run segments about 6 KB at level 0 and 35 KB
// at level 3, then four times as much a level (256 shards at most). A
// shard object is a header line and one line per (run, manifest):
//
//	sidecar-archive-catalog/1 <level> <first> <last> <shards> <shard>
//	<key, 16 lowercase hex digits> <manifest seq>
//
// sorted by key, then seq. Its content follows from the manifests alone,
// so two writers that build the same range write the same bytes.
//
// The writer of the last manifest of a range builds the range, after that
// manifest is confirmed: level 0 from the range's manifests (its own,
// remembered; the others read), level l from the shards of the ranges of
// level l-1 (or, where one is absent, theirs in turn). Each manifest's run
// keys enter the catalog once per level: the write cost is a fraction of
// an object per segment, not an object per run.
//
// A lookup covers manifests 1..head with the widest ranges that fit (at
// most catalogFanout-1 of each level, then at most catalogSpan-1
// manifests after the last full range, read directly), reads the run's
// shard of each range, and confirms the newest manifest the shards name
// by reading it. The number of ranges is bounded (at most
// catalogFanout-1 a level) up to catalogFanout times the widest range,
// 2,097,152 manifests; past that, one more a 524,288 manifests. A shard that is absent or does not parse is replaced by
// the ranges below it (and a range of level 0 by its manifests), so a
// writer that died before building a range costs reads, never answers.
const (
	catalogPrefix  = "catalog/"
	catalogFormat  = "sidecar-archive-catalog/1"
	catalogSpan    = 32
	catalogFanout  = 4
	catalogLevels  = 8
	maxShardBits   = 8
	catalogReaders = 8 // objects a lookup, or a step of a build, reads or writes at once
)

// catalogWidth is the number of manifests a range of level l covers.
func catalogWidth(l int) uint64 {
	w := uint64(catalogSpan)
	for range l {
		w *= catalogFanout
	}
	return w
}

// shardBits is log2 of the number of shards of a range of level l: 4
// shards at level 0, four times as many a level up (as many as the range
// has times more runs), at most 256.
func shardBits(l int) int { return min(2+2*l, maxShardBits) }

// runKey is a run's key in the catalog.
func runKey(runID string) uint64 {
	s := sha256.Sum256([]byte(runID))
	return binary.BigEndian.Uint64(s[:8])
}

// keyInterval is the interval of keys of shard s of 2^bits shards.
func keyInterval(bits, s int) (lo, hi uint64) {
	if bits == 0 {
		return 0, ^uint64(0)
	}
	lo = uint64(s) << (64 - bits)
	return lo, lo | (uint64(1)<<(64-bits) - 1)
}

// shardOf is the shard of 2^bits that holds key.
func shardOf(bits int, key uint64) int {
	if bits == 0 {
		return 0
	}
	return int(key >> (64 - bits))
}

// catalogName is the object name of shard s of range (l, first).
func catalogName(l int, first uint64, s int) string {
	return fmt.Sprintf("%s%d/%012d-%012d/%03d-%03d", catalogPrefix, l, first, first+catalogWidth(l)-1, 1<<shardBits(l), s)
}

// parseCatalogName returns the level, first manifest and shard of a
// catalog object name that catalogName would give.
func parseCatalogName(name string) (l int, first uint64, s int, ok bool) {
	rest, found := strings.CutPrefix(name, catalogPrefix)
	parts := strings.Split(rest, "/")
	if !found || len(parts) != 3 {
		return 0, 0, 0, false
	}
	l, err := strconv.Atoi(parts[0])
	if err != nil || l < 0 || l >= catalogLevels {
		return 0, 0, 0, false
	}
	a, _, _ := strings.Cut(parts[1], "-")
	first, err = strconv.ParseUint(a, 10, 64)
	if err != nil || first == 0 || (first-1)%catalogWidth(l) != 0 {
		return 0, 0, 0, false
	}
	_, b, _ := strings.Cut(parts[2], "-")
	if s, err = strconv.Atoi(b); err != nil || s < 0 || s >= 1<<shardBits(l) || catalogName(l, first, s) != name {
		return 0, 0, 0, false
	}
	return l, first, s, true
}

// catalogEntry is one line of a shard: run key, manifest seq.
type catalogEntry struct {
	key, seq uint64
}

func compareEntries(a, b catalogEntry) int {
	if a.key != b.key {
		if a.key < b.key {
			return -1
		}
		return 1
	}
	switch {
	case a.seq < b.seq:
		return -1
	case a.seq > b.seq:
		return 1
	}
	return 0
}

func shardHeader(l int, first uint64, s int) string {
	return fmt.Sprintf("%s %d %d %d %d %d\n", catalogFormat, l, first, first+catalogWidth(l)-1, 1<<shardBits(l), s)
}

// encodeShard is the stored form of shard s of range (l, first) holding
// entries (sorted).
func encodeShard(l int, first uint64, s int, entries []catalogEntry) []byte {
	b := make([]byte, 0, len(shardHeader(l, first, s))+len(entries)*24)
	b = append(b, shardHeader(l, first, s)...)
	for _, e := range entries {
		b = fmt.Appendf(b, "%016x %d\n", e.key, e.seq)
	}
	return b
}

// parseShard decodes shard s of range (l, first): its header must be the
// shard's, every key in the shard, every seq in the range, in order.
func parseShard(l int, first uint64, s int, data []byte) ([]catalogEntry, error) {
	header := shardHeader(l, first, s)
	if !bytes.HasPrefix(data, []byte(header)) {
		return nil, newError(CodeCorrupt, nil, "%s: header is not %q", catalogName(l, first, s), strings.TrimSpace(header))
	}
	last := first + catalogWidth(l) - 1
	body := data[len(header):]
	if len(body) == 0 {
		return nil, nil
	}
	if body[len(body)-1] != '\n' {
		return nil, newError(CodeCorrupt, nil, "%s: the last line has no newline", catalogName(l, first, s))
	}
	var out []catalogEntry
	for n, line := range bytes.Split(body[:len(body)-1], []byte("\n")) {
		k, q, ok := strings.Cut(string(line), " ")
		key, err1 := strconv.ParseUint(k, 16, 64)
		seq, err2 := strconv.ParseUint(q, 10, 64)
		e := catalogEntry{key: key, seq: seq}
		if !ok || len(k) != 16 || err1 != nil || err2 != nil || strconv.FormatUint(seq, 10) != q ||
			shardOf(shardBits(l), key) != s || seq < first || seq > last ||
			(len(out) > 0 && compareEntries(out[len(out)-1], e) >= 0) || k != fmt.Sprintf("%016x", key) {
			return nil, newError(CodeCorrupt, nil, "%s: line %d is not an entry of this shard in order", catalogName(l, first, s), n+2)
		}
		out = append(out, e)
	}
	return out, nil
}

// catalogReader reads the catalog for one lookup or one build. It keeps
// the run keys of the manifests it read (8 bytes a run), so a range of
// level 0 whose shards are absent reads its manifests once.
type catalogReader struct {
	a  *Archive
	mu sync.Mutex
	// keys are the run keys of manifests read, by seq.
	keys map[uint64][]uint64
	// lenient passes over a manifest that is missing or does not check
	// (a lookup's reader), noting it in lost, instead of failing: the
	// loss of one costs its own runs, not every lookup.
	lenient bool
	lost    map[uint64]error
}

// lose notes that manifest seq cannot be read (err) when r is lenient and
// the error is the manifest's own (missing, or does not check), and
// reports whether it was passed over.
func (r *catalogReader) lose(seq uint64, err error) bool {
	if !r.lenient || !(errors.Is(err, ErrObjectNotFound) || errors.Is(err, ErrCorrupt)) {
		return false
	}
	r.mu.Lock()
	r.lost[seq] = err
	r.mu.Unlock()
	return true
}

// lostError is the error of the lowest manifest r passed over (nil: none).
func (r *catalogReader) lostError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first uint64
	for seq := range r.lost {
		if first == 0 || seq < first {
			first = seq
		}
	}
	if first == 0 {
		return nil
	}
	return r.lost[first]
}

func (a *Archive) catalogReader() *catalogReader {
	return &catalogReader{a: a, keys: map[uint64][]uint64{}, lost: map[uint64]error{}}
}

// shard reads shard s of range (l, first); ok is false when it is absent
// or does not parse, or the destination finds its bytes changed (the
// caller reads the ranges below it instead).
func (r *catalogReader) shard(ctx context.Context, l int, first uint64, s int) (entries []catalogEntry, ok bool, err error) {
	data, err := r.a.dest.Get(ctx, catalogName(l, first, s), maxShardBytes)
	if errors.Is(err, ErrObjectNotFound) || errors.Is(err, ErrCorrupt) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	entries, err = parseShard(l, first, s, data)
	return entries, err == nil, nil
}

// manifestKeys returns the run keys of manifest seq: remembered from this
// Archive's own writes, or read.
func (r *catalogReader) manifestKeys(ctx context.Context, seq uint64) ([]uint64, error) {
	r.mu.Lock()
	k, ok := r.keys[seq]
	r.mu.Unlock()
	if ok {
		return k, nil
	}
	r.a.mu.Lock()
	k, ok = r.a.recent[seq]
	r.a.mu.Unlock()
	if !ok {
		m, err := r.a.readManifest(ctx, seq)
		if err != nil {
			if r.lose(seq, err) {
				return nil, errLost
			}
			return nil, err
		}
		k = keysOf(m)
	}
	r.mu.Lock()
	r.keys[seq] = k
	r.mu.Unlock()
	return k, nil
}

func keysOf(m *Manifest) []uint64 {
	k := make([]uint64, len(m.Runs))
	for i := range m.Runs {
		k[i] = runKey(m.Runs[i].RunID)
	}
	return k
}

// manifestEntries returns the entries of manifests first..last with a key
// in [lo, hi], reading the manifests catalogReaders at a time.
func (r *catalogReader) manifestEntries(ctx context.Context, first, last, lo, hi uint64) ([]catalogEntry, error) {
	per := make([][]uint64, last-first+1)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(catalogReaders)
	for seq := first; seq <= last; seq++ {
		g.Go(func() error {
			k, err := r.manifestKeys(gctx, seq)
			if errors.Is(err, errLost) {
				return nil
			}
			per[seq-first] = k
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var out []catalogEntry
	for i, keys := range per {
		for _, k := range keys {
			if k >= lo && k <= hi {
				out = append(out, catalogEntry{key: k, seq: first + uint64(i)})
			}
		}
	}
	return out, nil
}

// rangeEntries returns the entries of range (l, first) with a key in
// [lo, hi]: from its shards, and for a shard that is absent from the
// ranges below it (from the manifests below level 0).
func (r *catalogReader) rangeEntries(ctx context.Context, l int, first, lo, hi uint64) ([]catalogEntry, error) {
	bits := shardBits(l)
	var out []catalogEntry
	for s := shardOf(bits, lo); s <= shardOf(bits, hi); s++ {
		entries, ok, err := r.shard(ctx, l, first, s)
		if err != nil {
			return nil, err
		}
		slo, shi := keyInterval(bits, s)
		slo, shi = max(slo, lo), min(shi, hi)
		if !ok {
			if l == 0 {
				entries, err = r.manifestEntries(ctx, first, first+catalogWidth(0)-1, slo, shi)
			} else {
				entries, err = r.subEntries(ctx, l, first, slo, shi)
			}
			if err != nil {
				return nil, err
			}
		}
		for _, e := range entries {
			if e.key >= slo && e.key <= shi {
				out = append(out, e)
			}
		}
	}
	return out, nil
}

// subEntries returns the entries of the ranges of level l-1 that make up
// range (l, first), with a key in [lo, hi].
func (r *catalogReader) subEntries(ctx context.Context, l int, first, lo, hi uint64) ([]catalogEntry, error) {
	var out []catalogEntry
	w := catalogWidth(l - 1)
	for i := range uint64(catalogFanout) {
		e, err := r.rangeEntries(ctx, l-1, first+i*w, lo, hi)
		if err != nil {
			return nil, err
		}
		out = append(out, e...)
	}
	return out, nil
}

// buildCatalog builds the ranges that manifest seq completes, lowest level
// first (a level reads the one below). It is called after manifest seq was
// confirmed; a failure leaves ranges absent, which lookups replace by the
// ranges below them, so it is not an error of the write.
func (a *Archive) buildCatalog(ctx context.Context, seq uint64) {
	for l := range catalogLevels {
		w := catalogWidth(l)
		if seq%w != 0 {
			break // a range of level l+1 ends where one of level l does
		}
		if a.buildRange(ctx, l, seq-w+1) != nil {
			return
		}
	}
}

// buildRange writes every shard of range (l, first): level 0 from its
// manifests, level l from the shards of level l-1, a shard of level l-1
// (holding the keys of up to catalogFanout shards of level l) at a time.
func (a *Archive) buildRange(ctx context.Context, l int, first uint64) error {
	r := a.catalogReader()
	bits, groupBits := shardBits(l), 0
	if l > 0 {
		groupBits = shardBits(l - 1)
	}
	for g := range 1 << groupBits {
		lo, hi := keyInterval(groupBits, g)
		var entries []catalogEntry
		var err error
		if l == 0 {
			entries, err = r.manifestEntries(ctx, first, first+catalogWidth(0)-1, lo, hi)
		} else {
			entries, err = r.subEntries(ctx, l, first, lo, hi)
		}
		if err != nil {
			return err
		}
		slices.SortFunc(entries, compareEntries)
		entries = slices.Compact(entries)
		wg, wctx := errgroup.WithContext(ctx)
		wg.SetLimit(catalogReaders)
		for s := shardOf(bits, lo); s <= shardOf(bits, hi); s++ {
			slo, shi := keyInterval(bits, s)
			i, _ := slices.BinarySearchFunc(entries, slo, func(e catalogEntry, k uint64) int { return cmpKey(e.key, k) })
			j, _ := slices.BinarySearchFunc(entries, shi, func(e catalogEntry, k uint64) int {
				if e.key <= k {
					return -1
				}
				return 1
			})
			data := encodeShard(l, first, s, entries[i:j])
			wg.Go(func() error {
				err := a.dest.PutNew(wctx, catalogName(l, first, s), data)
				if errors.Is(err, ErrConflict) {
					return nil // built by another writer: the same bytes
				}
				return err
			})
		}
		if err := wg.Wait(); err != nil {
			return err
		}
	}
	if l == 0 {
		a.mu.Lock()
		for seq := range a.recent {
			if seq <= first+catalogWidth(0)-1 {
				delete(a.recent, seq)
			}
		}
		a.mu.Unlock()
	}
	return nil
}

func cmpKey(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// lookupCatalog finds the manifest of runID's newest copy through the
// catalog: the run's shard of each range that covers manifests 1..head,
// the manifests after the last range, and the newest manifest named that
// lists the run. An error matching ErrRunNotFound when none does.
func (a *Archive) lookupCatalog(ctx context.Context, runID string) (*Manifest, int, error) {
	a.mu.Lock()
	if !a.headRead {
		if err := a.loadHead(ctx); err != nil {
			a.mu.Unlock()
			return nil, 0, err
		}
	}
	var head uint64
	if a.head != nil {
		head = a.head.Seq
	}
	a.mu.Unlock()
	// A manifest after the head this Archive knows: another writer (or a
	// process since) wrote; learn the head again (one listing).
	switch _, err := a.dest.Get(ctx, manifestName(head+1), maxManifestBytes); {
	case err == nil:
		a.mu.Lock()
		err = a.loadHead(ctx)
		if a.head != nil {
			head = a.head.Seq
		}
		a.mu.Unlock()
		if err != nil {
			return nil, 0, err
		}
	case !errors.Is(err, ErrObjectNotFound):
		return nil, 0, err
	}
	key := runKey(runID)
	r := a.catalogReader()
	r.lenient = true
	var (
		mu   sync.Mutex
		seqs []uint64
	)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(catalogReaders)
	p := uint64(1)
	for l := catalogLevels - 1; l >= 0; l-- {
		for w := catalogWidth(l); p-1+w <= head; p += w {
			first := p
			g.Go(func() error {
				entries, err := r.rangeEntries(gctx, l, first, key, key)
				mu.Lock()
				for _, e := range entries {
					seqs = append(seqs, e.seq)
				}
				mu.Unlock()
				return err
			})
		}
	}
	// The manifests after the last full range: their run keys, read once
	// and kept (at most catalogSpan-1 manifests) until a range covers them.
	a.mu.Lock()
	for seq := range a.recent {
		if seq < p {
			delete(a.recent, seq)
		}
	}
	a.mu.Unlock()
	for seq := p; seq <= head; seq++ {
		g.Go(func() error {
			keys, err := r.manifestKeys(gctx, seq)
			if errors.Is(err, errLost) {
				return nil // not kept in recent: read again next time
			}
			if err != nil {
				return err
			}
			a.mu.Lock()
			a.recent[seq] = keys
			a.mu.Unlock()
			if slices.Contains(keys, key) {
				mu.Lock()
				seqs = append(seqs, seq)
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, 0, err
	}
	slices.Sort(seqs)
	seqs = slices.Compact(seqs)
	for i := len(seqs) - 1; i >= 0; i-- {
		m, err := a.readManifest(ctx, seqs[i])
		if err != nil {
			// The run is likely in it (its key is): no older copy of it
			// from another manifest stands in for this one.
			return nil, 0, err
		}
		for j := range m.Runs {
			if m.Runs[j].RunID == runID {
				return m, j, nil
			}
		}
		// Another run with the same key, or a wrong entry: not this run.
	}
	if err := r.lostError(); err != nil {
		// Not in any manifest that could be read: it may be in one that
		// cannot, which answers for it.
		return nil, 0, err
	}
	return nil, 0, newError(CodeRunNotFound, nil, "run %q is not in %s", runID, a.dest)
}

// errLost is manifestKeys' answer for a manifest a lenient reader passed
// over (catalogReader.lose).
var errLost = errors.New("manifest passed over")
