// Package archive keeps runs that leave the sidecar's hot state in an
// archive that can be proven complete: compressed NDJSON segments holding
// each run's records exactly as the log stored them, and one manifest per
// segment with each run's record count and SHA-256, chained by hash.
//
// # Layout
//
// Inside a Destination (a directory, an S3 bucket prefix):
//
//	segments/<unixNano>-<random>.ndjson.gz   gzip of NDJSON lines, one record a line
//	                                         (gzip members of about 64 KiB of lines each)
//	manifests/000000000001.json              the segment's Manifest, seq 1, 2, ...
//	catalog/<level>/<first>-<last>/<n>-<i>   which manifests list a run (catalog.go)
//
// A segment holds one or more runs, each run's records contiguous and in
// increasing runSeq. A line is the contract's RunEventRecord as compact
// JSON (EncodeRecord), so runSeq, eventId, persistedAt and the payload are
// exactly what the log returned. A run's SHA-256 is over its lines, each
// with its newline; `zcat segment | sha256sum` of a one-run segment is the
// run's hash.
//
// Manifest n records the segment's name, its SHA-256 and size (stored and
// decompressed), its record count and runs, Prev (the Chain of manifest
// n-1, Genesis for the first) and Chain, the SHA-256 of the manifest itself
// with Chain empty. Manifests are written once (Destination.PutNew), after
// their segment, so a writer that dies leaves at most a segment no
// manifest names, which Verify reports as an orphan and nothing reads.
//
// # What verification proves
//
// Verify reads every manifest from 1 to the last and every segment, and
// checks each hash and count. Changing, dropping or reordering a record
// breaks its run's SHA-256; editing a manifest to match breaks its Chain;
// recomputing that Chain breaks the next manifest's Prev; deleting a
// manifest leaves a gap. What a reader of the archive alone cannot see is
// the removal of the newest manifests, or every manifest rewritten from
// some point on; comparing the head (Head, printed by Verify) with one
// kept elsewhere (the sidecar's log of removals, an operator's note)
// closes that gap: VerifyOptions.ExpectHead.
//
// The catalog is not part of what Verify proves: it is a hint for
// lookups, checked against the manifest it names, and Verify reports a
// catalog shard that differs from its manifests.
package archive

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// conflictRetries is how often Write takes the next seq after losing one
// to another writer: each loss means another write succeeded, so only
// more than this many concurrent writes can make Write give up with
// ErrConflict.
const conflictRetries = 64

// Archive reads and writes one archive. It is safe for concurrent use;
// writes of one Archive are serialized, and writers of several processes
// on one destination never fork the chain (PutNew).
type Archive struct {
	dest Destination
	now  func() time.Time
	keys *Keys // sign what is written and check signed manifests read (nil: neither)

	mu   sync.Mutex
	head *Manifest // newest manifest read or written (nil: none yet)
	// expect is the head hot state noted that runs which left it went to
	// (Expect; seq 0: none): the destination must hold it to be read.
	expect struct {
		seq   uint64
		chain string
	}
	// wrote is the newest manifest this process wrote (seq 0: none): with
	// expect, what a manifest read back is checked against when no
	// manifest after it names it (checkLink), since the destination's
	// newest may have been rewritten.
	wrote struct {
		seq   uint64
		chain string
	}
	// present is when checkPresent last found the head it wants (seq):
	// misses within presentFor of it read nothing more.
	present struct {
		seq uint64
		at  time.Time
	}
	// headRead is whether head was read from the destination (Open's
	// read fails while the destination is down; Write reads it then).
	headRead bool
	// index maps a runId to where its newest copy is listed in the
	// newest indexWindow manifests; built by loadIndex and kept up to date
	// by Write. indexRuns are the runIds each of those manifests added,
	// to drop them when the manifest leaves the window.
	index     map[string]location
	indexRuns map[uint64][]string
	indexed   uint64 // the index is current through manifest indexed
	// recent are the run keys of manifests the catalog does not cover
	// yet (about catalogSpan of them): those this Archive wrote, for the
	// range of level 0 its writes complete, and those its lookups read
	// after the last full range (catalog.go).
	recent map[uint64][]uint64

	// With keys, what is known of which manifests are signed (unsigned).
	signs signs
}

