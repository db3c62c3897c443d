package archive

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// VerifyOptions configures Verify.
type VerifyOptions struct {
	// ExpectHead, when set, is a Chain known from elsewhere (a head the
	// sidecar reported earlier): the archive must hold a manifest with
	// that Chain, so that no manifest up to it was dropped or rewritten.
	ExpectHead string
	// AllowEmpty accepts a destination that holds no manifest (an archive
	// nothing was written to yet); without it that is ProblemArchiveEmpty.
	AllowEmpty bool
	// Keys, when set, are the keys the sidecar signs manifests with: every
	// signed manifest must check under one of them
	// (ProblemSignatureInvalid), and every manifest from the first signed
	// one on must be signed (ProblemManifestUnsigned), as must one at
	// least: manifests before the first signed one are an archive written
	// before it had keys. So a manifest added or rewritten by someone
	// without a key does not verify.
	Keys *Keys
}

// Report is what Verify found.
type Report struct {
	// Destination is the archive's URL.
	Destination string `json:"destination"`
	// Manifests is the newest manifest seq; Segments the segments read.
	Manifests uint64 `json:"manifests"`
	Segments  int64  `json:"segments"`
	// Runs is the number of distinct runs and Records of records in the
	// segments that verified.
	Runs    int64 `json:"runs"`
	Records int64 `json:"records"`
	// Head is the newest manifest's Chain (empty for an empty archive).
	Head string `json:"head"`
	// Problems are what does not verify, in manifest order; none: the
	// archive is whole.
	Problems []Problem `json:"problems"`
	// Orphans are segments no manifest names: left by a writer that died
	// between segment and manifest. They are not part of the archive.
	Orphans []string `json:"orphans,omitempty"`
	// Signed is the number of manifests whose signature checked under
	// VerifyOptions.Keys, and FirstSigned the first of them (0: none, or
	// no keys given). Manifests before FirstSigned were written before the
	// archive had keys.
	Signed      int64  `json:"signed"`
	FirstSigned uint64 `json:"firstSigned,omitempty"`
	// CatalogShards is the number of catalog shards that match the
	// manifests they cover; CatalogMissing the number of shards of ranges
	// the manifests fill that are absent (a writer that died before
	// building them, or an archive written before it had a catalog):
	// lookups read the ranges below them, or their manifests, instead. A
	// shard that does not match is a problem (ProblemCatalogInvalid).
	CatalogShards  int64 `json:"catalogShards"`
	CatalogMissing int64 `json:"catalogMissing"`
}

// Problem is one thing that does not verify.
type Problem struct {
	// Code is one of the Problem* codes.
	Code string `json:"code"`
	// Seq is the manifest concerned (0: none).
	Seq uint64 `json:"seq,omitempty"`
	// Object is the object concerned, if any.
	Object  string `json:"object,omitempty"`
	Message string `json:"message"`
}

