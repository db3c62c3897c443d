package retention_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestRetention_ArchivingSavesNoSnapshot: retention's read of the runs
// it archives saves no snapshot. Up to the moment a run leaves (its
// Forgetters run after retention read it and before its records are
// removed), a finished run whose snapshot was never saved has none, and
// one that an ordinary read saved keeps its revision, also when that
// read was before the run's end; on JetStream the
// snapshot bucket takes no write at all during the pass. Ordinary reads
// still save as before: a finished run's snapshot at once, a live run's
// on its first (cold) read once it is SaveEvery records long.
func TestRetention_ArchivingSavesNoSnapshot(t *testing.T) {
	eachBackend(t, testArchivingSavesNoSnapshot)
}

func testArchivingSavesNoSnapshot(t *testing.T, b *backend) {
	ctx := context.Background()
	h := newHotOn(t, b, 4, 1, nil)
	appendAll := func(events ...*statestore.RunEventWrite) {
		t.Helper()
		for _, w := range events {
			w.TenantID = "tenant_acme"
			if _, err := h.store.Append(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Runs of 41 records: more than the projector's SaveEvery (32). The
	// live one stays live; the other ends after its snapshot was saved,
	// so the saved one is behind its end.
	const live, behind = "live-long", "saved-behind"
	for _, id := range []string{live, behind} {
		appendAll(storetest.Event(id, statestore.RunStarted, ""))
		for i := range 20 {
			step := fmt.Sprintf("s%d", i)
			appendAll(storetest.Event(id, statestore.StepStarted, step), storetest.Event(id, statestore.StepCompleted, step))
		}
	}
	snapshots := func() map[string]string {
		t.Helper()
		s, err := b.snapshots(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := snapshots(); len(s) != 0 {
		t.Fatalf("snapshots saved before any read: %v", s)
	}

	// Ordinary reads, as the API, the watcher and the workers make them.
	for _, id := range []string{"run-0", live, behind} {
		if _, err := h.store.ProjectSnapshot(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	read := snapshots()
	if _, ok := read["run-0"]; !ok {
		t.Fatalf("an ordinary read of finished run run-0 saved no snapshot: %v", read)
	}
	for _, id := range []string{live, behind} {
		if _, ok := read[id]; !ok {
			t.Fatalf("an ordinary cold read of live run %s (41 records) saved no snapshot: %v", id, read)
		}
	}
	appendAll(storetest.Event(behind, statestore.RunCompleted, ""))
	recs, err := h.store.Fetch(ctx, behind, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	h.finished[behind] = recs

	// What the log keeps saved when each run is forgotten: after
	// retention's read, before the run's records leave.
	var mu sync.Mutex
	atForget := map[string]map[string]string{}
	probe := forgetFunc(func(ctx context.Context, runID string) error {
		s, err := b.snapshots(ctx, h)
		if err != nil {
			return err
		}
		mu.Lock()
		atForget[runID] = s
		mu.Unlock()
		return nil
	})
	writes := snapshotWrites(t, h)
	r := h.retention(h.archive(nil), h.remover(), retention.Options{BatchRuns: 2, Forgetters: []retention.Forgetter{probe}})
	res, err := r.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Archived != 5 || res.Removed != 5 {
		t.Fatalf("pass: %+v, want the 5 finished runs archived and removed", res)
	}
	for id := range h.finished {
		s, ok := atForget[id]
		if !ok {
			t.Fatalf("run %s was never forgotten", id)
		}
		got, saved := s[id]
		want, before := read[id]
		switch {
		case saved && !before:
			t.Fatalf("run %s has a snapshot (revision %s) when it leaves; it had none before retention read it", id, got)
		case got != want:
			t.Fatalf("run %s's snapshot is at revision %s when it leaves, want %s: retention's read saved it again", id, got, want)
		}
	}
	if n := snapshotWrites(t, h); n != writes {
		t.Fatalf("the snapshot bucket took %d writes during the pass, want none", n-writes)
	}
	after := snapshots()
	for id := range h.finished {
		if _, ok := after[id]; ok {
			t.Fatalf("run %s's snapshot stayed after the run left: %v", id, after)
		}
	}
	if after[live] != read[live] {
		t.Fatalf("live run %s's snapshot: revision %q after the pass, want %q (untouched)", live, after[live], read[live])
	}
	h.requireSafe(true)
}

// snapshotWrites is how many writes the JetStream snapshot bucket ever
// took (its stream's last sequence: a purge does not move it); 0 on
// PostgreSQL, whose rows' revisions say it instead.
func snapshotWrites(t *testing.T, h *hot) uint64 {
	t.Helper()
	if h.js == nil {
		return 0
	}
	st, err := h.js.Stream(context.Background(), "KV_"+natsstore.DefaultSnapshotBucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}
