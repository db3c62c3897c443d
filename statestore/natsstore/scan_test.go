package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestStore_Follow reads the log of three interleaved runs in pages: every
// record once, in stream order, with its runSeq and persistedAt; a message
// that is not a record is skipped but passed; the end gives nothing and
// the same cursor; LastSeq is the last message's sequence.
func TestStore_Follow(t *testing.T) {
	ctx := context.Background()
	js := connect(t, startServer(t, t.TempDir()))
	s := openUnique(t, js)
	st, err := js.Stream(ctx, s.Stream())
	if err != nil {
		t.Fatal(err)
	}
	prefix := strings.TrimSuffix(st.CachedInfo().Config.Subjects[0], ".>")

	empty, err := s.Follow(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if recs, next, err := empty.Next(ctx, 10); err != nil || len(recs) != 0 || next != 0 {
		t.Fatalf("an empty log: %d records, cursor %d, %v", len(recs), next, err)
	}
	empty.Close()
	var want []statestore.AppendResult
	var wantRuns []string
	for i := range 12 {
		runID := fmt.Sprintf("run-%d", i%3)
		typ := statestore.RunStarted
		step := ""
		if i >= 3 {
			typ, step = statestore.StepStarted, fmt.Sprintf("s%d", i)
		}
		want = append(want, mustAppend(t, s, storetest.Event(runID, typ, step)))
		wantRuns = append(wantRuns, runID)
		if i == 5 {
			if _, err := js.Publish(ctx, prefix+"."+natsstore.RunToken("run-0")+".garbage", []byte("not json")); err != nil {
				t.Fatal(err)
			}
		}
	}
	last, err := s.LastSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if last != uint64(want[len(want)-1].RunSeq) {
		t.Fatalf("LastSeq: got %d, want %d", last, want[len(want)-1].RunSeq)
	}
	var got []statestore.RunEventRecord
	cursor := uint64(0)
	tl, err := s.Follow(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	for range 10 {
		recs, next, err := tl.Next(ctx, 5)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			if next != cursor {
				t.Fatalf("an empty scan moved the cursor from %d to %d", cursor, next)
			}
			break
		}
		if next <= cursor {
			t.Fatalf("scan after %d: cursor %d does not advance", cursor, next)
		}
		got = append(got, recs...)
		cursor = next
	}
	if cursor != last {
		t.Fatalf("scan ended at %d, want %d (the garbage message is passed, not stuck on)", cursor, last)
	}
	// A tail started mid-log begins after its sequence.
	mid, err := s.Follow(ctx, uint64(want[5].RunSeq))
	if err != nil {
		t.Fatal(err)
	}
	defer mid.Close()
	// Next takes what has arrived once the first message is there, so the
	// six may come in more than one call.
	var tailed []statestore.RunEventRecord
	for deadline := time.Now().Add(time.Minute); len(tailed) < 6 && time.Now().Before(deadline); {
		recs, _, err := mid.Next(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		tailed = append(tailed, recs...)
	}
	if len(tailed) != 6 || tailed[0].RunSeq != want[6].RunSeq {
		t.Fatalf("a tail after record 5: %d records, want the last 6", len(tailed))
	}
	if len(got) != len(want) {
		t.Fatalf("scan: got %d records, want %d", len(got), len(want))
	}
	for i, r := range got {
		if r.RunSeq != want[i].RunSeq || r.RunID != wantRuns[i] || r.EventID != want[i].EventID || r.PersistedAt != want[i].PersistedAt {
			t.Fatalf("record %d: got %s/%d %s at %s, want %s/%d %s at %s", i, r.RunID, r.RunSeq, r.EventID, r.PersistedAt,
				wantRuns[i], want[i].RunSeq, want[i].EventID, want[i].PersistedAt)
		}
	}
}

// TestStore_FollowAStreamDeleted: a tail whose stream is deleted (by an
// administrator) answers with an error, in bounded time, instead of
// recreating its consumer forever: serve hung at shutdown waiting for
// the run list's follower (TestServe_ReadyzReportsDeletedStream).
func TestStore_FollowAStreamDeleted(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Permissions: natsstore.AllPermissions})
	s := openUnique(t, js)
	mustAppend(t, s, storetest.Event("r", statestore.RunStarted, ""))
	tl, err := s.Follow(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	if recs, _, err := tl.Next(ctx, 10); err != nil || len(recs) != 1 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	if err := js.DeleteStream(ctx, s.Stream()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for {
			if _, _, err := tl.Next(ctx, 10); err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if !errors.Is(err, statestore.ErrUnavailable) {
			t.Fatalf("Next on a deleted stream: %v, want STORE_UNAVAILABLE", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Next on a deleted stream did not return in 30 s")
	}
}

// TestStore_FollowAStalledConsumer: the server keeps the tail's consumer
// but it delivers nothing (paused on the server here; an overloaded server
// left one so for good under a steady load, and retention stopped seeing
// runs end). Records appended after that still reach the tail, through a
// new consumer from the tail's position, and none twice.
func TestStore_FollowAStalledConsumer(t *testing.T) {
	ctx := context.Background()
	js := connect(t, startServer(t, t.TempDir()))
	s := openUnique(t, js)
	mustAppend(t, s, storetest.Event("r", statestore.RunStarted, ""))
	tl, err := s.Follow(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	if recs, _, err := tl.Next(ctx, 10); err != nil || len(recs) != 1 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	st, err := js.Stream(ctx, s.Stream())
	if err != nil {
		t.Fatal(err)
	}
	paused := natstest.StallConsumers(t, st)
	if paused != 1 {
		t.Fatalf("paused %d consumers, want the tail's one", paused)
	}
	want := []statestore.AppendResult{
		mustAppend(t, s, storetest.Event("r", statestore.StepStarted, "a")),
		mustAppend(t, s, storetest.Event("r", statestore.StepStarted, "b")),
	}
	var got []statestore.RunEventRecord
	deadline := time.Now().Add(2 * time.Minute)
	for len(got) < len(want) && time.Now().Before(deadline) {
		recs, _, err := tl.Next(ctx, 10)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		got = append(got, recs...)
	}
	if len(got) != len(want) {
		t.Fatalf("the tail got %d of the %d records appended while its consumer was stalled", len(got), len(want))
	}
	for i := range want {
		if got[i].RunSeq != want[i].RunSeq {
			t.Fatalf("record %d: runSeq %d, want %d", i, got[i].RunSeq, want[i].RunSeq)
		}
	}
}
