package drain_test

import (
	"context"
	"errors"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// openKeys opens two Keys on one embedded JetStream: two replicas
// sharing the bucket.
func openKeys(t *testing.T) (a, b *drain.Keys) {
	t.Helper()
	js, _ := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{})
	ctx := context.Background()
	var err error
	if a, err = drain.OpenKeys(ctx, js, drain.KeysOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err = drain.OpenKeys(ctx, js, drain.KeysOptions{}); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// TestKeys_DrainIndex: the drain index on a real JetStream KV, shared by
// two replicas: a mark names its pause cycle, the end of an older cycle's
// drain leaves a later mark alone, and the listing holds only the marked
// runs.
func TestKeys_DrainIndex(t *testing.T) {
	ctx := context.Background()
	a, b := openKeys(t)
	list := func() []string {
		t.Helper()
		ids, err := b.DrainingRunIDs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(ids)
		return ids
	}
	if ids := list(); len(ids) != 0 {
		t.Fatalf("empty index lists %v", ids)
	}
	for _, m := range []struct {
		run   string
		cycle int64
	}{{"run-1", 1}, {"run-2", 3}, {"run-2", 4}} {
		if err := a.MarkDraining(ctx, m.run, m.cycle); err != nil {
			t.Fatal(err)
		}
	}
	if ids := list(); !slices.Equal(ids, []string{"run-1", "run-2"}) {
		t.Fatalf("index lists %v, want run-1 and run-2", ids)
	}
	// run-2's drain of cycle 3 ends on replica b while a already marked cycle 4.
	if err := b.EndDraining(ctx, "run-2", 3); err != nil {
		t.Fatal(err)
	}
	if ids := list(); !slices.Equal(ids, []string{"run-1", "run-2"}) {
		t.Fatalf("ending cycle 3 removed the mark of cycle 4: index lists %v", ids)
	}
	for _, e := range []struct {
		run   string
		cycle int64
	}{{"run-2", 4}, {"run-1", 1}, {"run-1", 1}, {"run-9", 1}} {
		if err := b.EndDraining(ctx, e.run, e.cycle); err != nil {
			t.Fatalf("end %s cycle %d: %v", e.run, e.cycle, err)
		}
	}
	if ids := list(); len(ids) != 0 {
		t.Fatalf("index lists %v after every drain ended", ids)
	}
}

// TestKeys_ResumeSchedule: the scheduled resumes on a real JetStream KV,
// shared by two replicas: an entry names its cycle and time, the end of an
// older cycle leaves a later entry alone, and the listing holds only the
// scheduled runs.
func TestKeys_ResumeSchedule(t *testing.T) {
	ctx := context.Background()
	a, b := openKeys(t)
	at := time.Date(2026, 11, 26, 6, 0, 0, 0, time.UTC)
	if err := a.ScheduleResume(ctx, drain.ScheduledResume{RunID: "run-1", Cycle: 1, At: at}); err != nil {
		t.Fatal(err)
	}
	if err := a.ScheduleResume(ctx, drain.ScheduledResume{RunID: "run-2", Cycle: 4, At: at.Add(time.Hour), RequestedBy: "bulk", Reason: "r"}); err != nil {
		t.Fatal(err)
	}
	got, err := b.ScheduledResumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(got, func(i, j int) bool { return got[i].RunID < got[j].RunID })
	if len(got) != 2 || got[0].RunID != "run-1" || got[0].Cycle != 1 || !got[0].At.Equal(at) || got[1].Cycle != 4 || got[1].RequestedBy != "bulk" || got[1].Reason != "r" {
		t.Fatalf("listed %+v", got)
	}
	if err := b.EndResume(ctx, "run-2", 3); err != nil { // an older cycle: stays
		t.Fatal(err)
	}
	if err := b.EndResume(ctx, "run-1", 1); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.ScheduledResumes(ctx); len(got) != 1 || got[0].RunID != "run-2" {
		t.Fatalf("after ending run-1 and an older cycle of run-2: %+v", got)
	}
}

// TestKeys_EngineLedger: a note of an older cycle changes nothing; a run
// never noted reads not paused, cycle 0.
func TestKeys_EngineLedger(t *testing.T) {
	ctx := context.Background()
	a, b := openKeys(t)
	if p, c, err := b.EngineState(ctx, "run-1"); err != nil || p || c != 0 {
		t.Fatalf("never noted: %v %d %v", p, c, err)
	}
	for _, n := range []struct {
		paused bool
		cycle  int64
	}{{true, 2}, {false, 2}, {true, 1}} {
		if err := a.NoteEngine(ctx, "run-1", n.paused, n.cycle); err != nil {
			t.Fatal(err)
		}
	}
	if p, c, err := b.EngineState(ctx, "run-1"); err != nil || p || c != 2 {
		t.Fatalf("ledger paused=%v cycle=%d %v, want resumed in cycle 2 (the note of cycle 1 is older)", p, c, err)
	}
}

// TestKeys_MovesTheRunIndexEntries: a sidecar restarted on a data
// directory of a version that kept the drain marks, the scheduled resumes
// and the engine ledger in the run index (SIDECAR_RUNS: drain.<runId>,
// resume.<runId>, each run entry's enginePaused and engineCycle) keeps its
// drains, its schedule and its ledger: OpenKeys moves them, once.
func TestKeys_MovesTheRunIndexEntries(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	js, _ := natstest.StartIn(t, dir, natsstore.EmbeddedConfig{})
	old, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "SIDECAR_RUNS", History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"drain.run-1":  "3",
		"resume.run-2": `{"cycle":2,"at":"2026-11-26T06:00:00Z","requestedBy":"bulk","reason":"r"}`,
		"run.run-3":    `{"runId":"run-3","state":"STARTED","workflowId":"wf-3","enginePaused":true,"engineCycle":2}`,
		"run.run-4":    `{"runId":"run-4","state":"FINAL","enginePaused":true,"engineCycle":5}`,
		"run.run-5":    `{"runId":"run-5","state":"STARTED","workflowId":"wf-5"}`,
		"active.run-3": "key",
	} {
		if _, err := old.Put(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := drain.OpenKeys(ctx, js, drain.KeysOptions{LegacyBucket: "SIDECAR_RUNS"})
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := keys.DrainingRunIDs(ctx); err != nil || !slices.Equal(ids, []string{"run-1"}) {
		t.Fatalf("drain index %v %v, want run-1", ids, err)
	}
	got, err := keys.ScheduledResumes(ctx)
	if err != nil || len(got) != 1 || got[0].RunID != "run-2" || got[0].Cycle != 2 || got[0].RequestedBy != "bulk" ||
		!got[0].At.Equal(time.Date(2026, 11, 26, 6, 0, 0, 0, time.UTC)) {
		t.Fatalf("schedule %+v %v, want run-2's staggered resume of cycle 2", got, err)
	}
	for _, want := range []struct {
		run    string
		paused bool
		cycle  int64
	}{{"run-3", true, 2}, {"run-4", false, 0}, {"run-5", false, 0}} {
		if p, c, err := keys.EngineState(ctx, want.run); err != nil || p != want.paused || c != want.cycle {
			t.Fatalf("ledger of %s: paused=%v cycle=%d %v, want %v %d", want.run, p, c, err, want.paused, want.cycle)
		}
	}
	// The moved keys left the run index; its own entries stay.
	for _, k := range []string{"drain.run-1", "resume.run-2"} {
		if _, err := old.Get(ctx, k); err == nil {
			t.Fatalf("%s is still in the run index", k)
		}
	}
	if _, err := old.Get(ctx, "active.run-3"); err != nil {
		t.Fatalf("the run index lost active.run-3: %v", err)
	}
	// Moved once: an entry the run index gets later (an older sidecar
	// still running) is not taken again, and what was moved stays.
	if _, err := old.Put(ctx, "drain.run-7", []byte("1")); err != nil {
		t.Fatal(err)
	}
	again, err := drain.OpenKeys(ctx, js, drain.KeysOptions{LegacyBucket: "SIDECAR_RUNS"})
	if err != nil {
		t.Fatal(err)
	}
	if ids, _ := again.DrainingRunIDs(ctx); !slices.Equal(ids, []string{"run-1"}) {
		t.Fatalf("drain index after a second open %v, want run-1 alone", ids)
	}
	// No run index at all (a new data directory): nothing to move.
	js2, _ := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{})
	if _, err := drain.OpenKeys(ctx, js2, drain.KeysOptions{LegacyBucket: "SIDECAR_RUNS"}); err != nil {
		t.Fatalf("open without a run index: %v", err)
	}
}

// TestKeys_DownIsStoreUnavailable: with NATS down, every pause key
// operation answers STORE_UNAVAILABLE (kind Unavailable: 503, safe to
// retry), the code the API documents for a bulk action, e.g. the
// staggered resume whose schedule cannot be written.
func TestKeys_DownIsStoreUnavailable(t *testing.T) {
	js, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{})
	k, err := drain.OpenKeys(context.Background(), js, drain.KeysOptions{ListTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ops := map[string]func() error{
		"MarkDraining":   func() error { return k.MarkDraining(ctx, "r", 1) },
		"EndDraining":    func() error { return k.EndDraining(ctx, "r", 1) },
		"DrainingRunIDs": func() error { _, err := k.DrainingRunIDs(ctx); return err },
		"ScheduleResume": func() error {
			return k.ScheduleResume(ctx, drain.ScheduledResume{RunID: "r", Cycle: 1, At: time.Now(), RequestedBy: statestore.RequestedByBulk})
		},
		"EndResume":        func() error { return k.EndResume(ctx, "r", 1) },
		"ScheduledResumes": func() error { _, err := k.ScheduledResumes(ctx); return err },
		"NoteEngine":       func() error { return k.NoteEngine(ctx, "r", true, 1) },
		"EngineState":      func() error { _, _, err := k.EngineState(ctx, "r"); return err },
	}
	for name, op := range ops {
		err := op()
		if !errors.Is(err, statestore.ErrUnavailable) || !errors.Is(err, errcode.Unavailable) {
			t.Errorf("%s with NATS down: %v (code %q); want STORE_UNAVAILABLE, kind Unavailable", name, err, errcode.CodeOf(err))
		}
	}
}
