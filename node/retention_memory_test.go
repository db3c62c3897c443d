package node

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestNode_RetentionForgetsTheProjection: a run that left hot state leaves
// the projector's memory too, so serve's memory follows the window, not
// the last 10,000 runs it ever read (the soak's RSS grew with history).
func TestNode_RetentionForgetsTheProjection(t *testing.T) {
	ctx := context.Background()
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-pw", RetentionPassword: "retention-pw", RetentionPermissions: retentionPermissions(), Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	cfg.Retention = Retention{Finished: time.Millisecond, Interval: 50 * time.Millisecond, Archive: "file://" + t.TempDir(),
		NATSOptions: []nats.Option{nats.UserInfo(natsstore.RetentionUser, "retention-pw")}}
	reg := prometheus.NewRegistry()
	n := New(cfg, zaptest.NewLogger(t), reg)
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	const id = "projected-then-removed"
	if _, err := n.store.Append(ctx, storetest.Event(id, statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := n.store.ProjectSnapshot(ctx, id); err != nil { // read while it runs
		t.Fatal(err)
	}
	if _, err := n.store.Append(ctx, storetest.Event(id, statestore.RunCompleted, "")); err != nil {
		t.Fatal(err)
	}
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
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sidecar_projector_cached_runs" {
			if got := mf.GetMetric()[0].GetGauge().GetValue(); got != 0 {
				t.Fatalf("sidecar_projector_cached_runs = %v after the only run left hot state, want 0", got)
			}
			return
		}
	}
	t.Fatal("no sidecar_projector_cached_runs")
}
