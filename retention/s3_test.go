package retention_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/archive/archivetest"
	"github.com/conductor-sidecar/sidecar/retention"
)

// TestRetention_S3 archives finished runs to a bucket prefix of a real
// S3-compatible server (archivetest: versitygw) and removes them; the
// archive, opened again from its s3:// URL and the AWS variables, verifies
// clean and holds every record. With the server stopped, a pass removes
// nothing and sets sidecar_archive_failing; once it is back, the next pass
// archives and removes.
func TestRetention_S3(t *testing.T) {
	ctx := context.Background()
	srv := archivetest.StartS3(t)
	for k, v := range srv.Env() {
		t.Setenv(k, v)
	}
	const url = "s3://retention/sidecar/archive"
	dest := srv.Bucket("retention", "sidecar/archive")

	h := newHot(t, 5, 2, nil)
	reg := prometheus.NewRegistry()
	r := h.retention(h.archive(dest), h.remover(), retention.Options{BatchRuns: 2, Metrics: retention.NewMetrics(reg)})
	res, err := r.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Archived != 5 || res.Removed != 5 {
		t.Fatalf("got %+v, want 5 archived and removed", res)
	}
	requireArchivedS3(t, h, url, 3, 5)

	t.Run("DestinationDown", func(t *testing.T) {
		h := newHot(t, 3, 1, nil)
		dest := srv.Bucket("retention-down", "")
		reg := prometheus.NewRegistry()
		r := h.retention(h.archive(dest), h.remover(), retention.Options{Metrics: retention.NewMetrics(reg)})
		srv.Stop()
		if _, err := r.Pass(ctx); !errors.Is(err, archive.ErrUnavailable) {
			t.Fatalf("got %v, want ErrUnavailable", err)
		}
		for id, want := range h.finished {
			if got, _ := h.store.Fetch(ctx, id, 0, 0); !reflect.DeepEqual(got, want) {
				t.Fatalf("run %s: %d of %d records left while the archive was down", id, len(got), len(want))
			}
		}
		if got := testutil.ToFloat64(mustGauge(t, reg, "sidecar_archive_failing")); got != 1 {
			t.Fatalf("sidecar_archive_failing = %v, want 1", got)
		}
		srv.Start()
		if res, err := r.Pass(ctx); err != nil || res.Removed != 3 {
			t.Fatalf("after the archive came back: %+v %v", res, err)
		}
		if got := testutil.ToFloat64(mustGauge(t, reg, "sidecar_archive_failing")); got != 0 {
			t.Fatalf("sidecar_archive_failing = %v, want 0", got)
		}
		requireArchivedS3(t, h, "s3://retention-down", 1, 3)
	})
}

// requireArchivedS3 checks that the archive at url (opened from the URL,
// as `sidecar archive verify` does) verifies with manifests manifests and
// runs runs, that every finished run of h left the log and is in the
// archive with exactly its records, and that open runs stayed.
func requireArchivedS3(t *testing.T, h *hot, url string, manifests uint64, runs int64) {
	t.Helper()
	ctx := context.Background()
	dest, err := archive.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := archive.Verify(ctx, dest, archive.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 0 || rep.Manifests != manifests || rep.Runs != runs || len(rep.Orphans) != 0 {
		t.Fatalf("verify %s: got %+v, want %d manifests, %d runs, no problems", url, rep, manifests, runs)
	}
	a, err := archive.Open(ctx, dest, archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range h.finished {
		if got, _ := h.store.Fetch(ctx, id, 0, 0); len(got) != 0 {
			t.Fatalf("run %s: %d records still in the log", id, len(got))
		}
		got, err := a.Records(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("run %s: archived records differ from the log's", id)
		}
	}
	for _, id := range h.open {
		if got, _ := h.store.Fetch(ctx, id, 0, 0); len(got) != 3 {
			t.Fatalf("open run %s has %d records, want 3", id, len(got))
		}
	}
	if err := h.store.Check(ctx); err != nil {
		t.Fatalf("the log does not verify: %v", err)
	}
}
