package registry_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// fakeAppender is an Appender whose behaviour each test sets. It records the
// eventIds it was sent.
type fakeAppender struct {
	AppendFunc func(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error)

	mu   sync.Mutex
	sent []string
}

func (f *fakeAppender) Append(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	f.mu.Lock()
	f.sent = append(f.sent, w.EventID)
	f.mu.Unlock()
	return f.AppendFunc(ctx, w)
}

// AppendIf is not used by these tests: the conditional append is covered
// on the real stores by storetest's AppendIf cases.
func (f *fakeAppender) AppendIf(ctx context.Context, w *statestore.RunEventWrite, _ int64) (statestore.AppendResult, error) {
	return f.Append(ctx, w)
}

func (f *fakeAppender) Sent() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.sent...)
}

// echo accepts every event with the eventId it was sent.
func echo(_ context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	return statestore.AppendResult{EventID: w.EventID, RunSeq: 1, PersistedAt: "2025-01-01T00:00:00Z", Persisted: true}, nil
}

// event returns a valid event without an eventId.
func event(runID string) *statestore.RunEventWrite {
	w := storetest.Event(runID, statestore.RunStarted, "")
	w.EventID = ""
	return w
}

func TestEmitter_Emit(t *testing.T) {
	r, _, _, _ := newTestRegistry(t)

	t.Run("RetriesReuseEventID", func(t *testing.T) {
		app := &fakeAppender{AppendFunc: echo}
		e := registry.NewEmitter(r, app)
		w := event("run-1")
		res, err := e.Emit(ctx(t), w)
		if err != nil {
			t.Fatal(err)
		}
		stored, _ := r.Lookup(ctx(t), w.RunID, w.IdempotencyKey)
		if res.EventID != stored || w.EventID != stored || !isUUIDv4(stored) {
			t.Fatalf("got result %q, w.EventID %q, registry %q; want all equal UUID v4", res.EventID, w.EventID, stored)
		}
		// A retry builds the event afresh (no eventId) and must send the same one.
		if _, err := e.Emit(ctx(t), event("run-1")); err != nil {
			t.Fatal(err)
		}
		if sent := app.Sent(); len(sent) != 2 || sent[0] != stored || sent[1] != stored {
			t.Fatalf("sent %v want [%s %s]", sent, stored, stored)
		}
	})
	t.Run("RegistryWrittenBeforeAppend", func(t *testing.T) {
		// Run Events Contract v2.0.1 §2.5.1: the new eventId is in the
		// registry before the append is attempted, so a crash during the
		// append loses nothing.
		var atAppend string
		var lookupErr error
		app := &fakeAppender{AppendFunc: func(c context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
			atAppend, lookupErr = r.Lookup(c, w.RunID, w.IdempotencyKey)
			return echo(c, w)
		}}
		w := event("run-before")
		if _, err := registry.NewEmitter(r, app).Emit(ctx(t), w); err != nil {
			t.Fatal(err)
		}
		if lookupErr != nil || atAppend != w.EventID {
			t.Fatalf("at append time the registry held %q (%v), want the sent eventId %q", atAppend, lookupErr, w.EventID)
		}
	})
	t.Run("AdoptsReturnedEventID", func(t *testing.T) {
		authoritative := uuid.NewString()
		app := &fakeAppender{AppendFunc: func(_ context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
			return statestore.AppendResult{EventID: authoritative, RunSeq: 7, PersistedAt: "2025-01-01T00:00:00Z", Idempotent: true}, nil
		}}
		e := registry.NewEmitter(r, app)
		w := event("run-2")
		res, err := e.Emit(ctx(t), w)
		if err != nil {
			t.Fatal(err)
		}
		if res.EventID != authoritative || res.RunSeq != 7 || !res.Idempotent {
			t.Fatalf("result %+v, want the store's metadata", res)
		}
		if w.EventID != authoritative {
			t.Fatalf("w.EventID = %q want %q", w.EventID, authoritative)
		}
		if got, err := r.Lookup(ctx(t), w.RunID, w.IdempotencyKey); err != nil || got != authoritative {
			t.Fatalf("registry holds %q, %v want %q", got, err, authoritative)
		}
		if _, err := e.Emit(ctx(t), event("run-2")); err != nil {
			t.Fatal(err)
		}
		if sent := app.Sent(); len(sent) != 2 || sent[0] == authoritative || sent[1] != authoritative {
			t.Fatalf("sent %v: want a fresh eventId, then %s", sent, authoritative)
		}
	})
	t.Run("AppendErrorKeepsEventID", func(t *testing.T) {
		fail := true
		app := &fakeAppender{AppendFunc: func(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
			if fail {
				return statestore.AppendResult{}, &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "down"}
			}
			return echo(ctx, w)
		}}
		e := registry.NewEmitter(r, app)
		if _, err := e.Emit(ctx(t), event("run-3")); !errors.Is(err, statestore.ErrUnavailable) {
			t.Fatalf("got %v want statestore.ErrUnavailable", err)
		}
		fail = false
		if _, err := e.Emit(ctx(t), event("run-3")); err != nil {
			t.Fatal(err)
		}
		if sent := app.Sent(); len(sent) != 2 || sent[0] != sent[1] {
			t.Fatalf("sent %v: want the same eventId twice", sent)
		}
	})
	t.Run("InvalidEventTouchesNothing", func(t *testing.T) {
		app := &fakeAppender{AppendFunc: echo}
		e := registry.NewEmitter(r, app)
		w := event("run-4")
		w.LogicalAttemptID = 2 // the idempotencyKey no longer matches
		if _, err := e.Emit(ctx(t), w); !errors.Is(err, statestore.ErrSchemaValidation) {
			t.Fatalf("got %v want statestore.ErrSchemaValidation", err)
		}
		if _, err := e.Emit(ctx(t), nil); !errors.Is(err, registry.ErrInvalidInput) {
			t.Fatalf("nil event: got %v want ErrInvalidInput", err)
		}
		if n := len(app.Sent()); n != 0 {
			t.Fatalf("appender called %d times, want 0", n)
		}
		if _, err := r.Lookup(ctx(t), w.RunID, w.IdempotencyKey); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("registry: got %v want ErrNotFound", err)
		}
	})
	t.Run("AdoptErrorReturnsResult", func(t *testing.T) {
		app := &fakeAppender{AppendFunc: func(context.Context, *statestore.RunEventWrite) (statestore.AppendResult, error) {
			return statestore.AppendResult{EventID: "not-a-uuid", RunSeq: 3}, nil
		}}
		res, err := registry.NewEmitter(r, app).Emit(ctx(t), event("run-5"))
		if !errors.Is(err, registry.ErrInvalidInput) || res.RunSeq != 3 {
			t.Fatalf("got %+v, %v want the result and ErrInvalidInput", res, err)
		}
	})
}

