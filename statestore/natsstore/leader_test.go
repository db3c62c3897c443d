package natsstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestStore_LeaderFetch: the read Fetch falls back to when the direct gets
// find no event of a run (a follower of a replicated stream may not have
// applied them yet: TestE2E_Chaos saw a run just started through one
// sidecar answered RUN_NOT_FOUND through another) returns the run's
// records in runSeq order, as Fetch does, honours the limit, and finds
// nothing for a run that does not exist.
func TestStore_LeaderFetch(t *testing.T) {
	ctx := context.Background()
	js := connect(t, startServer(t, t.TempDir()))
	s := openUnique(t, js)
	for i := range 5 {
		for _, run := range []string{"run-a", "run-b"} {
			if _, err := s.Append(ctx, storetest.Event(run, statestore.StepStarted, fmt.Sprintf("s%d", i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	want, err := s.Fetch(ctx, "run-a", 0, 0)
	if err != nil || len(want) != 5 {
		t.Fatalf("Fetch: %d records, %v", len(want), err)
	}
	got, err := s.LeaderFetch(ctx, "run-a", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("leader read %d records, Fetch %d", len(got), len(want))
	}
	for i := range got {
		if got[i].RunSeq != want[i].RunSeq || got[i].IdempotencyKey != want[i].IdempotencyKey || got[i].PersistedAt != want[i].PersistedAt {
			t.Fatalf("record %d: leader %+v, Fetch %+v", i, got[i], want[i])
		}
	}
	if got, err := s.LeaderFetch(ctx, "run-a", 2); err != nil || len(got) != 2 || got[1].RunSeq != want[1].RunSeq {
		t.Fatalf("limit 2: %d records, %v", len(got), err)
	}
	if got, err := s.LeaderFetch(ctx, "no-such-run", 0); err != nil || len(got) != 0 {
		t.Fatalf("unknown run: %d records, %v", len(got), err)
	}
}
