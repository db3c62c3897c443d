package node

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestNode_RepliesBound: Config.RepliesMaxBytes (serve
// --control-replies-max-mib) is the bound the node creates the kept
// answers' bucket with, and its gauge reports it.
func TestNode_RepliesBound(t *testing.T) {
	admin, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Listen: "127.0.0.1:0", Password: "node-replies-pw", Permissions: natsstore.AllPermissions})
	cfg := testConfig(t, srv.URL())
	const bound = 32 << 20
	cfg.RepliesMaxBytes = bound
	reg := prometheus.NewRegistry()
	n := New(cfg, zaptest.NewLogger(t), reg)
	ctx := context.Background()
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(ctx) })
	st, err := admin.Stream(ctx, "KV_"+httpapi.KVRepliesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.MaxBytes; got != bound {
		t.Fatalf("the replies' bucket was created with max bytes %d, want RepliesMaxBytes %d", got, bound)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "sidecar_control_replies_max_bytes" {
			if got := f.GetMetric()[0].GetGauge().GetValue(); got != bound {
				t.Fatalf("sidecar_control_replies_max_bytes %v, want %d", got, bound)
			}
			return
		}
	}
	t.Fatal("no sidecar_control_replies_max_bytes on the node's registry")
}