// Verify proves the archive complete and unchanged: every manifest from 1
// to the newest is present, each is the hash of its content and chains to
// the one before, every segment matches its manifest's size and SHA-256,
// and every run in it its record count and SHA-256. A destination with no
// manifest at all does not verify (ProblemArchiveEmpty) unless
// opts.AllowEmpty, and a directory that does not exist is ErrUnavailable.
// What does not verify
// is reported in Report.Problems, an object whose bytes the destination
// itself finds changed (Get's ErrCorrupt) included; the error is only for
// a destination that cannot be read (ErrUnavailable).
func Verify(ctx context.Context, dest Destination, opts VerifyOptions) (*Report, error) {
	rep := &Report{Destination: dest.String(), Problems: []Problem{}}
	if rc, ok := dest.(rootChecker); ok {
		if err := rc.checkRoot(); err != nil {
			return nil, err
		}
	}
	a := &Archive{dest: dest}
	seqs, err := a.manifestSeqs(ctx)
	if err != nil {
		return nil, err
	}
	if len(seqs) == 0 && !opts.AllowEmpty {
		rep.Problems = append(rep.Problems, Problem{Code: ProblemArchiveEmpty,
			Message: "no manifest in " + dest.String() + ": a wrong location, an archive nothing was written to yet, or one whose manifests were all removed; nothing was verified"})
	}
	named := map[string]bool{}
	runs := map[string]bool{}
	first := map[string]runCopy{} // each run's first copy that verified
	keys := map[uint64][]uint64{} // run keys of the manifests that parsed
	prev, headFound := Genesis, opts.ExpectHead == ""
	next := uint64(1)
	for _, seq := range seqs {
		if next < seq {
			// One problem for a gap, however long: a stray name with a
			// large number must not cost a problem per number below it.
			msg := "manifest is missing"
			if seq-next > 1 {
				msg = fmt.Sprintf("manifests %d to %d are missing (%d)", next, seq-1, seq-next)
			}
			rep.Problems = append(rep.Problems, Problem{Code: ProblemManifestMissing, Seq: next, Object: manifestName(next), Message: msg})
			prev = "" // the next manifest's Prev cannot be checked
		}
		next = seq + 1
		rep.Manifests = seq
		m, err := a.readManifest(ctx, seq)
		if errors.Is(err, ErrUnavailable) {
			return nil, err
		}
		if errors.Is(err, ErrObjectNotFound) {
			rep.Problems = append(rep.Problems, Problem{Code: ProblemManifestMissing, Seq: seq, Object: manifestName(seq), Message: "manifest is missing"})
			prev = ""
			continue
		}
		if err != nil {
			rep.Problems = append(rep.Problems, Problem{Code: ProblemManifestInvalid, Seq: seq, Object: manifestName(seq), Message: err.Error()})
			prev = ""
			continue
		}
		if prev != "" && m.Prev != prev {
			rep.Problems = append(rep.Problems, Problem{Code: ProblemChainBroken, Seq: seq, Object: manifestName(seq),
				Message: "prev " + m.Prev + " is not the chain of manifest before it, " + prev})
		}
		prev = m.Chain
		rep.Head = m.Chain
		if opts.Keys != nil {
			verifySignature(opts.Keys, m, rep)
		}
		keys[seq] = keysOf(m)
		if m.Chain == opts.ExpectHead {
			headFound = true
		}
		named[m.Segment] = true
		data, err := dest.Get(ctx, m.Segment, segmentLimit(m))
		switch {
		case errors.Is(err, ErrObjectNotFound):
			rep.Problems = append(rep.Problems, Problem{Code: ProblemSegmentMissing, Seq: seq, Object: m.Segment, Message: "segment is missing"})
			continue
		case errors.Is(err, ErrCorrupt):
			rep.Problems = append(rep.Problems, Problem{Code: ProblemSegmentCorrupt, Seq: seq, Object: m.Segment, Message: err.Error()})
			continue
		case err != nil:
			return nil, err
		}
		if _, err := decodeSegment(m, data); err != nil {
			rep.Problems = append(rep.Problems, Problem{Code: ProblemSegmentCorrupt, Seq: seq, Object: m.Segment, Message: err.Error()})
			continue
		}
		rep.Segments++
		rep.Records += m.Records
		for _, e := range m.Runs {
			runs[e.RunID] = true
			c := runCopy{seq: seq, ident: [5]string{e.TenantID, e.ProjectID, e.EnvironmentID, e.PlanID, e.PlanVersion}}
			f, seen := first[e.RunID]
			switch {
			case !seen:
				first[e.RunID] = c
			case f.ident != c.ident:
				rep.Problems = append(rep.Problems, Problem{Code: ProblemRunCopiesDisagree, Seq: seq, Object: manifestName(seq),
					Message: fmt.Sprintf("run %s is tenant/project/environment/plan/version %s here, %s in its first copy (manifest %d)",
						e.RunID, strings.Join(c.ident[:], "/"), strings.Join(f.ident[:], "/"), f.seq)})
			}
		}
	}
	rep.Runs = int64(len(runs))
	if opts.Keys != nil && rep.Signed == 0 && len(seqs) > 0 {
		rep.Problems = append(rep.Problems, Problem{Code: ProblemManifestUnsigned,
			Message: "no manifest is signed with a key given (" + strings.Join(opts.Keys.IDs(), ", ") + "): the archive was written without these keys, or its manifests were rewritten by someone without them"})
	}
	if !headFound {
		rep.Problems = append(rep.Problems, Problem{Code: ProblemHeadMismatch,
			Message: "no manifest has chain " + opts.ExpectHead + ": manifests up to it were removed or rewritten"})
	}
	if err := verifyCatalog(ctx, dest, rep, keys); err != nil {
		return nil, err
	}
	segs, err := dest.List(ctx, segmentPrefix)
	if err != nil {
		return nil, err
	}
	for _, s := range segs {
		if !named[s] {
			rep.Orphans = append(rep.Orphans, s)
		}
	}
	slices.Sort(rep.Orphans)
	return rep, nil
}

