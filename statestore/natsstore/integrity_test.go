package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// fillLog starts a server on dir, appends n events over several runs with
// the default stream (the one serve uses), closes the store (saving its
// watermark) and stops the server.
func fillLog(t *testing.T, dir string, n int) {
	t.Helper()
	srv := startServer(t, dir)
	s, err := natsstore.Open(context.Background(), connect(t, srv), natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		mustAppend(t, s, storetest.Event(fmt.Sprintf("run-%d", i%3), statestore.StepStarted, fmt.Sprintf("s%d", i)))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
}

func blockFiles(t *testing.T, dir string) []string {
	t.Helper()
	blks, _ := filepath.Glob(filepath.Join(dir, "jetstream", "*", "streams", natsstore.DefaultStream, "msgs", "*.blk"))
	if len(blks) == 0 {
		t.Fatalf("no block files of %s under %s", natsstore.DefaultStream, dir)
	}
	return blks
}

func reopen(t *testing.T, dir string) error {
	t.Helper()
	srv := startServer(t, dir)
	s, err := natsstore.Open(context.Background(), connect(t, srv), natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err == nil {
		_ = s.Close()
	}
	return err
}

// TestOpen_DamagedLog damages the event stream's files while no server
// runs, as a disk fault or a careless operator would, and expects Open to
// refuse the log with STORE_DAMAGED instead of serving a log that lost
// records (runs once went back to RUNNING with 2 of their 6 events).
func TestOpen_DamagedLog(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, blk string)
	}{
		{"Truncated", func(t *testing.T, blk string) {
			fi, err := os.Stat(blk)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(blk, fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		}},
		{"Overwritten", func(t *testing.T, blk string) {
			f, err := os.OpenFile(blk, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fi, _ := f.Stat()
			if _, err := f.WriteAt([]byte(strings.Repeat("\xff", 200)), fi.Size()/3); err != nil {
				t.Fatal(err)
			}
		}},
		{"Removed", func(t *testing.T, blk string) {
			if err := os.Remove(blk); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fillLog(t, dir, 30)
			tc.damage(t, blockFiles(t, dir)[0])
			err := reopen(t, dir)
			if !errors.Is(err, statestore.ErrDamaged) {
				t.Fatalf("Open after damage: got %v, want STORE_DAMAGED", err)
			}
			t.Logf("refused: %v", err)
		})
	}
	t.Run("Whole", func(t *testing.T) {
		dir := t.TempDir()
		fillLog(t, dir, 30)
		if err := reopen(t, dir); err != nil {
			t.Fatalf("Open of a whole log: %v", err)
		}
	})
}

// TestStore_Check is what /readyz asks: the stream deleted or replaced
// under a running store (by an administrator: the sidecar's own user may do
// neither) is reported as STORE_DAMAGED, and an append says why it fails.
func TestStore_Check(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, t.TempDir())
	js := connect(t, srv)
	s, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	mustAppend(t, s, storetest.Event("run-check", statestore.RunStarted, ""))
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check of a whole log: %v", err)
	}
	if err := js.DeleteStream(ctx, natsstore.DefaultStream); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); !errors.Is(err, statestore.ErrDamaged) || !strings.Contains(err.Error(), "deleted") {
		t.Fatalf("Check after delete: got %v, want STORE_DAMAGED naming the deletion", err)
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.Append(actx, storetest.Event("run-check", statestore.RunCompleted, "")); !errors.Is(err, statestore.ErrDamaged) {
		t.Fatalf("Append after delete: got %v, want STORE_DAMAGED", err)
	}
	// Re-created by someone else with the same configuration: replaced.
	cfg := jetstream.StreamConfig{Name: natsstore.DefaultStream, Subjects: []string{natsstore.DefaultSubjectPrefix + ".>"},
		MaxMsgsPerSubject: 1, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true, DenyDelete: true, DenyPurge: true}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); !errors.Is(err, statestore.ErrDamaged) || !strings.Contains(err.Error(), "replaced") {
		t.Fatalf("Check after replace: got %v, want STORE_DAMAGED naming the replacement", err)
	}
}

