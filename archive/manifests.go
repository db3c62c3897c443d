package archive

import (
	"context"
	"slices"
)

// ManifestSeqs returns the sequence numbers of the archive's manifests,
// oldest first. It lists the destination's manifest names and reads none
// of them, so a reader can page through the archive a manifest at a time.
//
// A destination that lacks the newest manifest this archive is known to
// hold (written, read, or named by Expect) is not the archive: that is an
// error matching ErrUnavailable, not a shorter listing.
func (a *Archive) ManifestSeqs(ctx context.Context) ([]uint64, error) {
	seqs, err := a.manifestSeqs(ctx)
	if err != nil {
		return nil, err
	}
	if want, _ := a.wantHead(); want > 0 && !slices.Contains(seqs, want) {
		return nil, newError(CodeUnavailable, nil, "manifest %d, the newest this archive is known to hold, is not at %s: it is not the archive written to "+
			"(a volume not mounted, a directory replaced, another prefix)", want, a.dest)
	}
	return seqs, nil
}

// Manifest reads manifest seq and checks that it parses and that its
// chain is the hash of its content. A manifest that does not exist is an
// error matching ErrObjectNotFound.
func (a *Archive) Manifest(ctx context.Context, seq uint64) (*Manifest, error) {
	return a.readManifest(ctx, seq)
}
