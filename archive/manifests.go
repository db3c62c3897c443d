package archive

import "context"

// ManifestSeqs returns the sequence numbers of the archive's manifests,
// oldest first. It lists the destination's manifest names and reads none
// of them, so a reader can page through the archive a manifest at a time.
func (a *Archive) ManifestSeqs(ctx context.Context) ([]uint64, error) {
	return a.manifestSeqs(ctx)
}

// Manifest reads manifest seq and checks that it parses and that its
// chain is the hash of its content. A manifest that does not exist is an
// error matching ErrObjectNotFound.
func (a *Archive) Manifest(ctx context.Context, seq uint64) (*Manifest, error) {
	return a.readManifest(ctx, seq)
}
