package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// envNATSURL names an external NATS server to run the suite against as well.
const envNATSURL = "SIDECAR_TEST_NATS_URL"

var streamSeq atomic.Int64

func TestStore_Conformance(t *testing.T) {
	srv := startServer(t, t.TempDir())
	js := connect(t, srv)
	storetest.RunSuite(t, func(t *testing.T) statestore.Store { return openUnique(t, js) })
}

// TestStore_ConformanceExternal runs the suite against the server named by
// SIDECAR_TEST_NATS_URL. When the variable is set, an unreachable server
// fails the test.
func TestStore_ConformanceExternal(t *testing.T) {
	url := os.Getenv(envNATSURL)
	if url == "" {
		t.Skip(envNATSURL + " not set")
	}
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("%s=%s was asked for but is not reachable: %v", envNATSURL, url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(context.Background()); err != nil {
		t.Fatalf("%s=%s has no JetStream: %v", envNATSURL, url, err)
	}
	storetest.RunSuite(t, func(t *testing.T) statestore.Store { return openUnique(t, js) })
}

func TestOpen_StreamConfig(t *testing.T) {
	ctx := context.Background()
	js := connect(t, startServer(t, t.TempDir()))

	t.Run("OK", func(t *testing.T) {
		s, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		if s.Stream() != natsstore.DefaultStream {
			t.Fatalf("stream: got %s want %s", s.Stream(), natsstore.DefaultStream)
		}
		st, err := js.Stream(ctx, natsstore.DefaultStream)
		if err != nil {
			t.Fatal(err)
		}
		c := st.CachedInfo().Config
		if c.MaxMsgsPerSubject != 1 || c.Discard != jetstream.DiscardNew || !c.DiscardNewPerSubject ||
			!c.DenyDelete || !c.DenyPurge || !c.AllowDirect || c.Storage != jetstream.FileStorage || c.Replicas != 1 ||
			len(c.Subjects) != 1 || c.Subjects[0] != natsstore.DefaultSubjectPrefix+".>" {
			t.Fatalf("stream config: %+v", c)
		}
		// Opening again (another sidecar start) keeps the stream.
		s2, err := natsstore.Open(ctx, js, natsstore.Options{})
		if err != nil {
			t.Fatalf("second open: %v", err)
		}
		_ = s2.Close()
	})

	t.Run("BadNames", func(t *testing.T) {
		for _, o := range []natsstore.Options{
			{Stream: "a.b"}, {Stream: "a b"}, {Stream: strings.Repeat("S", natsstore.MaxNameBytes+1)},
			{SubjectPrefix: "a.*"}, {SubjectPrefix: "a.>"}, {SubjectPrefix: "a..b"}, {SubjectPrefix: ".a"}, {SubjectPrefix: "a b"},
		} {
			if _, err := natsstore.Open(ctx, js, o); err == nil {
				t.Errorf("Open(%+v) succeeded", o)
			}
		}
	})
}

func TestRunToken(t *testing.T) {
	for _, id := range storetest.AwkwardRunIDs() {
		tok := natsstore.RunToken(id)
		if strings.Trim(tok, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
			t.Errorf("RunToken(%q) = %q has characters outside base64url", id, tok)
		}
		back, err := natsstore.ParseRunToken(tok)
		if err != nil || back != id {
			t.Errorf("ParseRunToken(RunToken(%q)) = %q, %v", id, back, err)
		}
	}
	if _, err := natsstore.ParseRunToken("a.b"); err == nil {
		t.Error("ParseRunToken accepted a dot")
	}
}

func TestStore_IdentifierLength(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, t.TempDir())
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	s := openUnique(t, js)

	t.Run("TooLong", func(t *testing.T) {
		w := storetest.Event(strings.Repeat("r", statestore.MaxIDBytes+1), statestore.RunStarted, "")
		_, err := s.Append(ctx, w)
		if errcode.CodeOf(err) != statestore.CodeSchemaValidationFailed {
			t.Fatalf("got %v, want %s", err, statestore.CodeSchemaValidationFailed)
		}
		for _, id := range []string{w.RunID, ""} {
			if recs, err := s.Fetch(ctx, id, 0, 0); err != nil || len(recs) != 0 {
				t.Fatalf("fetch of runId %q: %d records, %v", id, len(recs), err)
			}
		}
		if !nc.IsConnected() {
			t.Fatal("connection closed")
		}
		mustAppend(t, s, storetest.Event("after-too-long", statestore.RunStarted, ""))
	})

	t.Run("LongestUnicode", func(t *testing.T) {
		id := strings.Repeat("日", statestore.MaxIDBytes/3) + "a" // 85*3 + 1 bytes
		if len(id) != statestore.MaxIDBytes {
			t.Fatalf("test runId is %d bytes", len(id))
		}
		var last int64
		for _, typ := range []string{statestore.RunStarted, statestore.RunCompleted} {
			w := storetest.Event(id, typ, "")
			res := mustAppend(t, s, w)
			if res.RunSeq <= last {
				t.Fatalf("runSeq %d after %d", res.RunSeq, last)
			}
			last = res.RunSeq
			rec, err := s.Lookup(ctx, id, w.IdempotencyKey)
			if err != nil || rec.RunSeq != res.RunSeq || rec.RunID != id {
				t.Fatalf("lookup: %+v, %v", rec, err)
			}
		}
		recs, err := s.Fetch(ctx, id, 0, 0)
		if err != nil || len(recs) != 2 {
			t.Fatalf("fetch: %d records, %v", len(recs), err)
		}
		if !nc.IsConnected() {
			t.Fatal("connection closed")
		}
	})
}

