package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// removable starts a server, opens a Removable store as the sidecar's
// least-privileged user and appends three finished runs of 3 events; it
// returns the store, the server and the runs' ids.
func removable(t *testing.T) (*natsstore.Store, *natsstore.Embedded, jetstream.JetStream, []string) {
	t.Helper()
	s, srv, js := openRemovable(t, t.TempDir())
	return s, srv, js, appendRuns(t, s, nil, 3)
}

// openRemovable starts a server on dir and opens a Removable store as the
// sidecar's least-privileged user.
func openRemovable(t *testing.T, dir string) (*natsstore.Store, *natsstore.Embedded, jetstream.JetStream) {
	t.Helper()
	js, srv := natstest.StartIn(t, dir, natsstore.EmbeddedConfig{Logger: zaptest.NewLogger(t),
		RetentionPermissions: natsstore.RetentionPermissions(natsstore.DefaultStream, natsstore.DefaultStateBucket, natsstore.DefaultSnapshotBucket, idsBucket)})
	s, err := natsstore.Open(context.Background(), js, natsstore.Options{Removable: true, Logger: zaptest.NewLogger(t), SnapshotBucket: natsstore.DefaultSnapshotBucket})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, srv, js
}

// idsBucket is a bucket with keys <runToken>.<key>, like the registry's.
const idsBucket = "SIDECAR_EVENT_IDS"

