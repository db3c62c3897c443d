package archive_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
)

// TestArchive_ReadsSingleMemberSegments checks that an archive whose
// segments are each one gzip stream (testdata/compat/single-member: a
// one-run segment and a 60-run one, as archives were written before
// segments were cut into members) still verifies and reads, and that this
// version's writes chain on to it.
func TestArchive_ReadsSingleMemberSegments(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "archive")
	if err := os.CopyFS(root, os.DirFS("testdata/compat/single-member")); err != nil {
		t.Fatal(err)
	}
	d := archive.NewDir(root)
	rep := mustVerify(t, d, archive.VerifyOptions{})
	if len(rep.Problems) != 0 || rep.Manifests != 2 || rep.Runs != 61 || rep.Records != 244 {
		t.Fatalf("verify: %d manifests, %d runs, %d records, problems %+v; want 2, 61, 244, none", rep.Manifests, rep.Runs, rep.Records, rep.Problems)
	}
	a := mustOpen(t, d)
	for _, id := range []string{"compat-0 <&>", "compat-60 <&>"} {
		recs, err := a.Records(ctx, id)
		if err != nil || len(recs) != 4 || recs[0].RunID != id {
			t.Fatalf("records of %q: %d, %v; want 4 of the run", id, len(recs), err)
		}
	}
	m, err := a.Write(ctx, finishedRuns(t, "after", 100))
	if err != nil {
		t.Fatal(err)
	}
	if rep := mustVerify(t, d, archive.VerifyOptions{ExpectHead: m.Chain}); len(rep.Problems) != 0 || rep.Manifests != 3 || rep.Runs != 161 {
		t.Fatalf("verify after a write: %d manifests, %d runs, problems %+v", rep.Manifests, rep.Runs, rep.Problems)
	}
}
