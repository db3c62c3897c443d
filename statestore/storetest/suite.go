package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// RunSuite runs the conformance suite against the stores newStore returns.
// Each subtest gets a fresh store; newStore registers its own cleanup.
func RunSuite(t *testing.T, newStore func(t *testing.T) statestore.Store) {
	ctx := context.Background()
	run := func(name string, f func(t *testing.T, s statestore.Store)) {
		t.Run(name, func(t *testing.T) { f(t, newStore(t)) })
	}
	runBatchSuite(t, run)

	run("Append/OK", func(t *testing.T, s statestore.Store) {
		w := Event("run-1", statestore.RunStarted, "")
		before := time.Now().Add(-time.Second)
		res := mustAppend(t, s, w)
		after := time.Now().Add(time.Second)
		if !res.Persisted || res.Idempotent {
			t.Fatalf("got persisted=%v idempotent=%v, want true/false", res.Persisted, res.Idempotent)
		}
		if res.EventID != w.EventID {
			t.Fatalf("eventId: got %s want %s", res.EventID, w.EventID)
		}
		if res.RunSeq <= 0 {
			t.Fatalf("runSeq: got %d, want > 0", res.RunSeq)
		}
		at := mustUTC(t, res.PersistedAt)
		if at.Before(before) || at.After(after) {
			t.Fatalf("persistedAt %s is not the store's clock (now %s)", res.PersistedAt, time.Now().UTC())
		}
	})

	run("Append/PersistedAtIsStoreClock", func(t *testing.T, s statestore.Store) {
		w := Event("run-clock", statestore.RunStarted, "")
		w.EmittedAt = "2001-02-03T04:05:06.789+00:00"
		res := mustAppend(t, s, w)
		if at := mustUTC(t, res.PersistedAt); time.Since(at) > time.Minute {
			t.Fatalf("persistedAt %s taken from the producer", res.PersistedAt)
		}
		recs := mustFetch(t, s, "run-clock", 0, 0)
		if recs[0].EmittedAt != w.EmittedAt {
			t.Fatalf("emittedAt: got %q, want the producer's %q verbatim", recs[0].EmittedAt, w.EmittedAt)
		}
		if recs[0].PersistedAt != res.PersistedAt || recs[0].RunSeq != res.RunSeq {
			t.Fatalf("record metadata %d/%s differs from append result %d/%s", recs[0].RunSeq, recs[0].PersistedAt, res.RunSeq, res.PersistedAt)
		}
	})

	run("Append/RunSeqStrictlyIncreasing", func(t *testing.T, s statestore.Store) {
		var last int64
		for i := 0; i < 50; i++ {
			res := mustAppend(t, s, Event("run-seq", statestore.StepStarted, fmt.Sprintf("step-%02d", i)))
			if res.RunSeq <= last {
				t.Fatalf("append %d: runSeq %d after %d", i, res.RunSeq, last)
			}
			last = res.RunSeq
			// Another run in between must not break this run's order.
			mustAppend(t, s, Event(fmt.Sprintf("other-%d", i), statestore.RunStarted, ""))
		}
	})

	run("Append/DuplicateReturnsExisting", func(t *testing.T, s statestore.Store) {
		first := WithPayload(Event("run-dup", statestore.RunPaused, ""), map[string]any{"reason": "first"})
		res1 := mustAppend(t, s, first)
		time.Sleep(2 * time.Millisecond)
		retry := *first
		retry.EventID = uuid.NewString() // a producer that lost its registry entry
		retry.EmittedAt = time.Now().UTC().Format(time.RFC3339Nano)
		retry.EngineAttemptID = 3
		WithPayload(&retry, map[string]any{"reason": "second"})
		res2 := mustAppend(t, s, &retry)
		want := statestore.AppendResult{EventID: res1.EventID, RunSeq: res1.RunSeq, PersistedAt: res1.PersistedAt, Idempotent: true, Persisted: false}
		if res2 != want {
			t.Fatalf("duplicate append: got %+v, want %+v", res2, want)
		}
		recs := mustFetch(t, s, "run-dup", 0, 0)
		if len(recs) != 1 {
			t.Fatalf("got %d records, want 1", len(recs))
		}
		if !bytes.Contains(recs[0].Payload, []byte("first")) || recs[0].EventID != first.EventID {
			t.Fatalf("stored record changed by the duplicate: %+v", recs[0])
		}
	})

	run("AppendIf/Fence", func(t *testing.T, s statestore.Store) {
		// A conditional append persists only on the run's last runSeq; a
		// stale one writes nothing and says RUN_CHANGED.
		started := Event("run-fence", statestore.RunStarted, "")
		if _, err := s.AppendIf(ctx, started, 7); !errors.Is(err, statestore.ErrRunChanged) {
			t.Fatalf("AppendIf on a run without events, lastSeq 7: got %v, want RUN_CHANGED", err)
		}
		if recs := mustFetch(t, s, "run-fence", 0, 0); len(recs) != 0 {
			t.Fatalf("a refused conditional append wrote %d records", len(recs))
		}
		first, err := s.AppendIf(ctx, started, 0)
		if err != nil || !first.Persisted {
			t.Fatalf("AppendIf on an empty run, lastSeq 0: %+v %v", first, err)
		}
		paused := mustAppend(t, s, Event("run-fence", statestore.RunPaused, ""))
		step := Event("run-fence", statestore.StepStarted, "a")
		if _, err := s.AppendIf(ctx, step, first.RunSeq); !errors.Is(err, statestore.ErrRunChanged) {
			t.Fatalf("StepStarted decided before RunPaused: got %v, want RUN_CHANGED", err)
		}
		if recs := mustFetch(t, s, "run-fence", 0, 0); len(recs) != 2 {
			t.Fatalf("got %d records after a refused append, want 2", len(recs))
		}
		res, err := s.AppendIf(ctx, step, paused.RunSeq)
		if err != nil || !res.Persisted {
			t.Fatalf("AppendIf on the last runSeq: %+v %v", res, err)
		}
		// A retry of the persisted conditional append, stale or not, is a
		// duplicate, never RUN_CHANGED.
		for _, last := range []int64{paused.RunSeq, res.RunSeq} {
			again := *step
			again.EventID = uuid.NewString()
			dup, err := s.AppendIf(ctx, &again, last)
			if err != nil || !dup.Idempotent || dup.EventID != step.EventID || dup.RunSeq != res.RunSeq {
				t.Fatalf("retry with lastSeq %d: %+v %v, want the stored record", last, dup, err)
			}
		}
		// Other runs do not move this run's last runSeq.
		mustAppend(t, s, Event("run-fence-other", statestore.RunStarted, ""))
		if _, err := s.AppendIf(ctx, Event("run-fence", statestore.StepStarted, "b"), res.RunSeq); err != nil {
			t.Fatalf("another run's append changed this run's fence: %v", err)
		}
		// Invalid events are refused as by Append.
		bad := Event("run-fence", statestore.StepStarted, "c")
		bad.EventID = "not-a-uuid"
		if _, err := s.AppendIf(ctx, bad, 0); !errors.Is(err, statestore.ErrSchemaValidation) {
			t.Fatalf("invalid event: got %v, want SCHEMA_VALIDATION_FAILED", err)
		}
	})

	run("AppendIf/Racing", func(t *testing.T, s statestore.Store) {
		// Racers decide on the same last runSeq: exactly one persists.
		base := mustAppend(t, s, Event("run-fence-race", statestore.RunStarted, ""))
		const racers = 16
		errs := make([]error, racers)
		var start, wg sync.WaitGroup
		start.Add(1)
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := Event("run-fence-race", statestore.StepStarted, fmt.Sprintf("s%02d", i))
				start.Wait()
				_, errs[i] = s.AppendIf(ctx, w, base.RunSeq)
			}()
		}
		start.Done()
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, statestore.ErrRunChanged):
				t.Fatalf("racer %d: %v", i, err)
			}
		}
		if recs := mustFetch(t, s, "run-fence-race", 0, 0); won != 1 || len(recs) != 2 {
			t.Fatalf("%d racers persisted, %d records; want 1 and 2", won, len(recs))
		}
	})

	run("Append/RacingDuplicates", func(t *testing.T, s statestore.Store) {
		const racers = 32
		base := Event("run-race", statestore.StepCompleted, "model.orders")
		results := make([]statestore.AppendResult, racers)
		errs := make([]error, racers)
		var start, wg sync.WaitGroup
		start.Add(1)
		for i := 0; i < racers; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				w := *base
				w.EventID = uuid.NewString()
				start.Wait()
				results[i], errs[i] = s.Append(ctx, &w)
			}(i)
		}
		start.Done()
		wg.Wait()
		persisted := 0
		for i := range results {
			if errs[i] != nil {
				t.Fatalf("racer %d: %v", i, errs[i])
			}
			if results[i].Persisted {
				persisted++
			}
			if results[i].Persisted == results[i].Idempotent {
				t.Fatalf("racer %d: persisted=%v idempotent=%v", i, results[i].Persisted, results[i].Idempotent)
			}
			if results[i].EventID != results[0].EventID || results[i].RunSeq != results[0].RunSeq || results[i].PersistedAt != results[0].PersistedAt {
				t.Fatalf("racer %d got %+v, racer 0 got %+v", i, results[i], results[0])
			}
		}
		if persisted != 1 {
			t.Fatalf("%d racers persisted, want exactly 1", persisted)
		}
		if recs := mustFetch(t, s, "run-race", 0, 0); len(recs) != 1 || recs[0].EventID != results[0].EventID {
			t.Fatalf("got %d records (%v), want the one winner", len(recs), recs)
		}
	})

	run("Append/ConcurrentDistinct", func(t *testing.T, s statestore.Store) {
		const n = 64
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				if _, err := s.Append(ctx, Event("run-conc", statestore.StepStarted, fmt.Sprintf("s%d", i))); err != nil {
					errs <- err
				}
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		recs := mustFetch(t, s, "run-conc", 0, 0)
		if len(recs) != n {
			t.Fatalf("got %d records, want %d", len(recs), n)
		}
		assertOrdered(t, recs)
	})

	run("Append/RejectsInvalidAndWritesNothing", func(t *testing.T, s statestore.Store) {
		for _, c := range InvalidWrites() {
			t.Run(c.Name, func(t *testing.T) {
				_, err := s.Append(ctx, c.Write)
				if !errors.Is(err, statestore.ErrSchemaValidation) {
					t.Fatalf("got %v, want %s", err, statestore.CodeSchemaValidationFailed)
				}
				var e *statestore.Error
				if errors.As(err, &e) && c.Field != "" && e.Field != c.Field {
					t.Fatalf("error names field %q, want %q (%v)", e.Field, c.Field, err)
				}
				if recs := mustFetch(t, s, c.Write.RunID, 0, 0); len(recs) != 0 {
					t.Fatalf("a rejected event wrote %d records", len(recs))
				}
			})
		}
		if _, err := s.Append(ctx, nil); !errors.Is(err, statestore.ErrSchemaValidation) {
			t.Fatalf("nil event: got %v", err)
		}
	})

	run("Append/UnknownEventTypeAccepted", func(t *testing.T, s statestore.Store) {
		mustAppend(t, s, Event("run-unknown", statestore.RunStarted, ""))
		res := mustAppend(t, s, WithPayload(Event("run-unknown", "RunAnnotated", ""), map[string]any{"note": "x"}))
		snap, err := s.ProjectSnapshot(ctx, "run-unknown")
		if err != nil {
			t.Fatal(err)
		}
		if snap.LastEventSeq != res.RunSeq || snap.Status != statestore.RunStatusRunning || snap.Inconsistent {
			t.Fatalf("unknown event: got watermark %d status %s inconsistent %v, want %d RUNNING false",
				snap.LastEventSeq, snap.Status, snap.Inconsistent, res.RunSeq)
		}
	})

	run("RunIDs/AwkwardCharacters", func(t *testing.T, s statestore.Store) {
		ids := AwkwardRunIDs()
		for _, id := range ids {
			mustAppend(t, s, Event(id, statestore.RunStarted, ""))
			mustAppend(t, s, Event(id, statestore.StepStarted, "a"))
		}
		for _, id := range ids {
			recs := mustFetch(t, s, id, 0, 0)
			if len(recs) != 2 {
				t.Fatalf("run %q: got %d records, want 2 (runs must not mix)", id, len(recs))
			}
			for _, r := range recs {
				if r.RunID != id {
					t.Fatalf("run %q returned a record of run %q", id, r.RunID)
				}
			}
		}
	})

	run("Fetch/AfterSeqAndLimit", func(t *testing.T, s statestore.Store) {
		var seqs []int64
		for i := 0; i < 10; i++ {
			seqs = append(seqs, mustAppend(t, s, Event("run-fetch", statestore.StepStarted, fmt.Sprintf("s%d", i))).RunSeq)
		}
		all := mustFetch(t, s, "run-fetch", 0, 0)
		assertSeqs(t, all, seqs)
		assertSeqs(t, mustFetch(t, s, "run-fetch", seqs[3], 0), seqs[4:])
		assertSeqs(t, mustFetch(t, s, "run-fetch", seqs[3], 2), seqs[4:6])
		assertSeqs(t, mustFetch(t, s, "run-fetch", 0, 1), seqs[:1])
		assertSeqs(t, mustFetch(t, s, "run-fetch", seqs[9], 0), nil)
		assertSeqs(t, mustFetch(t, s, "run-fetch", seqs[3]+1, 0), seqsAfter(seqs, seqs[3]+1)) // afterSeq need not be a runSeq of the run
		assertSeqs(t, mustFetch(t, s, "run-fetch", -5, 0), seqs)
		assertSeqs(t, mustFetch(t, s, "no-such-run", 0, 0), nil)
		for i, r := range all {
			if r.StepID != fmt.Sprintf("s%d", i) {
				t.Fatalf("record %d is step %q", i, r.StepID)
			}
		}
	})

	run("Fetch/RecordsImmutable", func(t *testing.T, s statestore.Store) {
		mustAppend(t, s, WithPayload(Event("run-imm", statestore.RunStarted, ""), map[string]any{"engineRunRef": "conductor://wf/1"}))
		recs := mustFetch(t, s, "run-imm", 0, 0)
		recs[0].EventType = "Tampered"
		for i := range recs[0].Payload {
			recs[0].Payload[i] = ' '
		}
		again := mustFetch(t, s, "run-imm", 0, 0)
		if again[0].EventType != statestore.RunStarted || !bytes.Contains(again[0].Payload, []byte("conductor://wf/1")) {
			t.Fatalf("a caller changed a stored record: %+v", again[0])
		}
	})

	run("Fetch/LargeRun", func(t *testing.T, s statestore.Store) {
		// More records than one page of a typical backend request (1,024).
		const n = 1100
		for i := 0; i < n; i++ {
			mustAppend(t, s, Event("run-large", statestore.StepStarted, fmt.Sprintf("s%04d", i)))
		}
		recs := mustFetch(t, s, "run-large", 0, 0)
		if len(recs) != n {
			t.Fatalf("got %d records, want %d", len(recs), n)
		}
		assertOrdered(t, recs)
		if tail := mustFetch(t, s, "run-large", recs[1049].RunSeq, 10); len(tail) != 10 || tail[0].RunSeq != recs[1050].RunSeq {
			t.Fatalf("afterSeq/limit past the first page returned %d records", len(tail))
		}
	})

	run("Snapshot/ProjectsLog", func(t *testing.T, s statestore.Store) {
		if _, err := s.GetSnapshot(ctx, "run-none"); !errors.Is(err, statestore.ErrNotFound) {
			t.Fatalf("GetSnapshot of an unknown run: got %v, want ErrNotFound", err)
		}
		if _, err := s.ProjectSnapshot(ctx, "run-none"); !errors.Is(err, statestore.ErrNotFound) {
			t.Fatalf("ProjectSnapshot of an unknown run: got %v, want ErrNotFound", err)
		}
		mustAppend(t, s, Event("run-snap", statestore.RunStarted, ""))
		mustAppend(t, s, Event("run-snap", statestore.StepStarted, "a"))
		snap, err := s.GetSnapshot(ctx, "run-snap")
		if err != nil {
			t.Fatal(err)
		}
		if snap.Status != statestore.RunStatusRunning || len(snap.Steps) != 1 || snap.Steps[0].Status != statestore.StepStatusRunning {
			t.Fatalf("snapshot: got status %s steps %+v", snap.Status, snap.Steps)
		}
		last := mustAppend(t, s, Event("run-snap", statestore.StepCompleted, "a"))
		snap2, err := s.ProjectSnapshot(ctx, "run-snap")
		if err != nil {
			t.Fatal(err)
		}
		if snap2.LastEventSeq != last.RunSeq || snap2.Steps[0].Status != statestore.StepStatusSuccess {
			t.Fatalf("after StepCompleted: got watermark %d step %s", snap2.LastEventSeq, snap2.Steps[0].Status)
		}
		if snap.Steps[0].Status != statestore.StepStatusRunning {
			t.Fatalf("the earlier snapshot was modified in place")
		}
		if got, _ := s.GetSnapshot(ctx, "run-snap"); got.LastEventSeq != last.RunSeq {
			t.Fatalf("GetSnapshot after ProjectSnapshot: watermark %d, want %d", got.LastEventSeq, last.RunSeq)
		}
	})

	run("Context/Cancelled", func(t *testing.T, s statestore.Store) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.Append(cctx, Event("run-ctx", statestore.RunStarted, "")); err == nil {
			t.Fatal("append with a cancelled context succeeded")
		}
		if recs := mustFetch(t, s, "run-ctx", 0, 0); len(recs) != 0 {
			t.Fatalf("append with a cancelled context wrote %d records", len(recs))
		}
	})
}