func openRemover(t *testing.T, srv *natsstore.Embedded) *natsstore.Remover {
	t.Helper()
	nc, err := srv.ConnectRetention()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	r, err := natsstore.OpenRemover(context.Background(), js, natsstore.RemoverOptions{Logger: zaptest.NewLogger(t), RunKeys: []natsstore.RunKeys{
		{Bucket: natsstore.DefaultSnapshotBucket, Keys: natsstore.RunKey}, {Bucket: idsBucket, Keys: natsstore.RunKeyPrefix},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func lastSeq(t *testing.T, s *natsstore.Store, id string) (uint64, uint64) {
	t.Helper()
	recs, err := s.Fetch(context.Background(), id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) == 0 {
		return 0, 0
	}
	return uint64(recs[len(recs)-1].RunSeq), uint64(len(recs))
}

func TestRemover_RemoveRun(t *testing.T) {
	ctx := context.Background()
	t.Run("OK", func(t *testing.T) {
		s, srv, js, ids := removable(t)
		r := openRemover(t, srv)
		for _, id := range ids[:2] {
			last, n := lastSeq(t, s, id)
			if err := r.RemoveRun(ctx, id, last, n); err != nil {
				t.Fatal(err)
			}
			if err := r.RemoveRun(ctx, id, last, n); err != nil {
				t.Fatalf("removing again: %v", err)
			}
		}
		for i, id := range ids {
			if _, n := lastSeq(t, s, id); (i < 2 && n != 0) || (i == 2 && n != 3) {
				t.Fatalf("run %s has %d records after removal of runs 0 and 1", id, n)
			}
		}
		if err := s.Check(ctx); err != nil {
			t.Fatalf("Check after removal: %v", err)
		}
		// A store opened again accepts the stream: the ledger accounts for it.
		s2, err := natsstore.Open(ctx, js, natsstore.Options{Removable: true})
		if err != nil {
			t.Fatalf("reopen after removal: %v", err)
		}
		s2.Close()
	})
	t.Run("RunKeysLeaveWithTheRun", func(t *testing.T) {
		s, srv, js, ids := removable(t)
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: idsBucket})
		if err != nil {
			t.Fatal(err)
		}
		snaps, err := js.KeyValue(ctx, natsstore.DefaultSnapshotBucket)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if _, err := s.ProjectSnapshot(ctx, id); err != nil { // terminal: saved
				t.Fatal(err)
			}
			for _, k := range []string{"a", "b"} {
				if _, err := kv.PutString(ctx, natsstore.RunToken(id)+"."+k, "x"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := snaps.Get(ctx, natsstore.RunToken(id)); err != nil {
				t.Fatalf("snapshot of %s not saved: %v", id, err)
			}
		}
		last, n := lastSeq(t, s, ids[0])
		if err := openRemover(t, srv).RemoveRun(ctx, ids[0], last, n); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			_, errSnap := snaps.Get(ctx, natsstore.RunToken(id))
			keys, _ := kv.ListKeysFiltered(ctx, natsstore.RunToken(id)+".>")
			var got []string
			for k := range keys.Keys() {
				got = append(got, k)
			}
			if removed := i == 0; removed != errors.Is(errSnap, jetstream.ErrKeyNotFound) || removed != (len(got) == 0) {
				t.Fatalf("run %s (removed %v): snapshot %v, event-id keys %v", id, removed, errSnap, got)
			}
		}
		// Purged, not deleted: no marker stays per key.
		for b, keys := range map[string]string{idsBucket: natsstore.RunKeyPrefix(natsstore.RunToken(ids[0])), natsstore.DefaultSnapshotBucket: natsstore.RunKey(natsstore.RunToken(ids[0]))} {
			st, err := js.Stream(ctx, "KV_"+b)
			if err != nil {
				t.Fatal(err)
			}
			info, err := st.Info(ctx, jetstream.WithSubjectFilter("$KV."+b+"."+keys))
			if err != nil {
				t.Fatal(err)
			}
			if len(info.State.Subjects) != 0 {
				t.Fatalf("%s still holds %v of the removed run", b, info.State.Subjects)
			}
		}
	})
	t.Run("SidecarUserCannotPurge", func(t *testing.T) {
		_, _, js, _ := removable(t)
		st, err := js.Stream(ctx, natsstore.DefaultStream)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(natsstore.DefaultSubjectPrefix+"."+natsstore.RunToken("run-0")+".>")); err == nil {
			t.Fatal("the sidecar's user purged a run")
		}
	})
	t.Run("RetentionUserCannotAppend", func(t *testing.T) {
		_, srv, _, _ := removable(t)
		nc, err := srv.ConnectRetention()
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		if _, err := js.Publish(ctx, natsstore.DefaultSubjectPrefix+".x.y", []byte("{}")); err == nil {
			t.Fatal("the retention user appended to the log")
		}
		if err := js.DeleteStream(ctx, natsstore.DefaultStream); err == nil {
			t.Fatal("the retention user deleted the stream")
		}
	})
	t.Run("PurgeOutsideTheLedgerIsDamage", func(t *testing.T) {
		s, srv, _, ids := removable(t)
		// A removal through the ledger first: holes are expected from now
		// on, but only as many as it accounts for.
		last, n := lastSeq(t, s, ids[0])
		if err := openRemover(t, srv).RemoveRun(ctx, ids[0], last, n); err != nil {
			t.Fatal(err)
		}
		nc, err := srv.ConnectRetention()
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		st, _ := js.Stream(ctx, natsstore.DefaultStream)
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(natsstore.DefaultSubjectPrefix+"."+natsstore.RunToken("run-1")+".>")); err != nil {
			t.Fatal(err)
		}
		if err := s.Check(ctx); !errors.Is(err, statestore.ErrDamaged) {
			t.Fatalf("Check after a purge the ledger does not know: got %v, want ErrDamaged", err)
		}
	})
	t.Run("CountDiffersRemovesNothing", func(t *testing.T) {
		s, srv, _, ids := removable(t)
		r := openRemover(t, srv)
		last, n := lastSeq(t, s, ids[0])
		if err := r.RemoveRun(ctx, ids[0], last, n-1); !errors.Is(err, statestore.ErrRunChanged) {
			t.Fatalf("got %v, want ErrRunChanged", err)
		}
		if _, got := lastSeq(t, s, ids[0]); got != n {
			t.Fatalf("run has %d records, want %d", got, n)
		}
	})
	t.Run("LaterRecordsStay", func(t *testing.T) {
		s, srv, _, ids := removable(t)
		r := openRemover(t, srv)
		last, n := lastSeq(t, s, ids[0])
		late := storetest.Event(ids[0], statestore.StepCompleted, "s")
		if _, err := s.Append(ctx, late); err != nil {
			t.Fatal(err)
		}
		if err := r.RemoveRun(ctx, ids[0], last, n); err != nil {
			t.Fatal(err)
		}
		recs, err := s.Fetch(ctx, ids[0], 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 1 || recs[0].EventID != late.EventID {
			t.Fatalf("got %+v, want only the late record", recs)
		}
		if err := s.Check(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("NotRemovable", func(t *testing.T) {
		js, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{})
		s, err := natsstore.Open(ctx, js, natsstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		nc, _ := srv.ConnectRetention()
		defer nc.Close()
		rjs, _ := jetstream.New(nc)
		if _, err := natsstore.OpenRemover(ctx, rjs, natsstore.RemoverOptions{}); !errors.Is(err, natsstore.ErrNotRemovable) {
			t.Fatalf("got %v, want ErrNotRemovable", err)
		}
	})
}

// TestRemover_CrashAtEachStep stops a removal after each of its steps, as
// a kill -9 would, and checks that the log still verifies in that state
// and that the next Remover finishes the removal.
func TestRemover_CrashAtEachStep(t *testing.T) {
	ctx := context.Background()
	crash := errors.New("crash")
	for _, step := range []string{"pending", "keys", "purged"} {
		t.Run(step, func(t *testing.T) {
			s, srv, js, ids := removable(t)
			r := openRemover(t, srv)
			r.SetStep(func(at, _ string) error {
				if at == step {
					return crash
				}
				return nil
			})
			last, n := lastSeq(t, s, ids[1])
			if err := r.RemoveRun(ctx, ids[1], last, n); !errors.Is(err, crash) {
				t.Fatalf("got %v, want the crash", err)
			}
			requireRecovers(t, s, srv, js, ids[1:2], ids[2])
		})
	}
}

// requireRecovers checks a log a removal of gone crashed in: it verifies,
// a store opens on it, a new Remover finishes the removal (every run of
// gone leaves), and a removal of next after it keeps the ledger exact.
func requireRecovers(t *testing.T, s *natsstore.Store, srv *natsstore.Embedded, js jetstream.JetStream, gone []string, next string) {
	t.Helper()
	ctx := context.Background()
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check with a removal under way: %v", err)
	}
	s2, err := natsstore.Open(ctx, js, natsstore.Options{Removable: true})
	if err != nil {
		t.Fatalf("reopen with a removal under way: %v", err)
	}
	s2.Close()
	openRemover(t, srv) // recovers
	for _, id := range gone {
		if _, got := lastSeq(t, s, id); got != 0 {
			t.Fatalf("run %s has %d records after recovery", id, got)
		}
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after recovery: %v", err)
	}
	last, n := lastSeq(t, s, next)
	if err := openRemover(t, srv).RemoveRun(ctx, next, last, n); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after the next removal: %v", err)
	}
}

// removableRuns is removable with n finished runs of 3 events.
func removableRuns(t *testing.T, n int) (*natsstore.Store, *natsstore.Embedded, jetstream.JetStream, []string) {
	t.Helper()
	s, srv, js, ids := removable(t)
	return s, srv, js, appendRuns(t, s, ids, n)
}

// appendRuns appends finished runs of 3 events after ids, up to n runs,
// and returns every run's id.
func appendRuns(t *testing.T, s *natsstore.Store, ids []string, n int) []string {
	t.Helper()
	for i := len(ids); i < n; i++ {
		id := fmt.Sprintf("run-%d", i)
		ids = append(ids, id)
		for _, w := range []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""), storetest.Event(id, statestore.StepStarted, "s"), storetest.Event(id, statestore.RunCompleted, "")} {
			if _, err := s.Append(context.Background(), w); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ids
}

func removals(t *testing.T, s *natsstore.Store, ids []string) []statestore.Removal {
	t.Helper()
	var out []statestore.Removal
	for _, id := range ids {
		last, n := lastSeq(t, s, id)
		out = append(out, statestore.Removal{RunID: id, LastRunSeq: last, Records: n})
	}
	return out
}

// TestRemover_CrashInTheMiddleOfABatch stops a batch's removal with some
// of its runs purged and others not (their keys purged, their records
// not), as a kill -9 between two purges would: the log verifies, and the
// next Remover purges the rest and accounts for exactly the batch.
func TestRemover_CrashInTheMiddleOfABatch(t *testing.T) {
	ctx := context.Background()
	crash := errors.New("crash")
	s, srv, js, ids := removableRuns(t, 8)
	batch := ids[:7]
	stopped := map[string]bool{ids[1]: true, ids[4]: true, ids[6]: true}
	r := openRemover(t, srv)
	r.SetStep(func(at, runID string) error {
		if at == "keys" && stopped[runID] {
			return crash
		}
		return nil
	})
	if err := r.RemoveRuns(ctx, removals(t, s, batch)); !errors.Is(err, crash) {
		t.Fatalf("got %v, want the crash", err)
	}
	for _, id := range batch {
		if _, n := lastSeq(t, s, id); (n == 0) == stopped[id] {
			t.Fatalf("run %s has %d records after the crash (stopped before its purge: %v)", id, n, stopped[id])
		}
	}
	requireRecovers(t, s, srv, js, batch, ids[7])
}

// TestRemover_Batch: a batch's runs are purged concurrently, at most
// RemoveInFlight at a time; a run whose count differs stays whole while
// the others leave; a runId given twice removes nothing.
func TestRemover_Batch(t *testing.T) {
	ctx := context.Background()
	t.Run("Concurrent", func(t *testing.T) {
		s, srv, _, ids := removableRuns(t, natsstore.RemoveBatchRuns+10)
		r := openRemover(t, srv)
		var in, most atomic.Int64
		deadline := time.Now().Add(2 * time.Minute) // a safety net for the whole batch
		r.SetStep(func(at, runID string) error {
			if at != "keys" {
				return nil
			}
			n := in.Add(1)
			defer in.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			// Wait for a second run to be purged alongside, then a moment
			// for more to pile in.
			for most.Load() < 2 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond)
			return nil
		})
		if err := r.RemoveRuns(ctx, removals(t, s, ids)); err != nil {
			t.Fatal(err)
		}
		if m := most.Load(); m < 2 || m > natsstore.RemoveInFlight {
			t.Fatalf("%d runs were purged at once, want 2 to %d", m, natsstore.RemoveInFlight)
		}
		for _, id := range ids {
			if _, n := lastSeq(t, s, id); n != 0 {
				t.Fatalf("run %s has %d records after removal", id, n)
			}
		}
		if err := s.Check(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("OneRunChanged", func(t *testing.T) {
		s, srv, _, ids := removableRuns(t, 5)
		rs := removals(t, s, ids)
		rs[2].Records--
		if err := openRemover(t, srv).RemoveRuns(ctx, rs); !errors.Is(err, statestore.ErrRunChanged) {
			t.Fatalf("got %v, want ErrRunChanged", err)
		}
		for i, id := range ids {
			if _, n := lastSeq(t, s, id); (i == 2) != (n == 3) {
				t.Fatalf("run %s has %d records", id, n)
			}
		}
		if err := s.Check(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ManyRunsChangedNamesAFew", func(t *testing.T) {
		s, srv, _, ids := removableRuns(t, 40)
		rs := removals(t, s, ids)
		for i := range rs {
			rs[i].Records--
		}
		err := openRemover(t, srv).RemoveRuns(ctx, rs)
		if !errors.Is(err, statestore.ErrRunChanged) {
			t.Fatalf("got %v, want ErrRunChanged", err)
		}
		// The error is logged as it is: a few runs and a count, not every run.
		if msg := err.Error(); len(msg) > 1024 || !strings.Contains(msg, "and 37 more runs") {
			t.Fatalf("RUN_CHANGED of 40 runs says, in %d bytes: %.300s...; want three runs and \"and 37 more\" within 1 KiB", len(msg), msg)
		}
	})
	t.Run("RunTwiceRemovesNothing", func(t *testing.T) {
		s, srv, _, ids := removableRuns(t, 3)
		rs := removals(t, s, ids)
		rs = append(rs, rs[0])
		if err := openRemover(t, srv).RemoveRuns(ctx, rs); !errors.Is(err, statestore.ErrSchemaValidation) {
			t.Fatalf("got %v, want ErrSchemaValidation", err)
		}
		for _, id := range ids {
			if _, n := lastSeq(t, s, id); n != 3 {
				t.Fatalf("run %s has %d records", id, n)
			}
		}
	})
}

// TestRemover_OnePendingRunLedger: a ledger holding one pending run in
// its one-run form ("pending") is finished on open like a batch.
func TestRemover_OnePendingRunLedger(t *testing.T) {
	ctx := context.Background()
	s, srv, js, ids := removable(t)
	last, n := lastSeq(t, s, ids[0])
	if err := openRemover(t, srv).RemoveRun(ctx, ids[0], last, n); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, natsstore.DefaultStateBucket)
	if err != nil {
		t.Fatal(err)
	}
	last, n = lastSeq(t, s, ids[1])
	old := fmt.Sprintf(`{"removed":3,"pending":{"runId":%q,"lastRunSeq":%d,"records":%d}}`, ids[1], last, n)
	if _, err := kv.PutString(ctx, natsstore.DefaultStream+".removed", old); err != nil {
		t.Fatal(err)
	}
	requireRecovers(t, s, srv, js, ids[:2], ids[2])
	e, err := kv.Get(ctx, natsstore.DefaultStream+".removed")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(e.Value()); got != `{"removed":9}` {
		t.Fatalf("ledger %s, want {\"removed\":9}", got)
	}
}

// killDirEnv is the data dir of TestRemover_KillChild's server, set by
// TestRemover_KillDashNineInTheMiddleOfABatch.
const killDirEnv = "NATSSTORE_KILL_DIR"

// killBatch is the batch the child removes and killStopped its runs the
// child's purges never reach: their keys are purged, their records not.
var (
	killBatch   = []string{"run-0", "run-1", "run-2", "run-3", "run-4", "run-5", "run-6"}
	killStopped = map[string]bool{"run-1": true, "run-4": true, "run-6": true}
)

// TestRemover_KillDashNineInTheMiddleOfABatch kills (SIGKILL) a process
// whose Remover is in the middle of a batch's purges, with some of the
// batch's runs purged and the others not, and checks from this process on
// the same data dir that the log verifies, that a new Remover finishes
// the batch and that the ledger stays exact.
func TestRemover_KillDashNineInTheMiddleOfABatch(t *testing.T) {
	if os.Getenv(killDirEnv) != "" {
		t.Skip("the child's own run")
	}
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "nats")
	{
		s, srv, _ := openRemovable(t, dir)
		appendRuns(t, s, nil, len(killBatch)+1)
		s.Close()
		srv.Shutdown()
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRemover_KillChild$", "-test.v")
	cmd.Env = append(os.Environ(), killDirEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child: %v, want killed by SIGKILL\n%s", err, out)
	}
	s, srv, js := openRemovable(t, dir)
	for _, id := range killBatch {
		if _, n := lastSeq(t, s, id); (n == 0) == killStopped[id] {
			t.Fatalf("run %s has %d records after the kill (its purge never reached: %v)", id, n, killStopped[id])
		}
	}
	requireRecovers(t, s, srv, js, killBatch, "run-7")
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRemover_KillChild is the child of
// TestRemover_KillDashNineInTheMiddleOfABatch: it removes killBatch and
// SIGKILLs its own process once every run of it but killStopped is
// purged, those waiting after their keys' purge.
func TestRemover_KillChild(t *testing.T) {
	dir := os.Getenv(killDirEnv)
	if dir == "" {
		t.Skip("run by TestRemover_KillDashNineInTheMiddleOfABatch")
	}
	s, srv, _ := openRemovable(t, dir)
	r := openRemover(t, srv)
	var purged atomic.Int64
	r.SetStep(func(at, runID string) error {
		switch {
		case at == "keys" && killStopped[runID]:
			select {} // never purged: the kill comes first
		case at == "purged" && runID != "":
			if purged.Add(1) == int64(len(killBatch)-len(killStopped)) {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
		return nil
	})
	err := r.RemoveRuns(context.Background(), removals(t, s, killBatch))
	t.Fatalf("the removal ended without being killed: %v", err)
}

// TestOpen_RetentionSettingIsNoOtherVersion: a stream opened with
// retention on after it was created without it (or the other way) is not
// reported as another version's configuration: retention decides what the
// difference means (STORE_NOT_REMOVABLE). Another difference still is.
func TestOpen_RetentionSettingIsNoOtherVersion(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Permissions: natsstore.AllPermissions}) // an administrator changes the stream below
	s, err := natsstore.Open(ctx, js, natsstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	core, logs := observer.New(zap.WarnLevel)
	s, err = natsstore.Open(ctx, js, natsstore.Options{Removable: true, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if n := logs.FilterMessageSnippet("differs from this version's").Len(); n != 0 {
		t.Fatalf("retention on a stream created without it: %d warnings of another version's configuration", n)
	}
	// An administrator's change: reported.
	st, err := js.Stream(ctx, natsstore.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Description = "changed by hand"
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	s, err = natsstore.Open(ctx, js, natsstore.Options{Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if n := logs.FilterMessageSnippet("differs from this version's").Len(); n != 1 {
		t.Fatalf("a stream changed by hand: %d warnings, want 1", n)
	}
}

// TestRemover_CountsARunFromTheIndex: before purging a run the remover
// counts its records up to the archived last one. Whether the run got
// records after that is asked of the stream's subject index (its last
// message), not found with a next_by_subj from there, which the server
// answers by scanning every later run's messages: with retention's window
// after the run, that scan made each removal cost what the window held.
func TestRemover_CountsARunFromTheIndex(t *testing.T) {
	// The sidecar's user may do everything here, so that a connection of
	// it can watch the remover's requests.
	js, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Logger: zaptest.NewLogger(t), Permissions: natsstore.AllPermissions,
		RetentionPermissions: natsstore.RetentionPermissions(natsstore.DefaultStream, natsstore.DefaultStateBucket, natsstore.DefaultSnapshotBucket, idsBucket)})
	s, err := natsstore.Open(context.Background(), js, natsstore.Options{Removable: true, Logger: zaptest.NewLogger(t), SnapshotBucket: natsstore.DefaultSnapshotBucket})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ids := appendRuns(t, s, nil, 100) // the first, and later runs as retention's window keeps
	requests := watchRequests(t, js.Conn(), "$JS.API.>")
	if err := openRemover(t, srv).RemoveRuns(context.Background(), removals(t, s, ids[:1])); err != nil {
		t.Fatal(err)
	}
	for _, m := range requests() {
		if strings.Contains(string(m.Data), "next_by_subj") {
			t.Errorf("the removal scanned the stream: %s %s", m.Subject, m.Data)
		}
	}
	if last, _ := lastSeq(t, s, ids[0]); last != 0 {
		t.Fatalf("run %s not removed", ids[0])
	}
}