// TestEmitter_Emit_MemStore runs racing producers, each with its own
// connection and Registry, against one real append authority (memstore), and
// then a producer whose registry entry was lost.
func TestEmitter_Emit_MemStore(t *testing.T) {
	s := startServer(t, t.TempDir())
	store := memstore.New(statestore.ProjectorOptions{Logger: zaptest.NewLogger(t)})
	emitterProtocol(t, store, func(t *testing.T) *registry.Registry {
		_, js := connect(t, s)
		return open(t, js, registry.Options{})
	})
	t.Run("EmitBatch", func(t *testing.T) {
		_, js := connect(t, s)
		emitBatchProtocol(t, memstore.New(statestore.ProjectorOptions{Logger: zaptest.NewLogger(t)}), open(t, js, registry.Options{}))
	})
}

// emitterProtocol is §2.5.1 against one append authority: eight producers,
// each with the Registry newRegistry gives, emit one event at once (one
// persists it, all return its eventId and runSeq 1); then a producer
// whose registry never saw an event the store holds adopts the store's
// eventId.
func emitterProtocol(t *testing.T, store statestore.Store, newRegistry func(t *testing.T) *registry.Registry) {
	t.Run("RacingProducers", func(t *testing.T) {
		const n = 8
		results := make([]statestore.AppendResult, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for p := range n {
			e := registry.NewEmitter(newRegistry(t), store)
			wg.Go(func() {
				<-start
				res, err := e.Emit(ctx(t), event("run.race"))
				if err != nil {
					t.Errorf("producer %d: %v", p, err)
				}
				results[p] = res
			})
		}
		close(start)
		wg.Wait()
		persisted := 0
		for p, res := range results {
			if res.EventID != results[0].EventID || res.RunSeq != 1 {
				t.Fatalf("producer %d: %+v, producer 0: %+v", p, res, results[0])
			}
			if res.Persisted {
				persisted++
			}
		}
		if persisted != 1 {
			t.Fatalf("%d producers persisted, want 1", persisted)
		}
	})
	t.Run("LostRegistryEntry", func(t *testing.T) {
		// The event was appended earlier with an eventId the registry never saw.
		w := storetest.Event("run.lost", statestore.RunStarted, "")
		if _, err := store.Append(ctx(t), w); err != nil {
			t.Fatal(err)
		}
		r := newRegistry(t)
		res, err := registry.NewEmitter(r, store).Emit(ctx(t), event("run.lost"))
		if err != nil || res.EventID != w.EventID || !res.Idempotent {
			t.Fatalf("got %+v, %v want the original eventId %s, idempotent", res, err, w.EventID)
		}
		if got, _ := r.Lookup(ctx(t), w.RunID, w.IdempotencyKey); got != w.EventID {
			t.Fatalf("registry holds %q want %q", got, w.EventID)
		}
	})
}

// emitBatchProtocol is EmitBatch against one append authority: a run's
// events get registry-stable eventIds and are appended on its LastSeq; a
// run that moved on is refused and keeps its registered eventIds for the
// single path; a retry of the batch answers with the same eventIds; an
// invalid run registers nothing.
func emitBatchProtocol(t *testing.T, store statestore.Store, r *registry.Registry) {
	rec := &sentIDs{Store: store}
	e := registry.NewEmitter(r, rec)
	pair := func(runID string) []*statestore.RunEventWrite {
		a, b := storetest.Event(runID, statestore.RunPaused, ""), storetest.Event(runID, statestore.RunDrainCompleted, "")
		a.EventID, b.EventID = "", ""
		return []*statestore.RunEventWrite{a, b}
	}
	last := map[string]int64{}
	for _, run := range []string{"batch-ok", "batch-moved"} {
		res, err := e.Emit(ctx(t), event(run))
		if err != nil {
			t.Fatal(err)
		}
		last[run] = res.RunSeq
	}
	if _, err := e.Emit(ctx(t), storetest.Event("batch-moved", statestore.StepStarted, "s1")); err != nil {
		t.Fatal(err)
	}
	ok, moved := pair("batch-ok"), pair("batch-moved")
	bad := pair("batch-bad")
	bad[1].EmittedAt = "yesterday"
	out := e.EmitBatch(ctx(t), []statestore.RunBatch{{LastSeq: last["batch-ok"], Events: ok}, {LastSeq: last["batch-moved"], Events: moved}, {Events: bad}})
	if out[0].Err != nil || len(out[0].Results) != 2 {
		t.Fatalf("batch-ok: got %+v, want 2 appended", out[0])
	}
	for k, w := range ok {
		id, err := r.Lookup(ctx(t), w.RunID, w.IdempotencyKey)
		if err != nil || id != w.EventID || out[0].Results[k].EventID != id {
			t.Fatalf("batch-ok event %d: registry %q (%v), event %q, result %q: want one eventId", k, id, err, w.EventID, out[0].Results[k].EventID)
		}
	}
	if !errors.Is(out[1].Err, statestore.ErrRunChanged) || len(out[1].Results) != 0 {
		t.Fatalf("batch-moved: got %+v, want RUN_CHANGED", out[1])
	}
	if recs, _ := store.Fetch(ctx(t), "batch-moved", 0, 0); len(recs) != 2 {
		t.Fatalf("batch-moved: %d records, want 2 (nothing of the batch)", len(recs))
	}
	if !errors.Is(out[2].Err, statestore.ErrSchemaValidation) {
		t.Fatalf("batch-bad: got %v, want SCHEMA_VALIDATION_FAILED", out[2].Err)
	}
	if _, err := r.Lookup(ctx(t), "batch-bad", bad[0].IdempotencyKey); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("batch-bad: registry lookup %v, want nothing registered", err)
	}
	// The refused run's single path sends the eventId the batch registered.
	id := moved[0].EventID
	res, err := e.EmitIf(ctx(t), moved[0], last["batch-moved"]+1)
	if err != nil || res.EventID != id {
		t.Fatalf("batch-moved again: %+v %v, want eventId %s", res, err, id)
	}
	// A retry of the batch: the same eventIds, nothing written.
	again := pair("batch-ok")
	out = e.EmitBatch(ctx(t), []statestore.RunBatch{{LastSeq: last["batch-ok"], Events: again}})
	if out[0].Err != nil || len(out[0].Results) != 2 || !out[0].Results[0].Idempotent || out[0].Results[0].EventID != ok[0].EventID || out[0].Results[1].EventID != ok[1].EventID {
		t.Fatalf("retried batch: got %+v, want the first batch's eventIds, idempotent", out[0])
	}
	if sent := rec.sent[len(rec.sent)-2:]; sent[0] != ok[0].EventID || sent[1] != ok[1].EventID {
		t.Fatalf("retried batch sent eventIds %v, want the registered %s, %s", sent, ok[0].EventID, ok[1].EventID)
	}
}

// sentIDs is a store that remembers the eventIds AppendBatch was sent.
type sentIDs struct {
	statestore.Store
	sent []string
}

func (s *sentIDs) AppendBatch(ctx context.Context, runs []statestore.RunBatch) []statestore.BatchResult {
	for _, b := range runs {
		for _, w := range b.Events {
			s.sent = append(s.sent, w.EventID)
		}
	}
	return s.Store.(statestore.BatchAppender).AppendBatch(ctx, runs)
}

func (s *sentIDs) AtomicRuns() bool { return s.Store.(statestore.BatchAppender).AtomicRuns() }