// InvalidCase is a RunEventWrite that validation must refuse, and the field
// the error must name ("" when any field will do).
type InvalidCase struct {
	Name  string
	Field string
	Write *statestore.RunEventWrite
}

// InvalidWrites returns one invalid event per envelope rule.
func InvalidWrites() []InvalidCase {
	mk := func(name, field string, f func(w *statestore.RunEventWrite), rekey bool) InvalidCase {
		w := Event("run-bad-"+strings.ReplaceAll(strings.ToLower(name), " ", "-"), statestore.StepStarted, "a")
		f(w)
		if rekey {
			Rekey(w)
		}
		return InvalidCase{name, field, w}
	}
	long := strings.Repeat("x", statestore.MaxIDBytes+1)
	return []InvalidCase{
		mk("missing eventId", "eventId", func(w *statestore.RunEventWrite) { w.EventID = "" }, false),
		mk("uuid v1", "eventId", func(w *statestore.RunEventWrite) { w.EventID = "6ba7b810-9dad-11d1-80b4-00c04fd430c8" }, false),
		mk("uuid v5", "eventId", func(w *statestore.RunEventWrite) { w.EventID = "886313e1-3b8a-5372-9b90-0c9aee199e5d" }, false),
		mk("uuid braces", "eventId", func(w *statestore.RunEventWrite) { w.EventID = "{" + uuid.NewString() + "}" }, false),
		mk("missing eventType", "eventType", func(w *statestore.RunEventWrite) { w.EventType = "" }, false),
		mk("missing emittedAt", "emittedAt", func(w *statestore.RunEventWrite) { w.EmittedAt = "" }, false),
		mk("emittedAt not RFC 3339", "emittedAt", func(w *statestore.RunEventWrite) { w.EmittedAt = "2026-02-11 10:30:00" }, false),
		mk("emittedAt not UTC", "emittedAt", func(w *statestore.RunEventWrite) { w.EmittedAt = "2026-02-11T10:30:00+02:00" }, false),
		mk("missing tenantId", "tenantId", func(w *statestore.RunEventWrite) { w.TenantID = "" }, false),
		mk("missing projectId", "projectId", func(w *statestore.RunEventWrite) { w.ProjectID = "" }, false),
		mk("missing environmentId", "environmentId", func(w *statestore.RunEventWrite) { w.EnvironmentID = "" }, false),
		mk("missing planId", "planId", func(w *statestore.RunEventWrite) { w.PlanID = "" }, true),
		mk("missing planVersion", "planVersion", func(w *statestore.RunEventWrite) { w.PlanVersion = "" }, true),
		mk("engineAttemptId zero", "engineAttemptId", func(w *statestore.RunEventWrite) { w.EngineAttemptID = 0 }, false),
		mk("engineAttemptId negative", "engineAttemptId", func(w *statestore.RunEventWrite) { w.EngineAttemptID = -1 }, false),
		mk("logicalAttemptId zero", "logicalAttemptId", func(w *statestore.RunEventWrite) { w.LogicalAttemptID = 0 }, true),
		mk("logicalAttemptId negative", "logicalAttemptId", func(w *statestore.RunEventWrite) { w.LogicalAttemptID = -2 }, true),
		mk("step event without stepId", "stepId", func(w *statestore.RunEventWrite) { w.StepID = "" }, true),
		mk("run event with stepId", "stepId", func(w *statestore.RunEventWrite) { w.EventType = statestore.RunStarted }, true),
		mk("extension run event with stepId", "stepId", func(w *statestore.RunEventWrite) {
			w.EventType = statestore.RunStepRetryRequested
			w.Payload = json.RawMessage(`{"stepId":"a","stepLogicalAttemptId":2}`)
		}, true),
		mk("pipe in runId", "runId", func(w *statestore.RunEventWrite) { w.RunID = "a|b" }, true),
		mk("pipe in stepId", "stepId", func(w *statestore.RunEventWrite) { w.StepID = "a|b" }, true),
		mk("pipe in eventType", "eventType", func(w *statestore.RunEventWrite) { w.EventType = "Run|X" }, true),
		mk("pipe in planId", "planId", func(w *statestore.RunEventWrite) { w.PlanID = "p|1" }, true),
		mk("pipe in planVersion", "planVersion", func(w *statestore.RunEventWrite) { w.PlanVersion = "1|2" }, true),
		mk("runId too long", "runId", func(w *statestore.RunEventWrite) { w.RunID = long }, true),
		mk("stepId too long", "stepId", func(w *statestore.RunEventWrite) { w.StepID = long }, true),
		mk("runId invalid UTF-8", "runId", func(w *statestore.RunEventWrite) { w.RunID = "run-\xff" }, true),
		mk("missing idempotencyKey", "idempotencyKey", func(w *statestore.RunEventWrite) { w.IdempotencyKey = "" }, false),
		mk("idempotencyKey uppercase", "idempotencyKey", func(w *statestore.RunEventWrite) { w.IdempotencyKey = strings.ToUpper(w.IdempotencyKey) }, false),
		mk("idempotencyKey of another attempt", "idempotencyKey", func(w *statestore.RunEventWrite) { w.LogicalAttemptID = 2 }, false),
		mk("payload not an object", "payload", func(w *statestore.RunEventWrite) { w.Payload = []byte(`[1,2]`) }, false),
		mk("payload malformed", "payload", func(w *statestore.RunEventWrite) { w.Payload = []byte(`{"a":`) }, false),
		mk("payload too large", "payload", func(w *statestore.RunEventWrite) {
			w.Payload = []byte(`{"a":"` + strings.Repeat("x", statestore.MaxPayloadBytes) + `"}`)
		}, false),
	}
}

