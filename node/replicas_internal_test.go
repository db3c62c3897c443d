package node

import (
	"strings"
	"testing"
)

// TestReplicaMismatch: streams with more copies than this replica's
// --nats-replicas are fixed by its flag (never by lowering the streams,
// which would keep fewer copies of the log); streams with fewer by the
// admin's stream edit; one warning for each kind, naming every stream.
func TestReplicaMismatch(t *testing.T) {
	have := []streamReplicas{{"SIDECAR_EVENTS", 3}, {"KV_SIDECAR_RUNS", 3}, {"KV_SIDECAR_ALERTS", 1}, {"OBJ_SIDECAR_ARTIFACTS", 2}}
	w := replicaMismatch(have, 2)
	if len(w) != 2 {
		t.Fatalf("%d warnings, want 2 (more copies, fewer copies): %+v", len(w), w)
	}
	if w[0].fix != "--nats-replicas 3" || strings.Join(w[0].streams, ",") != "SIDECAR_EVENTS=3,KV_SIDECAR_RUNS=3" || strings.Contains(w[0].fix, "stream edit") {
		t.Errorf("more copies: %+v, want the flag raised to 3, not the streams lowered", w[0])
	}
	if w[1].fix != "nats stream edit KV_SIDECAR_ALERTS --replicas 2" || strings.Join(w[1].streams, ",") != "KV_SIDECAR_ALERTS" {
		t.Errorf("fewer copies: %+v, want the stream raised to 2", w[1])
	}
	if got := replicaMismatch(have[:2], 3); len(got) != 0 {
		t.Errorf("streams as asked: %+v, want no warning", got)
	}
}