func TestStore_Lookup(t *testing.T) {
	ctx := context.Background()
	s := openUnique(t, connect(t, startServer(t, t.TempDir())))
	w := storetest.Event("run.with.dots", statestore.RunStarted, "")
	res := mustAppend(t, s, w)

	t.Run("OK", func(t *testing.T) {
		rec, err := s.Lookup(ctx, w.RunID, w.IdempotencyKey)
		if err != nil {
			t.Fatal(err)
		}
		if rec.EventID != w.EventID || rec.RunSeq != res.RunSeq || rec.PersistedAt != res.PersistedAt {
			t.Fatalf("got %+v, want %+v", rec, res)
		}
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		other := storetest.Event(w.RunID, statestore.RunCompleted, "")
		for _, c := range []struct{ run, key string }{
			{w.RunID, other.IdempotencyKey},
			{"run.with", w.IdempotencyKey},
			{w.RunID, ">"},
			{w.RunID, strings.ToUpper(w.IdempotencyKey)},
			{"", w.IdempotencyKey},
		} {
			if _, err := s.Lookup(ctx, c.run, c.key); !errors.Is(err, statestore.ErrNotFound) {
				t.Errorf("Lookup(%q, %q): got %v, want ErrNotFound", c.run, c.key, err)
			}
		}
	})
}