// verifySignature checks m's signature under keys and counts it in rep:
// a signed manifest must check, and an unsigned one is a problem once a
// manifest before it was signed.
func verifySignature(keys *Keys, m *Manifest, rep *Report) {
	if m.Signature == nil {
		if rep.FirstSigned != 0 {
			rep.Problems = append(rep.Problems, Problem{Code: ProblemManifestUnsigned, Seq: m.Seq, Object: manifestName(m.Seq),
				Message: fmt.Sprintf("manifest is not signed, and manifest %d before it is: it was not written by the sidecar", rep.FirstSigned)})
		}
		return
	}
	if err := keys.check(m); err != nil {
		rep.Problems = append(rep.Problems, Problem{Code: ProblemSignatureInvalid, Seq: m.Seq, Object: manifestName(m.Seq), Message: err.Error()})
		return
	}
	rep.Signed++
	if rep.FirstSigned == 0 {
		rep.FirstSigned = m.Seq
	}
}

// runCopy is where a run's copy is and the names it gives the run.
type runCopy struct {
	seq   uint64
	ident [5]string
}

// rootChecker is a Destination that tells a root that is not there (a
// directory that does not exist) from one that holds no object yet.
type rootChecker interface {
	// checkRoot returns an error matching ErrUnavailable when the root is
	// not there.
	checkRoot() error
}

// verifyCatalog checks every object under catalog/ against the run keys
// of the manifests (keys, by seq) and counts the shards of full ranges
// that are absent (of the ranges that hold a manifest that parsed).
func verifyCatalog(ctx context.Context, dest Destination, rep *Report, keys map[uint64][]uint64) error {
	names, err := dest.List(ctx, catalogPrefix)
	if err != nil {
		return err
	}
	present := map[string]bool{}
	for _, name := range names {
		present[name] = true
		l, first, s, ok := parseCatalogName(name)
		if !ok {
			rep.Problems = append(rep.Problems, Problem{Code: ProblemCatalogInvalid, Object: name,
				Message: "not a catalog shard name; remove it"})
			continue
		}
		last := first + catalogWidth(l) - 1
		if last > rep.Manifests {
			rep.Problems = append(rep.Problems, Problem{Code: ProblemCatalogInvalid, Seq: last, Object: name,
				Message: fmt.Sprintf("covers manifests %d to %d, the archive ends at %d; remove it", first, last, rep.Manifests)})
			continue
		}
		lo, hi := keyInterval(shardBits(l), s)
		var want []catalogEntry
		whole := true
		for seq := first; seq <= last; seq++ {
			k, ok := keys[seq]
			whole = whole && ok
			for _, key := range k {
				if key >= lo && key <= hi {
					want = append(want, catalogEntry{key: key, seq: seq})
				}
			}
		}
		if !whole {
			continue // a manifest it covers is missing or invalid: reported above
		}
		slices.SortFunc(want, compareEntries)
		want = slices.Compact(want)
		data, err := dest.Get(ctx, name, maxShardBytes)
		if errors.Is(err, ErrObjectNotFound) {
			continue // removed since the listing
		}
		if errors.Is(err, ErrCorrupt) {
			rep.Problems = append(rep.Problems, Problem{Code: ProblemCatalogInvalid, Seq: first, Object: name,
				Message: err.Error() + "; remove it (lookups then read what it covers from below)"})
			continue
		}
		if err != nil {
			return err
		}
		if !bytes.Equal(data, encodeShard(l, first, s, want)) {
			var msg string
			if got, perr := parseShard(l, first, s, data); perr != nil {
				msg = perr.Error() + "; remove it (lookups then read what it covers from below)"
			} else {
				msg = fmt.Sprintf("its %d entries differ from the %d its manifests %d to %d give; remove it (lookups then read what it covers from below)", len(got), len(want), first, last)
			}
			rep.Problems = append(rep.Problems, Problem{Code: ProblemCatalogInvalid, Seq: first, Object: name, Message: msg})
			continue
		}
		rep.CatalogShards++
	}
	// The full ranges that hold a manifest that parsed: their number
	// follows the manifests found, not the newest seq (a stray name with a
	// large number must not cost a loop up to it).
	for l := range catalogLevels {
		w := catalogWidth(l)
		starts := map[uint64]bool{}
		for seq := range keys {
			if first := (seq-1)/w*w + 1; first-1+w <= rep.Manifests {
				starts[first] = true
			}
		}
		for first := range starts {
			for s := range 1 << shardBits(l) {
				if !present[catalogName(l, first, s)] {
					rep.CatalogMissing++
				}
			}
		}
	}
	return nil
}