// TestStore_CheckWhileAppending: Check of a log that appends meanwhile is
// never a rollback: an append acknowledged between the stream's state and
// the store's highest sequence seen must not read as a stream ending below
// a sequence stored before (/readyz answered STORE_DAMAGED under load).
func TestStore_CheckWhileAppending(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, t.TempDir())
	s, err := natsstore.Open(ctx, connect(t, srv), natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	stop := make(chan struct{})
	var appends sync.WaitGroup
	for w := range 8 {
		appends.Add(1)
		go func() {
			defer appends.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.Append(ctx, storetest.Event(fmt.Sprintf("run-busy-%d", w), statestore.StepStarted, fmt.Sprintf("s%d", i))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	checks, damaged := 0, 0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); checks++ {
		if err := s.Check(ctx); errors.Is(err, statestore.ErrDamaged) {
			damaged++
			t.Logf("check %d: %v", checks, err)
		} else if err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	appends.Wait()
	if damaged > 0 {
		t.Fatalf("%d of %d checks of a whole log said STORE_DAMAGED while it appended", damaged, checks)
	}
}

// TestStore_WatermarkSavedWhileRunning: the watermark reaches the last
// appended sequence without a Close, so a crash loses at most the last
// interval of rollback detection.
func TestStore_WatermarkSavedWhileRunning(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, t.TempDir())
	js := connect(t, srv)
	s, err := natsstore.Open(ctx, js, natsstore.Options{WatermarkInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	var last statestore.AppendResult
	for i := range 5 {
		last = mustAppend(t, s, storetest.Event("run-mark", statestore.StepStarted, fmt.Sprint(i)))
	}
	kv, err := js.KeyValue(ctx, natsstore.DefaultStateBucket)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint(last.RunSeq)
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err := kv.Get(ctx, natsstore.DefaultStream)
		if err == nil && string(e.Value()) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("watermark after 10s: %v %v, want %s", e, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGuard: a KV bucket deleted or re-created under a running sidecar is
// reported, as the event stream is by Store.Check.
func TestGuard(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, t.TempDir())
	js := connect(t, srv)
	for _, b := range []string{"ONE", "TWO"} {
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b}); err != nil {
			t.Fatal(err)
		}
	}
	g, err := natsstore.NewGuard(ctx, js, "KV_ONE", "KV_TWO")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx); err != nil {
		t.Fatalf("Check with both buckets: %v", err)
	}
	if err := js.DeleteKeyValue(ctx, "TWO"); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx); !errors.Is(err, statestore.ErrDamaged) || !strings.Contains(err.Error(), "KV_TWO was deleted") {
		t.Fatalf("Check after delete: %v", err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "TWO"}); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx); !errors.Is(err, statestore.ErrDamaged) || !strings.Contains(err.Error(), "KV_TWO was replaced") {
		t.Fatalf("Check after re-create: %v", err)
	}
	if _, err := natsstore.NewGuard(ctx, js, "KV_NONE"); err == nil {
		t.Fatal("a guard of a missing stream")
	}
}

// TestFetch_RecordDamagedInPlace: bytes of one record overwritten inside
// a block file (a disk fault that keeps the file's length, records and
// index) are not seen by the server's start, which trusts its index: the
// record, and the block's records after it, can no longer be read, and a
// read of the run would show a shorter history as if it were the whole one
// (retention would archive it so and remove the run). A read of a whole
// run counts what it got against the server's subject index and fails
// with STORE_DAMAGED instead; other runs read as before.
func TestFetch_RecordDamagedInPlace(t *testing.T) {
	dir := t.TempDir()
	srv := startServer(t, dir)
	s, err := natsstore.Open(context.Background(), connect(t, srv), natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		mustAppend(t, s, storetest.Event("run-a", statestore.StepStarted, fmt.Sprintf("step-a-%02d", i)))
	}
	mustAppend(t, s, storetest.Event("run-b", statestore.StepStarted, "step-b-00"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()

	blk := blockFiles(t, dir)[0]
	b, err := os.ReadFile(blk)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(b), "step-a-05")
	if i < 0 {
		t.Fatalf("step-a-05 not found in %s", blk)
	}
	f, err := os.OpenFile(blk, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("XXXXXXXXX"), int64(i)); err != nil {
		t.Fatal(err)
	}
	f.Close()

	srv = startServer(t, dir)
	s, err = natsstore.Open(context.Background(), connect(t, srv), natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatalf("Open: %v (the damage is inside a record: the start does not see it)", err)
	}
	defer s.Close()
	recs, err := s.Fetch(context.Background(), "run-a", 0, 0)
	if !errors.Is(err, statestore.ErrDamaged) {
		t.Fatalf("Fetch of the damaged run: %d records, err %v; want STORE_DAMAGED", len(recs), err)
	}
	t.Logf("refused: %v", err)
	if _, err := s.ProjectSnapshot(context.Background(), "run-a"); !errors.Is(err, statestore.ErrDamaged) {
		t.Fatalf("projection of the damaged run: %v, want STORE_DAMAGED", err)
	}
	if recs, err := s.Fetch(context.Background(), "run-a", 0, 1000); !errors.Is(err, statestore.ErrDamaged) {
		t.Fatalf("a page of the damaged run from its start: %d records, %v; want STORE_DAMAGED", len(recs), err)
	}
	if recs, err := s.Fetch(context.Background(), "run-b", 0, 0); err != nil || len(recs) != 1 {
		t.Fatalf("Fetch of another run: %d records, %v", len(recs), err)
	}
}
