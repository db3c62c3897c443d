package runlist_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// heldLog is the fixture's log whose tail shows nothing new while held:
// the events appended meanwhile become visible to the follower at once,
// in the order they were appended, as the events of one PostgreSQL batch
// do (one transaction). The records are the real store's.
type heldLog struct {
	*natsstore.Store
	mu   sync.Mutex
	held bool
}

// hold stops the tail at what it has shown: no read of the log is under
// way when it returns.
func (h *heldLog) hold(on bool) {
	h.mu.Lock()
	h.held = on
	h.mu.Unlock()
}

func (h *heldLog) Follow(ctx context.Context, afterSeq uint64) (statestore.LogTail, error) {
	t, err := h.Store.Follow(ctx, afterSeq)
	if err != nil {
		return nil, err
	}
	return &heldTail{LogTail: t, h: h, at: afterSeq}, nil
}

type heldTail struct {
	statestore.LogTail
	h  *heldLog
	at uint64
}

func (t *heldTail) Next(ctx context.Context, limit int) ([]statestore.RunEventRecord, uint64, error) {
	t.h.mu.Lock()
	defer t.h.mu.Unlock()
	if t.h.held {
		return nil, t.at, nil
	}
	// A read takes what the log holds, up to limit, as PostgreSQL's read
	// of a committed batch does. The JetStream tail takes what its
	// consumer has delivered so far, which on a loaded machine may be a
	// part of what the stream holds; that cuts the follower's reads short
	// by timing, not by what the log holds.
	var recs []statestore.RunEventRecord
	for len(recs) < limit {
		got, next, err := t.LogTail.Next(ctx, limit-len(recs))
		if err != nil {
			return recs, t.at, err
		}
		if next == t.at {
			break // nothing more in the log
		}
		recs, t.at = append(recs, got...), next
	}
	return recs, t.at, nil
}

// TestList_BulkPauseWritesOneRowPerRun: a bulk pause of n running runs
// appends each run's RunPaused and RunDrainCompleted in one batch, which
// PostgreSQL stores in rounds (every run's RunPaused, then every run's
// RunDrainCompleted) and shows at once. The follower reads it in several
// reads of Options.Batch records and writes each run's row once, with
// the run's latest state: the row bucket takes about n writes (the rows
// and the cursor), not one per event.
func TestList_BulkPauseWritesOneRowPerRun(t *testing.T) {
	const n, batch = 200, 64 // the batch's 2n events span 7 reads
	ctx := context.Background()
	f := newFixture(t)
	log := &heldLog{Store: f.store}
	l, err := runlist.Open(ctx, f.js, runlist.Options{Log: log, Poll: 20 * time.Millisecond, Batch: batch, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(ctx) })
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("bulk-%03d", i)
		f.start(ids[i], "etl", nil)
	}
	waitIndexed(t, l)
	bucket, err := f.js.Stream(ctx, l.Streams()[0])
	if err != nil {
		t.Fatal(err)
	}
	lastSeq := func() uint64 {
		t.Helper()
		info, err := bucket.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	before := lastSeq()

	log.hold(true)
	for _, id := range ids {
		f.event(id, "etl", statestore.RunPaused, "", 1, map[string]any{"reason": "maintenance", "requestedBy": "oncall"})
	}
	for _, id := range ids {
		f.event(id, "etl", statestore.RunDrainCompleted, "", 1, map[string]any{"waitedSeconds": 0})
	}
	log.hold(false)
	waitIndexed(t, l)

	got := lastSeq() - before
	t.Logf("the row bucket took %d writes for the bulk pause of %d runs", got, n)
	if got > n+n/10 {
		t.Errorf("the row bucket took %d writes for the bulk pause of %d runs, want at most %d (a row per run, its latest state, and the cursor)", got, n, n+n/10)
	}
	rows := allRows(t, l, runlist.Filter{}, 0)
	if len(rows) != n {
		t.Fatalf("%d rows, want %d", len(rows), n)
	}
	for _, r := range rows {
		if r.Status != statestore.RunStatusPaused || r.Substatus != "" {
			t.Errorf("run %s: row %s/%s, want PAUSED with its drain ended", r.RunID, r.Status, r.Substatus)
		}
	}
}
