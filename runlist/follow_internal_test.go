package runlist

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestWriteRow_NeverGoesBack: a follower that is behind (two replicas
// following at once) never replaces a newer row with its older one,
// whether it knew the row's revision or not.
func TestWriteRow_NeverGoesBack(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.Start(t)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ROWS", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	f := &follower{kv: kv, opts: Options{Timeout: 5 * time.Second}, log: zap.NewNop()}
	snap := func(seq int64, status string) *tracked {
		return &tracked{snap: &statestore.RunSnapshot{RunID: "r", Status: status, LastEventSeq: seq}}
	}
	ahead := snap(10, statestore.RunStatusPaused)
	if err := f.writeRow(ctx, ahead); err != nil {
		t.Fatal(err)
	}
	behind := snap(5, statestore.RunStatusRunning) // a follower that never wrote it
	if err := f.writeRow(ctx, behind); err != nil {
		t.Fatal(err)
	}
	stale := snap(7, statestore.RunStatusRunning)
	stale.rowRev = 1 // a revision it wrote once, since replaced
	if _, err := kv.Put(ctx, keyRun+natsstore.RunToken("r"), mustRow(t, 10)); err != nil {
		t.Fatal(err)
	}
	if err := f.writeRow(ctx, stale); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, keyRun+natsstore.RunToken("r"))
	if err != nil {
		t.Fatal(err)
	}
	var r Row
	_ = json.Unmarshal(e.Value(), &r)
	if r.LastEventSeq != 10 || r.Status != statestore.RunStatusPaused {
		t.Fatalf("row went back to %d %s, want 10 PAUSED", r.LastEventSeq, r.Status)
	}
	newer := snap(12, statestore.RunStatusRunning)
	if err := f.writeRow(ctx, newer); err != nil {
		t.Fatal(err)
	}
	e, _ = kv.Get(ctx, keyRun+natsstore.RunToken("r"))
	_ = json.Unmarshal(e.Value(), &r)
	if r.LastEventSeq != 12 {
		t.Fatalf("a newer row was not written: %d", r.LastEventSeq)
	}
}

func mustRow(t *testing.T, seq int64) []byte {
	b, err := json.Marshal(Row{RunID: "r", Status: statestore.RunStatusPaused, LastEventSeq: seq})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRowOf_Drained: a paused run's row counts the steps that were in
// flight at the pause and ended since, not those that ended before it or
// still run.
func TestRowOf_Drained(t *testing.T) {
	s := &statestore.RunSnapshot{RunID: "r", Status: statestore.RunStatusPaused, Substatus: statestore.SubstatusDraining,
		Pause: &statestore.PauseState{PausedAt: "2026-01-01T10:00:00Z", DrainTimeoutSeconds: 60},
		Steps: []statestore.StepSnapshot{
			{StepID: "before", Status: statestore.StepStatusSuccess, StartedAt: "2026-01-01T09:00:00Z", CompletedAt: "2026-01-01T09:59:59Z"},
			{StepID: "drained", Status: statestore.StepStatusSuccess, StartedAt: "2026-01-01T09:59:00Z", CompletedAt: "2026-01-01T10:00:05.5Z"},
			{StepID: "failed", Status: statestore.StepStatusFailed, StartedAt: "2026-01-01T09:59:00Z", CompletedAt: "2026-01-01T10:00:06Z"},
			{StepID: "running", Status: statestore.StepStatusRunning, StartedAt: "2026-01-01T09:59:30Z"},
		}}
	r := rowOf(s, "", "")
	if r.Drained != 2 || r.InFlight != 1 || r.DrainTimeoutSeconds != 60 {
		t.Fatalf("row drained %d in flight %d timeout %d, want 2, 1, 60", r.Drained, r.InFlight, r.DrainTimeoutSeconds)
	}
}

// TestWriteRow_ForgottenStaysForgotten: a follower that read a run's
// records before retention forgot its row and removed them (a batch in
// flight, a row it wrote before) does not write the row back; a run it
// meets mid-log whose records are gone and whose row was forgotten is
// passed over, not an error that stops the follower.
func TestWriteRow_ForgottenStaysForgotten(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.Start(t)
	store, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	l, err := Open(ctx, js, Options{Log: store, Owner: never{}, Timeout: 5 * time.Second, MarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(ctx) })
	f := &follower{kv: l.kv, opts: l.opts, log: zap.NewNop(), m: nil, tracked: map[string]*tracked{}, durs: map[string]*StepDurations{}, dirty: map[string]bool{}, mirror: l.mirror}
	snap := func(id string, seq int64) *tracked {
		return &tracked{snap: &statestore.RunSnapshot{RunID: id, Status: statestore.RunStatusCompleted, LastEventSeq: seq}}
	}
	requireNoRow := func(id string) {
		t.Helper()
		if _, err := l.kv.Get(ctx, keyRun+natsstore.RunToken(id)); !errors.Is(err, jetstream.ErrKeyDeleted) && !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("the row of forgotten run %s is back (Get: %v)", id, err)
		}
	}

	// Read in a batch, never written, forgotten: not written back.
	inFlight := snap("in-flight", 4)
	if err := l.ForgetRun(ctx, "in-flight"); err != nil {
		t.Fatal(err)
	}
	if err := f.writeRow(ctx, inFlight); err != nil {
		t.Fatal(err)
	}
	requireNoRow("in-flight")

	// Written, then forgotten, then written again from the same batch.
	written := snap("written", 3)
	if err := f.writeRow(ctx, written); err != nil {
		t.Fatal(err)
	}
	if err := l.ForgetRun(ctx, "written"); err != nil {
		t.Fatal(err)
	}
	written.snap.LastEventSeq = 4
	if err := f.writeRow(ctx, written); err != nil {
		t.Fatal(err)
	}
	requireNoRow("written")

	// Met mid-log (not fresh), its records gone, its row forgotten: the
	// follower goes on with the other runs of the batch.
	if err := l.ForgetRun(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	gone := statestore.RunEventRecord{RunEventWrite: statestore.RunEventWrite{RunID: "gone", EventType: statestore.StepStarted}, RunSeq: 2}
	dirty, err := f.fold(ctx, []statestore.RunEventRecord{gone})
	if err != nil {
		t.Fatalf("fold of a removed run's record: %v", err)
	}
	if len(dirty) != 0 {
		t.Fatalf("fold of a removed run's record: %d rows to write, want none", len(dirty))
	}
}

// never is an Owner that owns nothing: the list's own follower stays idle.
type never struct{}

func (never) Owns(string) bool { return false }
