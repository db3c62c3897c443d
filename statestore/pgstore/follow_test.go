package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// readAll reads the tail until it has n records or the deadline passes.
func readAll(t *testing.T, tl statestore.LogTail, n int, within time.Duration) []statestore.RunEventRecord {
	t.Helper()
	var out []statestore.RunEventRecord
	deadline := time.Now().Add(within)
	for len(out) < n && time.Now().Before(deadline) {
		recs, _, err := tl.Next(context.Background(), 100)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, recs...)
	}
	return out
}

// TestFollow: the whole log in one order, every record once, each run's
// records in runSeq order, across runs appended at once; LastSeq is what
// a tail reaches.
func TestFollow(t *testing.T) {
	s := open(t, pgtest.URL(t))
	ctx := context.Background()
	var wg sync.WaitGroup
	for r := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				if _, err := s.Append(ctx, storetest.Event(fmt.Sprintf("run-%d", r), statestore.StepStarted, fmt.Sprintf("s%02d", i))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	tl, err := s.Follow(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	got := readAll(t, tl, 200, 10*time.Second)
	if len(got) != 200 {
		t.Fatalf("%d records, want 200", len(got))
	}
	last := map[string]int64{}
	for i, r := range got {
		if r.LogSeq != uint64(i+1) {
			t.Fatalf("record %d has log sequence %d", i, r.LogSeq)
		}
		if r.RunSeq != last[r.RunID]+1 {
			t.Fatalf("run %s: runSeq %d after %d", r.RunID, r.RunSeq, last[r.RunID])
		}
		last[r.RunID] = r.RunSeq
	}
	if seq, err := s.LastSeq(ctx); err != nil || seq != 200 {
		t.Fatalf("LastSeq %d %v, want 200", seq, err)
	}
}

// TestFollow_Holes: a follower does not pass an append still in flight
// (its log sequence taken, its transaction not committed) while later
// appends are visible, and reads it in its place once it commits; a
// sequence number no append will ever use is passed after the grace.
func TestFollow_Holes(t *testing.T) {
	url := pgtest.URL(t)
	s, err := pgstore.Open(context.Background(), url, pgstore.Options{HoleGrace: 2 * time.Second, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := context.Background()
	if _, err := s.Append(ctx, storetest.Event("run-a", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	// An append in flight: its own transaction, not committed yet.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slow := storetest.Event("run-slow", statestore.RunStarted, "")
	body, _ := statestore.EncodeWrite(slow)
	if _, err := tx.Exec(ctx, "SELECT * FROM append_event($1, $2, $3, $4, $5, -1)", slow.RunID, slow.IdempotencyKey, slow.EventID, slow.EventType, string(body)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, storetest.Event("run-b", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	tl, _ := s.Follow(ctx, 0)
	defer tl.Close()
	got := readAll(t, tl, 3, time.Second)
	if len(got) != 1 || got[0].RunID != "run-a" {
		t.Fatalf("with an append in flight the tail read %d records; want run-a alone, run-b held behind the hole", len(got))
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got = append(got, readAll(t, tl, 2, 5*time.Second)...)
	if len(got) != 3 || got[1].RunID != "run-slow" || got[2].RunID != "run-b" {
		t.Fatalf("after the commit: %d records, want run-a, run-slow, run-b in log order", len(got))
	}
	// A number taken and never used (an append that failed after taking
	// it): passed after the grace, never before.
	if _, err := conn.Exec(ctx, "SELECT nextval('run_events_log_seq')"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, storetest.Event("run-c", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	more := readAll(t, tl, 1, 10*time.Second)
	if len(more) != 1 || more[0].RunID != "run-c" {
		t.Fatalf("past a lost number: %d records, want run-c", len(more))
	}
	if waited := time.Since(began); waited < 1500*time.Millisecond {
		t.Fatalf("passed the hole after %s, before the grace", waited)
	}
}