func TestStore_DenyDeleteAndPurge(t *testing.T) {
	ctx := context.Background()
	js := connect(t, startServer(t, t.TempDir()))
	s := openUnique(t, js)
	w := storetest.Event("run-del", statestore.RunStarted, "")
	res := mustAppend(t, s, w)
	st, err := js.Stream(ctx, s.Stream())
	if err != nil {
		t.Fatal(err)
	}
	// nats.go wraps a refused delete as ErrMsgDeleteUnsuccessful (code 10057
	// in the text only); a refused purge is the API error 10110.
	for name, del := range map[string]func() error{
		"DeleteMsg":       func() error { return st.DeleteMsg(ctx, uint64(res.RunSeq)) },
		"SecureDeleteMsg": func() error { return st.SecureDeleteMsg(ctx, uint64(res.RunSeq)) },
	} {
		if err := del(); !errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
			t.Errorf("%s: got %v, want ErrMsgDeleteUnsuccessful", name, err)
		}
	}
	for name, purge := range map[string]func() error{
		"Purge":        func() error { return st.Purge(ctx) },
		"PurgeSubject": func() error { return st.Purge(ctx, jetstream.WithPurgeSubject(">")) },
	} {
		var apiErr *jetstream.APIError
		if err := purge(); !errors.As(err, &apiErr) || apiErr.ErrorCode != 10110 {
			t.Errorf("%s: got %v, want API error 10110", name, err)
		}
	}
	// Turning the protection off is refused as well.
	cfg := st.CachedInfo().Config
	cfg.DenyDelete, cfg.DenyPurge = false, false
	if _, err := js.UpdateStream(ctx, cfg); err == nil {
		t.Error("UpdateStream lifted DenyDelete/DenyPurge")
	}
	if recs := mustFetch(t, s, w.RunID); len(recs) != 1 || recs[0].RunSeq != res.RunSeq {
		t.Fatalf("after delete and purge attempts: %+v", recs)
	}
}

func TestStore_Restart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv := startServer(t, dir)
	js := connect(t, srv)
	s, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var want []statestore.AppendResult
	for i := 0; i < 20; i++ {
		want = append(want, mustAppend(t, s, storetest.Event("run-restart", statestore.StepStarted, fmt.Sprintf("s%d", i))))
		mustAppend(t, s, storetest.Event(fmt.Sprintf("other-%d", i), statestore.RunStarted, ""))
	}
	js.Conn().Close()
	srv.Shutdown()
	srv.WaitForShutdown()

	srv2 := startServer(t, dir)
	js2 := connect(t, srv2)
	s2, err := natsstore.Open(ctx, js2, natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	recs := mustFetch(t, s2, "run-restart")
	if len(recs) != len(want) {
		t.Fatalf("got %d records after restart, want %d", len(recs), len(want))
	}
	for i, r := range recs {
		if r.EventID != want[i].EventID || r.RunSeq != want[i].RunSeq || r.PersistedAt != want[i].PersistedAt {
			t.Fatalf("record %d: got %s/%d/%s, want %+v", i, r.EventID, r.RunSeq, r.PersistedAt, want[i])
		}
	}
	next := mustAppend(t, s2, storetest.Event("run-restart", statestore.StepStarted, "after"))
	if next.RunSeq <= want[len(want)-1].RunSeq {
		t.Fatalf("runSeq after restart %d, not above %d", next.RunSeq, want[len(want)-1].RunSeq)
	}
	// A duplicate of a record from before the restart is still refused.
	dup := mustAppend(t, s2, storetest.Event("run-restart", statestore.StepStarted, "s3"))
	if !dup.Idempotent || dup.RunSeq != want[3].RunSeq {
		t.Fatalf("duplicate after restart: %+v, want runSeq %d idempotent", dup, want[3].RunSeq)
	}
}

