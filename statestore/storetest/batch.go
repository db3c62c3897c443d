package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// runBatchSuite is the BatchAppender part of RunSuite: every backend the
// suite runs on must have it (bulk control depends on it).
func runBatchSuite(t *testing.T, run func(name string, f func(t *testing.T, s statestore.Store))) {
	ctx := context.Background()
	batcher := func(t *testing.T, s statestore.Store) statestore.BatchAppender {
		t.Helper()
		b, ok := s.(statestore.BatchAppender)
		if !ok {
			t.Fatalf("%T is not a statestore.BatchAppender", s)
		}
		return b
	}
	// pausedPair is a run's RunPaused and RunDrainCompleted of cycle 1.
	pausedPair := func(runID string) []*statestore.RunEventWrite {
		return []*statestore.RunEventWrite{Event(runID, statestore.RunPaused, ""), Event(runID, statestore.RunDrainCompleted, "")}
	}

	run("AppendBatch/AMovedRunIsRefusedTheOthersAppended", func(t *testing.T, s statestore.Store) {
		b := batcher(t, s)
		runs := []string{"batch-a", "batch-moved", "batch-c"}
		last := map[string]int64{}
		for _, r := range runs {
			last[r] = mustAppend(t, s, Event(r, statestore.RunStarted, "")).RunSeq
		}
		// batch-moved moves on after its state was read.
		mustAppend(t, s, Event("batch-moved", statestore.StepStarted, "s1"))
		var in []statestore.RunBatch
		for _, r := range runs {
			in = append(in, statestore.RunBatch{LastSeq: last[r], Events: pausedPair(r)})
		}
		out := b.AppendBatch(ctx, in)
		if len(out) != len(in) {
			t.Fatalf("got %d answers, want %d", len(out), len(in))
		}
		for i, r := range runs {
			recs := mustFetch(t, s, r, 0, 0)
			if r == "batch-moved" {
				if !errors.Is(out[i].Err, statestore.ErrRunChanged) || len(out[i].Results) != 0 {
					t.Fatalf("%s: got %d results, err %v; want RUN_CHANGED and nothing", r, len(out[i].Results), out[i].Err)
				}
				if len(recs) != 2 {
					t.Fatalf("%s: got %d records, want 2 (nothing of the batch written)", r, len(recs))
				}
				continue
			}
			if out[i].Err != nil || len(out[i].Results) != 2 {
				t.Fatalf("%s: got %d results, err %v; want 2 appended", r, len(out[i].Results), out[i].Err)
			}
			if len(recs) != 3 || recs[1].EventType != statestore.RunPaused || recs[2].EventType != statestore.RunDrainCompleted {
				t.Fatalf("%s: got %d records, want RunStarted, RunPaused, RunDrainCompleted", r, len(recs))
			}
			for k, res := range out[i].Results {
				rec := recs[k+1]
				if !res.Persisted || res.Idempotent || res.RunSeq != rec.RunSeq || res.EventID != rec.EventID || res.PersistedAt != rec.PersistedAt {
					t.Fatalf("%s event %d: got %+v, want the record %d/%s/%s persisted", r, k, res, rec.RunSeq, rec.EventID, rec.PersistedAt)
				}
			}
			if out[i].Results[1].RunSeq <= out[i].Results[0].RunSeq || out[i].Results[0].RunSeq <= last[r] {
				t.Fatalf("%s: runSeqs %d, %d after %d: want increasing", r, out[i].Results[0].RunSeq, out[i].Results[1].RunSeq, last[r])
			}
		}
	})

	run("AppendBatch/NewRunAndRetry", func(t *testing.T, s statestore.Store) {
		b := batcher(t, s)
		w := Event("batch-new", statestore.RunStarted, "")
		out := b.AppendBatch(ctx, []statestore.RunBatch{{LastSeq: 0, Events: []*statestore.RunEventWrite{w}}})
		if out[0].Err != nil || len(out[0].Results) != 1 || !out[0].Results[0].Persisted {
			t.Fatalf("a new run's batch: got %+v", out[0])
		}
		// The same batch again (a retry): a duplicate, nothing written.
		again := *w
		again.EventID = Event("batch-new", statestore.RunStarted, "").EventID
		out2 := b.AppendBatch(ctx, []statestore.RunBatch{{LastSeq: 0, Events: []*statestore.RunEventWrite{&again}}})
		if out2[0].Err != nil || len(out2[0].Results) != 1 || !out2[0].Results[0].Idempotent || out2[0].Results[0].EventID != w.EventID {
			t.Fatalf("a retried batch: got %+v, want the first append's record, idempotent", out2[0])
		}
		if recs := mustFetch(t, s, "batch-new", 0, 0); len(recs) != 1 {
			t.Fatalf("got %d records, want 1", len(recs))
		}
	})

	run("AppendBatch/InvalidRunWritesNothingOfIt", func(t *testing.T, s statestore.Store) {
		b := batcher(t, s)
		last := mustAppend(t, s, Event("batch-bad", statestore.RunStarted, "")).RunSeq
		ok := mustAppend(t, s, Event("batch-ok", statestore.RunStarted, "")).RunSeq
		bad := pausedPair("batch-bad")
		bad[1].EventID = "not-a-uuid"
		out := b.AppendBatch(ctx, []statestore.RunBatch{{LastSeq: last, Events: bad}, {LastSeq: ok, Events: pausedPair("batch-ok")}})
		if !errors.Is(out[0].Err, statestore.ErrSchemaValidation) || len(out[0].Results) != 0 {
			t.Fatalf("invalid run: got %+v, want SCHEMA_VALIDATION_FAILED", out[0])
		}
		if recs := mustFetch(t, s, "batch-bad", 0, 0); len(recs) != 1 {
			t.Fatalf("invalid run: got %d records, want 1", len(recs))
		}
		if out[1].Err != nil || len(out[1].Results) != 2 {
			t.Fatalf("valid run beside it: got %+v", out[1])
		}
	})
}
