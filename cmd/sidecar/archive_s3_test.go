package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/archive/archivetest"
)

// TestArchiveCommand_S3 verifies and reads an archive in a bucket of a
// real S3-compatible server through its s3:// URL, with the endpoint and
// credentials from the AWS variables.
func TestArchiveCommand_S3(t *testing.T) {
	srv := archivetest.StartS3(t)
	for k, v := range srv.Env() {
		t.Setenv(k, v)
	}
	_, _, r, m := writeArchive(t)
	a, err := archive.Open(context.Background(), srv.Bucket("archive", "prod/sidecar"), archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err = a.Write(context.Background(), []archive.Run{r})
	if err != nil {
		t.Fatal(err)
	}
	url := "s3://archive/prod/sidecar"
	code, out, errOut := run(t, "archive", "verify", "--archive", url, "--expect-head", m.Chain)
	if code != exitOK || !strings.Contains(out, "verified "+url+": 1 manifest, 1 segment, 1 run, 4 records: 0 problems") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = run(t, "archive", "events", r.ID, "--archive", url)
	if code != exitOK || strings.Count(out, "\n") != len(r.Records) || !strings.Contains(out, "RunCompleted") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	// The segment's bytes changed in the server's storage: the archive
	// does not verify (exit 1), it is not unreadable (exit 3).
	p := srv.ObjectFile("archive", "prod/sidecar/"+m.Segment)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, "archive", "verify", "--archive", url)
	if code != exitError || !strings.Contains(out, "PROBLEM "+archive.ProblemSegmentCorrupt+" "+m.Segment) {
		t.Fatalf("segment changed: exit %d\n%s%s", code, out, errOut)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	if code, out, errOut = run(t, "archive", "verify", "--archive", url); code != exitArchiveUnreadable || !strings.Contains(errOut, archive.CodeUnavailable) || !strings.Contains(errOut, "SignatureDoesNotMatch") {
		t.Fatalf("wrong secret: exit %d\n%s%s", code, out, errOut)
	}
}