// TestStore_Snapshot checks that gappy runSeqs project without STALE or
// resync.
func TestStore_Snapshot(t *testing.T) {
	ctx := context.Background()
	s := openUnique(t, connect(t, startServer(t, t.TempDir())))
	var last statestore.AppendResult
	for _, e := range []struct{ typ, step string }{
		{statestore.RunStarted, ""}, {statestore.StepStarted, "a"}, {statestore.StepCompleted, "a"}, {statestore.RunCompleted, ""},
	} {
		last = mustAppend(t, s, storetest.Event("run-gappy", e.typ, e.step))
		mustAppend(t, s, storetest.Event("noise-"+e.typ, statestore.RunStarted, ""))
		if _, err := s.ProjectSnapshot(ctx, "run-gappy"); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := s.GetSnapshot(ctx, "run-gappy")
	if err != nil {
		t.Fatal(err)
	}
	if snap.Status != statestore.RunStatusCompleted || snap.Stale || snap.Inconsistent || snap.LastEventSeq != last.RunSeq {
		t.Fatalf("snapshot: status %s stale %v inconsistent %v watermark %d (want %d)",
			snap.Status, snap.Stale, snap.Inconsistent, snap.LastEventSeq, last.RunSeq)
	}
}

func TestStore_Unavailable(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, t.TempDir())
	s, err := natsstore.Open(ctx, connect(t, srv), natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	w := storetest.Event("run-down", statestore.RunStarted, "")
	mustAppend(t, s, w)
	srv.Shutdown()
	srv.WaitForShutdown()

	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := s.Append(cctx, storetest.Event("run-down", statestore.RunCompleted, "")); !errors.Is(err, statestore.ErrUnavailable) {
		t.Errorf("Append: got %v, want ErrUnavailable", err)
	}
	if _, err := s.Fetch(cctx, "run-down", 0, 0); !errors.Is(err, statestore.ErrUnavailable) {
		t.Errorf("Fetch: got %v, want ErrUnavailable", err)
	}
	if _, err := s.Lookup(cctx, "run-down", w.IdempotencyKey); !errors.Is(err, statestore.ErrUnavailable) {
		t.Errorf("Lookup: got %v, want ErrUnavailable", err)
	}
}

func startServer(t testing.TB, dir string) *natsstore.Embedded {
	t.Helper()
	srv, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: dir, Logger: zaptest.NewLogger(t), Permissions: natsstore.AllPermissions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

func connect(t testing.TB, srv *natsstore.Embedded) jetstream.JetStream {
	t.Helper()
	return natstest.Connect(t, srv)
}

// openUnique opens a store on a stream and prefix of its own and deletes the
// stream when the test ends.
func openUnique(t testing.TB, js jetstream.JetStream) *natsstore.Store {
	t.Helper()
	n := streamSeq.Add(1)
	name := fmt.Sprintf("TEST_%d_%d", os.Getpid(), n)
	s, err := natsstore.Open(context.Background(), js, natsstore.Options{
		Stream:        name,
		SubjectPrefix: fmt.Sprintf("test.%d.%d", os.Getpid(), n),
		Logger:        zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if err := js.DeleteStream(context.Background(), name); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			t.Logf("delete stream %s: %v", name, err)
		}
	})
	return s
}

func mustAppend(t testing.TB, s statestore.Store, w *statestore.RunEventWrite) statestore.AppendResult {
	t.Helper()
	res, err := s.Append(context.Background(), w)
	if err != nil {
		t.Fatalf("append %s %s: %v", w.EventType, w.StepID, err)
	}
	return res
}

func mustFetch(t testing.TB, s statestore.Store, runID string) []statestore.RunEventRecord {
	t.Helper()
	recs, err := s.Fetch(context.Background(), runID, 0, 0)
	if err != nil {
		t.Fatalf("fetch %q: %v", runID, err)
	}
	return recs
}

// TestStore_AppendedNotifications checks where persistedAt comes from: the
// stream's appended notification, also with a second store appending on
// the same stream over another connection; and the read-back after Close.
func TestStore_AppendedNotifications(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, t.TempDir())
	core, logs := observer.New(zap.DebugLevel)
	opts := natsstore.Options{Stream: "NOTIFY", SubjectPrefix: "notify", Logger: zap.New(core)}
	s1, err := natsstore.Open(ctx, connect(t, srv), opts)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := natsstore.Open(ctx, connect(t, srv), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	readBacks := func() int {
		return logs.FilterMessageSnippet("reading the message back").Len()
	}

	t.Run("OK", func(t *testing.T) {
		var wg sync.WaitGroup
		results := make([]statestore.AppendResult, 200)
		errs := make([]error, len(results))
		for i := range results {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				s := []*natsstore.Store{s1, s2}[i%2]
				results[i], errs[i] = s.Append(ctx, storetest.Event(fmt.Sprintf("run-%d", i%7), statestore.StepStarted, fmt.Sprint(i)))
			}(i)
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("append %d: %v", i, err)
			}
		}
		if n := readBacks(); n != 0 {
			t.Fatalf("%d appends read their message back, want 0", n)
		}
		checkAgainstFetch(t, s1, results)
	})

	t.Run("ReadBackAfterClose", func(t *testing.T) {
		if err := s1.Close(); err != nil {
			t.Fatal(err)
		}
		res := mustAppend(t, s1, storetest.Event("run-closed", statestore.RunStarted, ""))
		if n := readBacks(); n != 1 {
			t.Fatalf("%d appends read their message back, want 1", n)
		}
		checkAgainstFetch(t, s1, []statestore.AppendResult{res})
	})
}