// AwkwardRunIDs returns runIds that stress subject and key encodings.
func AwkwardRunIDs() []string {
	return []string{
		"a", "a.b", "a.b.c", "a*", "a.*", "a.>", ">", "*", "run with spaces", " leading", "trailing ",
		"ünïcødé-日本語-🚀", "tab\there", "slash/and\\back", "a.b ", "A", "percent%2e", "dots...",
		strings.Repeat("é", statestore.MaxIDBytes/2), // exactly MaxIDBytes bytes of UTF-8
	}
}

func mustAppend(t *testing.T, s statestore.Store, w *statestore.RunEventWrite) statestore.AppendResult {
	t.Helper()
	res, err := s.Append(context.Background(), w)
	if err != nil {
		t.Fatalf("append %s %s: %v", w.EventType, w.StepID, err)
	}
	return res
}

func mustFetch(t *testing.T, s statestore.Store, runID string, after int64, limit int) []statestore.RunEventRecord {
	t.Helper()
	recs, err := s.Fetch(context.Background(), runID, after, limit)
	if err != nil {
		t.Fatalf("fetch %q: %v", runID, err)
	}
	return recs
}

func mustUTC(t *testing.T, ts string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		t.Fatalf("timestamp %q: %v", ts, err)
	}
	if _, off := at.Zone(); off != 0 || !strings.HasSuffix(ts, "Z") {
		t.Fatalf("timestamp %q is not UTC with Z", ts)
	}
	return at
}

func assertOrdered(t *testing.T, recs []statestore.RunEventRecord) {
	t.Helper()
	for i := 1; i < len(recs); i++ {
		if recs[i].RunSeq <= recs[i-1].RunSeq {
			t.Fatalf("records %d and %d out of order: %d then %d", i-1, i, recs[i-1].RunSeq, recs[i].RunSeq)
		}
	}
}

func seqsAfter(seqs []int64, after int64) []int64 {
	var out []int64
	for _, s := range seqs {
		if s > after {
			out = append(out, s)
		}
	}
	return out
}

func assertSeqs(t *testing.T, recs []statestore.RunEventRecord, want []int64) {
	t.Helper()
	got := make([]int64, len(recs))
	for i, r := range recs {
		got[i] = r.RunSeq
	}
	if fmt.Sprint(got) != fmt.Sprint(want) && !(len(got) == 0 && len(want) == 0) {
		t.Fatalf("runSeqs: got %v, want %v", got, want)
	}
}
