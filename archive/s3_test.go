package archive_test

import (
	"context"
	"errors"
	"net/http/httptrace"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/archive/archivetest"
)

// TestArchive_OpenWhileDown opens an archive whose S3 server is down:
// Open succeeds (a sidecar starts and reports its archive failing), Write
// fails with ErrUnavailable and writes nothing, and once the server is
// back Write chains on to the manifests written before.
func TestArchive_OpenWhileDown(t *testing.T) {
	ctx := context.Background()
	srv := archivetest.StartS3(t)
	dest := srv.Bucket("down", "a")
	runs := finishedRuns(t, "r", 3)
	first, err := mustOpen(t, dest).Write(ctx, runs[:1])
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	a, err := archive.Open(ctx, dest, archive.Options{})
	if err != nil {
		t.Fatalf("Open while the server is down: %v", err)
	}
	if _, err := a.Write(ctx, runs[1:2]); !errors.Is(err, archive.ErrUnavailable) {
		t.Fatalf("Write while down: got %v, want ErrUnavailable", err)
	}
	srv.Start()
	m, err := a.Write(ctx, runs[1:2])
	if err != nil {
		t.Fatal(err)
	}
	if m.Seq != 2 || m.Prev != first.Chain {
		t.Fatalf("got manifest %d after %s, want 2 after manifest 1 (%s)", m.Seq, m.Prev, first.Chain)
	}
	rep := mustVerify(t, dest, archive.VerifyOptions{})
	if len(rep.Problems) != 0 || rep.Manifests != 2 || rep.Runs != 2 {
		t.Fatalf("got report %+v", rep)
	}
}

// TestS3_ReusesConnections checks that the archive's requests to an S3
// server reuse their HTTP connections (keep-alive): a Write is four
// requests in a row (the segment's PUT and GET, the manifest's), and a
// new TCP connection for each costs the server an accept and a
// connection's setup every time.
func TestS3_ReusesConnections(t *testing.T) {
	var reused, fresh atomic.Int64
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			if i.Reused {
				reused.Add(1)
			} else {
				fresh.Add(1)
			}
		},
	})
	a := mustOpen(t, archivetest.StartS3(t).Bucket("keepalive", "a"))
	for _, r := range finishedRuns(t, "r", 10) {
		if _, err := a.Write(ctx, []archive.Run{r}); err != nil {
			t.Fatal(err)
		}
	}
	// One connection, made by the first request, would do; a few more
	// leave room for a connection the server or the client closed.
	if fresh.Load() > 4 || reused.Load() < 36 {
		t.Fatalf("%d requests on a new connection, %d on a reused one; want at most 4 new of 40", fresh.Load(), reused.Load())
	}
}