// checkAgainstFetch asserts that every result's runSeq and persistedAt are
// those of a stored record.
func checkAgainstFetch(t *testing.T, s *natsstore.Store, results []statestore.AppendResult) {
	t.Helper()
	byID := map[string]statestore.AppendResult{}
	for _, r := range results {
		byID[r.EventID] = r
	}
	found := 0
	for _, runID := range []string{"run-0", "run-1", "run-2", "run-3", "run-4", "run-5", "run-6", "run-closed"} {
		for _, rec := range mustFetch(t, s, runID) {
			r, ok := byID[rec.EventID]
			if !ok {
				continue
			}
			found++
			if r.RunSeq != rec.RunSeq || r.PersistedAt != rec.PersistedAt {
				t.Fatalf("append result %d/%s, stored %d/%s", r.RunSeq, r.PersistedAt, rec.RunSeq, rec.PersistedAt)
			}
		}
	}
	if found != len(byID) {
		t.Fatalf("found %d of %d appended records", found, len(byID))
	}
}

// TestStore_StreamFull checks that a refusal sharing the duplicate's error
// code (10077) is not mistaken for a duplicate.
func TestStore_StreamFull(t *testing.T) {
	ctx := context.Background()
	js := connect(t, startServer(t, t.TempDir()))
	s := openUnique(t, js)
	mustAppend(t, s, storetest.Event("run-full", statestore.RunStarted, ""))
	st, err := js.Stream(ctx, s.Stream())
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgs = 1
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	res, err := s.Append(ctx, storetest.Event("run-full", statestore.RunCompleted, ""))
	if !errors.Is(err, statestore.ErrUnavailable) {
		t.Fatalf("append to a full stream: got %+v, %v, want ErrUnavailable", res, err)
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10077 {
		t.Fatalf("cause: got %v, want API error 10077", err)
	}
}

func TestStore_AppendMetrics(t *testing.T) {
	ctx := context.Background()
	js := connect(t, startServer(t, t.TempDir()))
	reg := prometheus.NewRegistry()
	s, err := natsstore.Open(ctx, js, natsstore.Options{Metrics: statestore.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	w := storetest.Event("run-metrics", statestore.RunStarted, "")
	mustAppend(t, s, w)
	if _, err := s.Append(ctx, w); err != nil { // the same event again: a duplicate
		t.Fatal(err)
	}
	bad := storetest.Event("run-metrics", statestore.StepStarted, "")
	if _, err := s.Append(ctx, bad); !errors.Is(err, statestore.ErrSchemaValidation) {
		t.Fatalf("step event without stepId: %v", err)
	}
	want := `
# HELP sidecar_store_appends_total Appends to the event log by result: persisted, duplicate (the key was stored already; the existing record is returned), rejected (SCHEMA_VALIDATION_FAILED or INVALID_TRANSITION, nothing written), error (store unavailable).
# TYPE sidecar_store_appends_total counter
sidecar_store_appends_total{result="duplicate"} 1
sidecar_store_appends_total{result="error"} 0
sidecar_store_appends_total{result="persisted"} 1
sidecar_store_appends_total{result="rejected"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sidecar_store_appends_total"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "sidecar_store_append_duration_seconds"); err != nil || n != 1 {
		t.Fatalf("append latency histogram: %d series, %v", n, err)
	}
}
