package archive_test

import (
	"context"
	"errors"
	"net/http/httptrace"
	"sync/atomic"
	"testing"

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
