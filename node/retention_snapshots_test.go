package node

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestNode_RetentionSavesNoSnapshot: serve's retention, with every
// Forgetter it wires (Conductor's copy removed, the default), archives
// and removes a finished run that nothing read after its end without
// writing its snapshot: SIDECAR_SNAPSHOTS takes no write (a snapshot
// saved there would cost a synced write that the removal then purges).
func TestNode_RetentionSavesNoSnapshot(t *testing.T) {
	ctx := context.Background()
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", RetentionPassword: "retention-pw", RetentionPermissions: retentionPermissions(), Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	cfg.Retention = Retention{Finished: time.Millisecond, Interval: 50 * time.Millisecond, Archive: "file://" + filepath.Join(t.TempDir(), "archive"), Conductor: true,
		NATSOptions: []nats.Option{nats.UserInfo(natsstore.RetentionUser, "retention-pw")}}
	n := New(cfg, zaptest.NewLogger(t), prometheus.NewRegistry())
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	const id = "node-archived"
	wf := cancelledRunOfWorkflow(t, n, id)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		recs, err := n.store.Fetch(ctx, id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the finished run was not removed within 2 minutes")
		}
	}
	if _, err := n.conductor.Workflow(ctx, wf, false); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("the removed run's workflow in Conductor: %v, want NOT_FOUND", err)
	}
	st, err := n.js.Stream(ctx, "KV_"+natsstore.DefaultSnapshotBucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if w := info.State.LastSeq; w != 0 {
		t.Fatalf("SIDECAR_SNAPSHOTS took %d writes while the run was archived and removed, want none", w)
	}
}