// signs is what an Archive with keys learnt of which manifests are
// unsigned: every manifest from the first signed one on must be signed
// (Verify's rule), so an unsigned manifest after a signed one was not
// written by the sidecar.
type signs struct {
	mu sync.Mutex
	// unsignedThrough: manifests 1..unsignedThrough were read back to the
	// first and none is signed (the archive before it had keys).
	unsignedThrough uint64
}

// location is a run's place: manifest seq and the run's entry in it.
type location struct {
	seq   uint64
	entry int
}

// Options configures Open. The zero value uses the defaults.
type Options struct {
	// Now is the clock of CreatedAt (default time.Now).
	Now func() time.Time
	// Keys, when set, sign every manifest written (Manifest.Signature),
	// and a signed manifest read must check under one of them (else
	// ErrCorrupt). An unsigned manifest still reads: an archive written
	// before it had keys. Verify with VerifyOptions.Keys proves which
	// manifests a key holder wrote.
	Keys *Keys
}

// Open returns the Archive on dest. It reads the newest manifest (if any)
// and checks it, so that a writer chains on to it; an archive whose newest
// manifest does not check fails with an error matching ErrCorrupt. A
// destination that does not answer (ErrUnavailable: a bucket's server
// down) does not fail Open: the first Write reads the head then, and fails
// while the destination does, so a sidecar starts with its archive down
// and reports it failing instead of not starting.
func Open(ctx context.Context, dest Destination, opts Options) (*Archive, error) {
	if dest == nil {
		return nil, newError(CodeURLInvalid, nil, "no destination")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	a := &Archive{dest: dest, now: opts.Now, keys: opts.Keys, index: map[string]location{}, indexRuns: map[uint64][]string{}, recent: map[uint64][]uint64{}}
	if err := a.loadHead(ctx); err != nil && !errors.Is(err, ErrUnavailable) {
		return nil, err
	}
	return a, nil
}

// Check reads the archive's head as Open does, and returns the error Open
// lets pass: one matching ErrUnavailable says the destination cannot be
// read now (down, credentials refused, no such bucket or directory
// reachable), so nothing can be archived, nor removed, until it can.
func (a *Archive) Check(ctx context.Context) error {
	return a.loadHead(ctx)
}

// Close releases the archive. It writes nothing.
func (a *Archive) Close(ctx context.Context) error { return nil }

// Destination returns the archive's destination.
func (a *Archive) Destination() Destination { return a.dest }

// Head returns the newest manifest this Archive knows of (nil for an
// empty archive). Its Chain commits to every record archived before it.
func (a *Archive) Head() *Manifest {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.head == nil {
		return nil
	}
	h := *a.head
	return &h
}

// manifestSeqs lists the seq numbers of the destination's manifests,
// sorted, ignoring other objects.
func (a *Archive) manifestSeqs(ctx context.Context) ([]uint64, error) {
	names, err := a.dest.List(ctx, manifestPrefix)
	if err != nil {
		return nil, err
	}
	seqs := make([]uint64, 0, len(names))
	for _, n := range names {
		if s, ok := parseManifestName(n); ok {
			seqs = append(seqs, s)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// readManifest gets and checks manifest seq. With keys, a signed manifest
// must check under one of them, and an unsigned one must not come after a
// signed one (checkUnsigned).
func (a *Archive) readManifest(ctx context.Context, seq uint64) (*Manifest, error) {
	b, err := a.dest.Get(ctx, manifestName(seq), maxManifestBytes)
	if err != nil {
		return nil, err
	}
	m, err := parseManifest(b, seq)
	if err != nil || a.keys == nil {
		return m, err
	}
	if m.Signature != nil {
		if err := a.keys.check(m); err != nil {
			return nil, err
		}
		return m, nil
	}
	if err := a.checkUnsigned(ctx, seq); err != nil {
		return nil, err
	}
	return m, nil
}

// checkUnsigned returns an error matching ErrCorrupt if unsigned manifest
// seq follows a signed one. It reads the manifests before it back to the
// first, or to those it found unsigned before: once per process for an
// archive written before it had keys, nothing for one signed throughout. A
// manifest before it that is missing or does not parse is passed over: the
// chain's checks (Verify) report those.
func (a *Archive) checkUnsigned(ctx context.Context, seq uint64) error {
	a.signs.mu.Lock()
	through := a.signs.unsignedThrough
	a.signs.mu.Unlock()
	if seq <= through {
		return nil
	}
	for s := seq - 1; s > through; s-- {
		b, err := a.dest.Get(ctx, manifestName(s), maxManifestBytes)
		if errors.Is(err, ErrObjectNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		pm, err := parseManifest(b, s)
		if err != nil {
			continue
		}
		if pm.Signature != nil {
			return unsignedAfter(seq, s)
		}
	}
	a.signs.mu.Lock()
	a.signs.unsignedThrough = max(a.signs.unsignedThrough, seq)
	a.signs.mu.Unlock()
	return nil
}

func unsignedAfter(seq, signed uint64) error {
	return newError(CodeCorrupt, nil, "manifest %d is not signed, and manifest %d before it is: it was not written by the sidecar", seq, signed)
}

// loadHead reads the newest manifest into a.head. Called with a.mu held
// or before the Archive is shared.
func (a *Archive) loadHead(ctx context.Context) error {
	seqs, err := a.manifestSeqs(ctx)
	if err != nil {
		return err
	}
	if len(seqs) == 0 {
		a.head, a.headRead = nil, true
		return nil
	}
	m, err := a.readManifest(ctx, seqs[len(seqs)-1])
	if err != nil {
		return err
	}
	a.head, a.headRead = m, true
	return nil
}

// checkHead confirms that the head this Archive chains on to (the newest
// manifest it read or wrote) is still at the destination, as it was: a
// destination that lost it is not the archive written to (a volume
// unmounted under a mount point, a directory replaced), and a manifest
// chained on to a head it does not hold would leave a gap there, and
// its runs where no one reads them. A head read from the destination (not
// written here) at the place hot state noted (Expect) must be the one it
// noted: one rewritten, hash and all, is not chained on to, and one put
// back as it was is read again. a.mu is held.
func (a *Archive) checkHead(ctx context.Context) error {
	if a.head == nil {
		return nil
	}
	if a.wrote.seq != a.head.Seq && a.expect.seq == a.head.Seq && a.expect.chain != "" && a.expect.chain != a.head.Chain {
		if err := a.holds(ctx, a.expect.seq, a.expect.chain, "the newest that runs left hot state for"); err != nil {
			return err
		}
		return a.loadHead(ctx)
	}
	return a.holds(ctx, a.head.Seq, a.head.Chain, "the newest this process read or wrote")
}

// Expect tells the archive the head that runs which left hot state went
// to, as hot state noted it (a process starting with an archive that is
// not that one: a volume not mounted yet, another prefix). Until the
// destination holds it (or the newest manifest this process read or
// wrote), a read that finds no run, or a listing, answers an error
// matching ErrUnavailable rather than "no such run" or an empty archive.
func (a *Archive) Expect(seq uint64, chain string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if seq > a.expect.seq {
		a.expect.seq, a.expect.chain = seq, chain
	}
}

// wantHead is the newest manifest the destination must hold: the newest
// this process read or wrote, or the one Expect named if newer (seq 0:
// none).
func (a *Archive) wantHead() (uint64, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.head != nil && a.head.Seq >= a.expect.seq {
		return a.head.Seq, a.head.Chain
	}
	return a.expect.seq, a.expect.chain
}

// checkPresent confirms the destination holds wantHead (a read that found
// nothing asks: was it the archive?).
func (a *Archive) checkPresent(ctx context.Context) error {
	seq, chain := a.wantHead()
	if seq == 0 {
		return nil
	}
	a.mu.Lock()
	fresh := a.present.seq == seq && time.Since(a.present.at) < presentFor
	a.mu.Unlock()
	if fresh {
		return nil
	}
	if err := a.holds(ctx, seq, chain, "the newest this archive is known to hold"); err != nil {
		return err
	}
	a.mu.Lock()
	a.present.seq, a.present.at = seq, time.Now()
	a.mu.Unlock()
	return nil
}

// presentFor is how long a head found present answers for: lookups of
// runs that never were (a status of a wrong id) read no manifest each,
// and a destination that lost its archive is seen within it.
const presentFor = 10 * time.Second

// Holds returns nil when the destination holds manifest seq with chain:
// the archive that a record of what was archived (kept elsewhere, such as
// the head a store noted before its runs left) says this is. A missing
// manifest gives an error matching ErrUnavailable (not the archive
// written to, or not all of it there: a volume not mounted, another
// prefix), a different one ErrCorrupt.
func (a *Archive) Holds(ctx context.Context, seq uint64, chain string) error {
	return a.holds(ctx, seq, chain, "the newest that runs left hot state for")
}

func (a *Archive) holds(ctx context.Context, seq uint64, chain, which string) error {
	b, err := a.dest.Get(ctx, manifestName(seq), maxManifestBytes)
	if errors.Is(err, ErrObjectNotFound) {
		return newError(CodeUnavailable, err, "manifest %d, %s, is not at %s: it is not the archive written to "+
			"(a volume not mounted, a directory replaced, another prefix); nothing is archived until it is back", seq, which, a.dest)
	}
	if err != nil {
		return err
	}
	m, err := parseManifest(b, seq)
	if err != nil {
		return err
	}
	if m.Chain != chain {
		return newError(CodeCorrupt, nil, "manifest %d at %s is not %s (chain %s, want %s)", seq, a.dest, which, m.Chain, chain)
	}
	return nil
}

// Write archives runs as one segment and returns its manifest once both
// are confirmed: the segment was written and read back, and what came
// back is byte for byte what was written (the bytes whose SHA-256 and size
// the manifest records) and decompresses to exactly the lines each run's
// count and SHA-256 are over; then the manifest was written
// under the next seq (never over another) and read back byte for byte.
// Only then may the runs leave hot state. Each run must be given with every
// one of its records, in increasing runSeq; bad input fails with
// ErrInputInvalid and writes nothing. A destination that fails gives an
// error matching ErrUnavailable; the runs are then not archived (a segment
// may be left that no manifest names).
//
// A manifest that completes a range of the catalog (every 32nd) has Write
// build that range before it returns; the catalog is a hint for lookups,
// so a failure to write it does not fail the Write (catalog.go).
func (a *Archive) Write(ctx context.Context, runs []Run) (*Manifest, error) {
	m, err := a.write(ctx, runs)
	if err != nil {
		return nil, err
	}
	a.buildCatalog(ctx, m.Seq)
	return m, nil
}

func (a *Archive) write(ctx context.Context, runs []Run) (*Manifest, error) {
	if err := checkRuns(runs); err != nil {
		return nil, err
	}
	seg, err := buildSegment(runs)
	if err != nil {
		return nil, err
	}
	defer seg.release()
	m := seg.m
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.headRead {
		if err := a.loadHead(ctx); err != nil {
			return nil, err
		}
	} else if err := a.checkHead(ctx); err != nil {
		return nil, err
	}
	now := a.now().UTC()
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("archive: random segment name: %w", err)
	}
	m.CreatedAt = now.Format(time.RFC3339Nano)
	m.Segment = fmt.Sprintf("%s%019d-%s%s", segmentPrefix, now.UnixNano(), hex.EncodeToString(rnd[:]), segmentSuffix)
	// The manifest is sealed while the segment is being stored.
	var enc []byte
	var serr error
	if err := storeSegment(ctx, a.dest, seg, func() { enc, serr = a.sealManifest(m) }); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, serr
	}
	for try := 0; ; try++ {
		if try > 0 {
			if enc, err = a.sealManifest(m); err != nil {
				return nil, err
			}
		}
		err = a.dest.PutNew(ctx, manifestName(m.Seq), enc)
		if errors.Is(err, ErrConflict) {
			// The object may be this very manifest (it names this
			// segment): a request the destination stored whose answer was
			// lost, retried by the client (S3 clients retry).
			if got, gerr := a.dest.Get(ctx, manifestName(m.Seq), maxManifestBytes); gerr == nil && bytes.Equal(got, enc) {
				err = nil
			} else if try < conflictRetries {
				if err := a.loadHead(ctx); err != nil {
					return nil, err
				}
				continue
			}
		}
		if err != nil {
			return nil, err
		}
		got, err := a.dest.Get(ctx, manifestName(m.Seq), maxManifestBytes)
		if err != nil {
			return nil, err
		}
		if string(got) != string(enc) {
			return nil, newError(CodeCorrupt, nil, "manifest %d read back differs from what was written", m.Seq)
		}
		break
	}
	a.head = m
	a.wrote.seq, a.wrote.chain = m.Seq, m.Chain
	a.recent[m.Seq] = keysOf(m)
	for seq := range a.recent {
		if seq+catalogSpan <= m.Seq {
			delete(a.recent, seq)
		}
	}
	if a.indexed == m.Seq-1 {
		a.indexManifest(m)
	}
	out := *m
	return &out, nil
}

// storeSegment puts seg under its name and confirms it: that its bytes
// decompress to exactly the lines its manifest's counts and SHA-256 are
// over (checkLines), and that the destination gives back exactly those
// bytes (checkReadBack). The lines are checked, and also runs, on this
// goroutine while the destination stores the segment, so the store's wait
// (an fsync, a PUT) overlaps that CPU work; nothing is read back before
// the store answered.
func storeSegment(ctx context.Context, dest Destination, seg *segment, also func()) error {
	stored := make(chan error, 1)
	go func() { stored <- dest.Put(ctx, seg.m.Segment, seg.data) }()
	lerr := seg.checkLines()
	if also != nil {
		also()
	}
	if err := <-stored; err != nil {
		return err
	}
	if lerr != nil {
		return fmt.Errorf("check segment: %w", lerr)
	}
	back, err := dest.Get(ctx, seg.m.Segment, seg.m.SegmentBytes)
	if err != nil {
		return err
	}
	if err := checkReadBack(seg, back); err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	return nil
}

// sealManifest gives m the next seq after a.head, its Prev and its Chain,
// and returns its stored form. a.mu is held.
func (a *Archive) sealManifest(m *Manifest) ([]byte, error) {
	m.Seq, m.Prev = 1, Genesis
	if a.head != nil {
		m.Seq, m.Prev = a.head.Seq+1, a.head.Chain
	}
	return sealManifest(m, a.keys)
}

// indexWindow is how many of the newest manifests the index holds: what
// an Archive keeps per archived run follows this window, not the
// archive's history. Older runs are found through the catalog.
const indexWindow = 2 * catalogSpan

// indexManifest adds m's runs to the index, as its newest manifest, and
// drops the runs of manifests that left the window. a.mu is held.
func (a *Archive) indexManifest(m *Manifest) {
	ids := make([]string, len(m.Runs))
	for i, e := range m.Runs {
		a.index[e.RunID] = location{seq: m.Seq, entry: i}
		ids[i] = e.RunID
	}
	a.indexRuns[m.Seq] = ids
	a.indexed = m.Seq
	for seq, ids := range a.indexRuns {
		if seq+indexWindow > m.Seq {
			continue
		}
		for _, id := range ids {
			if l, ok := a.index[id]; ok && l.seq == seq {
				delete(a.index, id)
			}
		}
		delete(a.indexRuns, seq)
	}
}

// loadIndex reads the manifests the index has not read yet. Called
// without a.mu: it takes it only to merge each manifest it read, so a
// lookup or a Write does not wait for a read of every manifest. Each
// caller merges in seq order and skips a manifest another merged, so
// 1..indexed stay merged.
func (a *Archive) loadIndex(ctx context.Context) error {
	seqs, err := a.manifestSeqs(ctx)
	if err != nil {
		return err
	}
	a.mu.Lock()
	from := a.indexed
	a.mu.Unlock()
	if n := len(seqs); n > 0 && seqs[n-1] > indexWindow {
		from = max(from, seqs[n-1]-indexWindow) // older ones would leave the window at once
	}
	for _, seq := range seqs {
		if seq <= from {
			continue
		}
		m, err := a.readManifest(ctx, seq)
		unreadable := errors.Is(err, ErrCorrupt) || errors.Is(err, ErrObjectNotFound)
		if unreadable {
			// A manifest that cannot be read (damaged, forged, or gone
			// since the listing) indexes none of its runs, and is no
			// head to chain on to; a lookup of one of its runs reads it
			// and answers its error.
			m, err = &Manifest{Seq: seq}, nil
		}
		if err != nil {
			return err
		}
		a.mu.Lock()
		if seq > a.indexed {
			a.indexManifest(m)
			if !unreadable && (a.head == nil || seq > a.head.Seq) {
				a.head = m
			}
		}
		a.mu.Unlock()
	}
	return nil
}

// Lookup returns the manifest entry of runID's newest copy in the archive,
// or an error matching ErrRunNotFound. A run not among the manifests this
// Archive has read is found through the catalog: a bounded number of
// reads whatever the archive holds, and no listing unless another writer
// wrote since (catalog.go).
func (a *Archive) Lookup(ctx context.Context, runID string) (*RunEntry, error) {
	_, e, err := a.locate(ctx, runID)
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Refresh reads the manifests written since the archive last read them
// (by another process, or one before a restart), at most the newest
// indexWindow of them, so that LookupRead answers for their runs. It
// lists the destination once.
func (a *Archive) Refresh(ctx context.Context) error {
	return a.loadIndex(ctx)
}

// LookupRead is Lookup from the newest indexWindow manifests this
// Archive has read (at Refresh, Lookup, or its own Write): it never lists
// the destination, so its cost does not grow with the archive. A run only
// in manifests written since, or only in older ones, gives an error
// matching ErrRunNotFound.
func (a *Archive) LookupRead(ctx context.Context, runID string) (*RunEntry, error) {
	a.mu.Lock()
	_, ok := a.index[runID]
	a.mu.Unlock()
	if !ok {
		return nil, newError(CodeRunNotFound, nil, "run %q is not in %s", runID, a.dest)
	}
	_, e, err := a.locate(ctx, runID) // indexed: locate does not list
	return e, err
}

// NewestSeq returns the manifest that holds runID's newest copy in the
// archive (a run archived again, with records that arrived after its
// first copy, has more than one), reading the manifests after those it
// has read when through is beyond them, and finding a run older than the
// index's window through the catalog; an error matching ErrRunNotFound
// when the archive does not hold the run.
func (a *Archive) NewestSeq(ctx context.Context, runID string, through uint64) (uint64, error) {
	a.mu.Lock()
	indexed := a.indexed
	a.mu.Unlock()
	if indexed < through {
		if err := a.loadIndex(ctx); err != nil {
			return 0, err
		}
	}
	a.mu.Lock()
	loc, ok := a.index[runID]
	a.mu.Unlock()
	if ok {
		return loc.seq, nil // the window holds the newest manifests
	}
	m, _, err := a.lookupCatalog(ctx, runID)
	if err != nil {
		return 0, err
	}
	return m.Seq, nil
}

func (a *Archive) locate(ctx context.Context, runID string) (*Manifest, *RunEntry, error) {
	m, e, err := a.locateIn(ctx, runID)
	if errors.Is(err, ErrRunNotFound) || errors.Is(err, ErrObjectNotFound) {
		// Not found: in the archive, or because the destination is not
		// the archive (its newest manifest is not there)?
		if perr := a.checkPresent(ctx); perr != nil {
			return nil, nil, perr
		}
	}
	return m, e, err
}

func (a *Archive) locateIn(ctx context.Context, runID string) (*Manifest, *RunEntry, error) {
	a.mu.Lock()
	loc, ok := a.index[runID]
	a.mu.Unlock()
	if !ok {
		// Through the catalog: a bounded number of reads whatever the
		// archive holds, and no entry kept in memory per run.
		m, i, err := a.lookupCatalog(ctx, runID)
		if err != nil {
			return nil, nil, err
		}
		if err := a.checkLink(ctx, m); err != nil {
			return nil, nil, err
		}
		return m, &m.Runs[i], nil
	}
	m, err := a.readManifest(ctx, loc.seq)
	if err != nil {
		return nil, nil, err
	}
	if loc.entry >= len(m.Runs) || m.Runs[loc.entry].RunID != runID {
		return nil, nil, newError(CodeCorrupt, nil, "manifest %d no longer lists run %q", loc.seq, runID)
	}
	if err := a.checkLink(ctx, m); err != nil {
		return nil, nil, err
	}
	return m, &m.Runs[loc.entry], nil
}

// checkLink confirms that m is the manifest the chain holds at its place:
// the manifest after it names m's Chain as its Prev, or, m being the
// newest, m's Chain is the one this process wrote or hot state noted
// there (trustedChain; neither known: it passes). A manifest rewritten, hash and all, by a writer without the
// signing key is consistent in itself and fails only this (Verify reports
// it ARCHIVE_CHAIN_BROKEN); its runs are not read as genuine. With the
// manifest after m missing (deleted) or damaged itself, nothing links m,
// and it passes: one damaged manifest costs only its own runs.
func (a *Archive) checkLink(ctx context.Context, m *Manifest) error {
	next, err := a.readManifest(ctx, m.Seq+1)
	switch {
	case errors.Is(err, ErrObjectNotFound):
		if chain := a.trustedChain(m.Seq); chain != "" && chain != m.Chain {
			return newError(CodeCorrupt, nil, "manifest %d is not the newest manifest written (%s: its chain is %s, the writer's %s): it was rewritten; sidecar archive verify says more",
				m.Seq, ProblemChainBroken, m.Chain, chain)
		}
		return nil
	case errors.Is(err, ErrCorrupt):
		// The manifest after m is damaged itself: it costs its own runs
		// (its readers get its error), not m's.
		return nil
	case err != nil:
		return err
	}
	if err := Follows(m, next); err != nil {
		return newError(CodeCorrupt, err, "manifest %d cannot be read as the archive's", m.Seq)
	}
	return nil
}

// trustedChain is the chain of manifest seq as this process wrote it or
// hot state noted it (Expect), "" when it knows neither: not the one read
// from the destination, which may have been rewritten.
func (a *Archive) trustedChain(seq uint64) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch seq {
	case a.wrote.seq:
		return a.wrote.chain
	case a.expect.seq:
		return a.expect.chain
	}
	return ""
}

// Follows returns an error of code ARCHIVE_CHAIN_BROKEN (as in Verify's
// report) when next, the manifest after m, does not name m's Chain as its
// Prev: m was rewritten, hash and all, after next was written.
func Follows(m, next *Manifest) error {
	if next.Seq != m.Seq+1 || next.Prev == m.Chain {
		return nil
	}
	return &Error{Code: ProblemChainBroken, Message: fmt.Sprintf("manifest %d is not the one manifest %d names as its predecessor: it was rewritten after manifest %d was written; sidecar archive verify says more",
		m.Seq, next.Seq, next.Seq)}
}

// Records returns every record of runID from the archive, after checking
// its segment against its manifest (hash, counts, the run's SHA-256). A
// run not archived gives an error matching ErrRunNotFound.
func (a *Archive) Records(ctx context.Context, runID string) ([]statestore.RunEventRecord, error) {
	m, e, err := a.locate(ctx, runID)
	if err != nil {
		return nil, err
	}
	data, err := a.dest.Get(ctx, m.Segment, segmentLimit(m))
	if errors.Is(err, ErrObjectNotFound) {
		return nil, newError(CodeCorrupt, err, "manifest %d names segment %s, which is missing", m.Seq, m.Segment)
	}
	if err != nil {
		return nil, err
	}
	runs, err := decodeSegment(m, data)
	if err != nil {
		return nil, err
	}
	for i := range m.Runs {
		if m.Runs[i].RunID == e.RunID {
			return runs[i], nil
		}
	}
	return nil, newError(CodeRunNotFound, nil, "run %q is not in %s", runID, a.dest)
}