// TestS3_ChangedObject changes one segment's bytes in the server's own
// file, behind its back: the server still answers with the checksum it
// stored, so the client's check of the response fails. Verify reports
// that segment corrupt and checks the others, and a reader of a run in it
// gets ErrCorrupt, not ErrUnavailable.
func TestS3_ChangedObject(t *testing.T) {
	ctx := context.Background()
	srv := archivetest.StartS3(t)
	dest := srv.Bucket("changed", "a")
	a := mustOpen(t, dest)
	runs := finishedRuns(t, "r", 3)
	var ms []*archive.Manifest
	for _, r := range runs {
		m, err := a.Write(ctx, []archive.Run{r})
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	p := srv.ObjectFile("changed", "a/"+ms[1].Segment)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := archive.Verify(ctx, dest, archive.VerifyOptions{})
	if err != nil {
		t.Fatalf("Verify: got %v, want a report", err)
	}
	if len(rep.Problems) != 1 || rep.Problems[0].Code != archive.ProblemSegmentCorrupt || rep.Problems[0].Object != ms[1].Segment ||
		rep.Manifests != 3 || rep.Segments != 2 || rep.Runs != 2 {
		t.Fatalf("got report %+v, want 3 manifests, segment %s corrupt, the 2 others verified", rep, ms[1].Segment)
	}
	if _, err := mustOpen(t, dest).Records(ctx, runs[1].ID); !errors.Is(err, archive.ErrCorrupt) || errors.Is(err, archive.ErrUnavailable) {
		t.Fatalf("Records of the run in it: got %v, want ErrCorrupt", err)
	}
	if _, err := dest.Get(ctx, ms[1].Segment, 1<<20); !errors.Is(err, archive.ErrCorrupt) {
		t.Fatalf("Get: got %v, want ErrCorrupt", err)
	}
}

// TestS3_WrongPrefix verifies a prefix of a bucket that holds an archive
// under another prefix: nothing is there, which does not verify unless
// an empty archive is allowed.
func TestS3_WrongPrefix(t *testing.T) {
	ctx := context.Background()
	srv := archivetest.StartS3(t)
	if _, err := mustOpen(t, srv.Bucket("prefixes", "prod")).Write(ctx, finishedRuns(t, "r", 1)); err != nil {
		t.Fatal(err)
	}
	typo, err := archive.NewS3(ctx, srv.Config("prefixes", "prd"))
	if err != nil {
		t.Fatal(err)
	}
	rep := mustVerify(t, typo, archive.VerifyOptions{})
	if len(rep.Problems) != 1 || rep.Problems[0].Code != archive.ProblemArchiveEmpty || !strings.Contains(rep.Problems[0].Message, "s3://prefixes/prd") {
		t.Fatalf("got %+v, want %s naming s3://prefixes/prd", rep, archive.ProblemArchiveEmpty)
	}
	if rep := mustVerify(t, typo, archive.VerifyOptions{AllowEmpty: true}); len(rep.Problems) != 0 {
		t.Fatalf("AllowEmpty: got %+v, want no problem", rep)
	}
}

// TestS3_ChangedCatalogShard changes every catalog shard's bytes in the
// server's own files: lookups read the manifests the shards cover
// instead, and Verify reports each shard.
func TestS3_ChangedCatalogShard(t *testing.T) {
	ctx := context.Background()
	srv := archivetest.StartS3(t)
	dest := srv.Bucket("catalog", "a")
	runs := writeSegments(t, dest, 32) // the first range of the catalog: 4 shards
	shards, err := dest.List(ctx, "catalog/")
	if err != nil || len(shards) != 4 {
		t.Fatalf("catalog: %v, %v; want 4 shards", shards, err)
	}
	for _, name := range shards {
		p := srv.ObjectFile("catalog", "a/"+name)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)-2] ^= 1
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range runs {
		if e, err := mustOpen(t, dest).Lookup(ctx, r.ID); err != nil || e.RunID != r.ID {
			t.Fatalf("lookup of run %d: %+v, %v", i, e, err)
		}
	}
	rep := mustVerify(t, dest, archive.VerifyOptions{})
	if len(rep.Problems) != 4 || rep.Segments != int64(rep.Manifests) {
		t.Fatalf("got report %+v, want every segment verified and 4 problems", rep)
	}
	for _, p := range rep.Problems {
		if p.Code != archive.ProblemCatalogInvalid {
			t.Fatalf("got problem %+v, want %s", p, archive.ProblemCatalogInvalid)
		}
	}
}

// A server that accepts connections and answers nothing (hung, overloaded)
// fails a call with ARCHIVE_UNAVAILABLE once it stayed silent for the
// stall bound, not after the whole call's bound: a read of an archived run
// answered only when the server woke up, two minutes later, and a failing
// retention pass took as long to say so. The server is woken after 30 s:
// a call still waiting then would succeed.
func TestS3_SilentServerFailsTheCall(t *testing.T) {
	ctx := context.Background()
	srv := archivetest.StartS3(t)
	srv.Bucket("stall", "a")
	cfg := srv.Config("stall", "a")
	cfg.StallTimeout = time.Second
	d, err := archive.NewS3(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Put(ctx, "x", []byte("y")); err != nil {
		t.Fatal(err)
	}
	thaw := srv.Freeze()
	woken := time.AfterFunc(30*time.Second, thaw)
	defer woken.Stop()
	if _, err := d.Get(ctx, "x", 1<<20); !errors.Is(err, archive.ErrUnavailable) {
		t.Fatalf("a Get from a silent server: %v, want ARCHIVE_UNAVAILABLE", err)
	}
	if err := d.Put(ctx, "z", []byte("y")); !errors.Is(err, archive.ErrUnavailable) {
		t.Fatalf("a Put to a silent server: %v, want ARCHIVE_UNAVAILABLE", err)
	}
}
