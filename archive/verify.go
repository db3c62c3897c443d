package archive

import (
	"context"
	"errors"
	"slices"
)

// VerifyOptions configures Verify.
type VerifyOptions struct {
	// ExpectHead, when set, is a Chain known from elsewhere (a head the
	// sidecar reported earlier): the archive must hold a manifest with
	// that Chain, so that no manifest up to it was dropped or rewritten.
	ExpectHead string
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
// and every run in it its record count and SHA-256. What does not verify
// is reported in Report.Problems; the error is only for a destination that
// cannot be read (ErrUnavailable).
func Verify(ctx context.Context, dest Destination, opts VerifyOptions) (*Report, error) {
	rep := &Report{Destination: dest.String(), Problems: []Problem{}}
	a := &Archive{dest: dest}
	seqs, err := a.manifestSeqs(ctx)
	if err != nil {
		return nil, err
	}
	named := map[string]bool{}
	runs := map[string]bool{}
	prev, headFound := Genesis, opts.ExpectHead == ""
	next := uint64(1)
	for _, seq := range seqs {
		for ; next < seq; next++ {
			rep.Problems = append(rep.Problems, Problem{Code: ProblemManifestMissing, Seq: next, Object: manifestName(next), Message: "manifest is missing"})
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
		if m.Chain == opts.ExpectHead {
			headFound = true
		}
		named[m.Segment] = true
		data, err := dest.Get(ctx, m.Segment)
		switch {
		case errors.Is(err, ErrObjectNotFound):
			rep.Problems = append(rep.Problems, Problem{Code: ProblemSegmentMissing, Seq: seq, Object: m.Segment, Message: "segment is missing"})
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
		}
	}
	rep.Runs = int64(len(runs))
	if !headFound {
		rep.Problems = append(rep.Problems, Problem{Code: ProblemHeadMismatch,
			Message: "no manifest has chain " + opts.ExpectHead + ": manifests up to it were removed or rewritten"})
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
