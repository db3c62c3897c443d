package node

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestNode_Retention: a node with retention creates a removable log,
// removes a finished run once archived (as the retention user, on the
// external server), keeps an open one, and exports the log's size.
func TestNode_Retention(t *testing.T) {
	ctx := context.Background()
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", RetentionPassword: "retention-pw", RetentionPermissions: retentionPermissions(), Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	dir := filepath.Join(t.TempDir(), "archive")
	cfg.Retention = Retention{Finished: time.Millisecond, Interval: 50 * time.Millisecond, Archive: "file://" + dir,
		NATSOptions: []nats.Option{nats.UserInfo(natsstore.RetentionUser, "retention-pw")}}
	reg := prometheus.NewRegistry()
	n := New(cfg, zaptest.NewLogger(t), reg)
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	for _, w := range []*statestore.RunEventWrite{
		storetest.Event("node-done", statestore.RunStarted, ""), storetest.Event("node-done", statestore.RunCompleted, ""),
		storetest.Event("node-open", statestore.RunStarted, ""),
	} {
		if _, err := n.store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs, err := n.store.Fetch(ctx, "node-done", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the finished run was not removed within 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if recs, _ := n.store.Fetch(ctx, "node-open", 0, 0); len(recs) != 1 {
		t.Fatalf("the open run has %d records, want 1", len(recs))
	}
	rep, err := archive.Verify(ctx, archive.NewDir(dir), archive.VerifyOptions{})
	if err != nil || len(rep.Problems) != 0 || rep.Runs != 1 || rep.Records != 2 {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	if err := n.Ready(ctx); err != nil {
		t.Fatalf("Ready after a removal: %v", err)
	}
	// Its snapshot left with it (the event ids too: RunKeys).
	snaps, err := n.js.KeyValue(ctx, natsstore.DefaultSnapshotBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snaps.Get(ctx, natsstore.RunToken("node-done")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("snapshot of the removed run: %v, want ErrKeyNotFound", err)
	}
	if got, err := testutil.GatherAndCount(reg, "sidecar_log_records", "sidecar_retention_runs_removed_total", "sidecar_archive_failing"); err != nil || got != 3 {
		t.Fatalf("retention and log size metrics: %d series, %v", got, err)
	}
}
