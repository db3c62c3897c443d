package natsstore_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestStore_FetchPaging checks afterSeq and limit on both read paths: a run
// within multi_last's 1,024 subjects and one past it, interleaved with other
// runs, and pages that the server cuts short by bytes.
func TestStore_FetchPaging(t *testing.T) {
	ctx := context.Background()
	js := connect(t, startServer(t, t.TempDir()))
	s := openUnique(t, js)
	publishRun := func(runID string, n, payloadBytes int) []int64 {
		t.Helper()
		var seqs []int64
		for i := 0; i < n; i++ {
			w := storetest.Event(runID, statestore.StepStarted, fmt.Sprintf("s%05d", i))
			if payloadBytes > 0 {
				storetest.WithPayload(w, map[string]string{"blob": strings.Repeat("x", payloadBytes)})
			}
			seqs = append(seqs, mustAppend(t, s, w).RunSeq)
			if i%3 == 0 {
				mustAppend(t, s, storetest.Event(fmt.Sprintf("%s-noise-%d", runID, i), statestore.RunStarted, ""))
			}
		}
		return seqs
	}
	check := func(t *testing.T, runID string, seqs []int64, after int64, limit int) {
		t.Helper()
		var want []int64
		for _, q := range seqs {
			if q > after && (limit <= 0 || len(want) < limit) {
				want = append(want, q)
			}
		}
		recs, err := s.Fetch(ctx, runID, after, limit)
		if err != nil {
			t.Fatalf("Fetch(after %d, limit %d): %v", after, limit, err)
		}
		if len(recs) != len(want) {
			t.Fatalf("Fetch(after %d, limit %d): got %d records, want %d", after, limit, len(recs), len(want))
		}
		for i, r := range recs {
			if r.RunSeq != want[i] || r.RunID != runID {
				t.Fatalf("Fetch(after %d, limit %d): record %d is %q/%d, want %d", after, limit, i, r.RunID, r.RunSeq, want[i])
			}
		}
	}
	cases := func(t *testing.T, runID string, seqs []int64) {
		n := len(seqs)
		for _, c := range []struct {
			after int64
			limit int
		}{
			{0, 0}, {0, 1}, {0, n - 1}, {0, n}, {0, n + 10}, {-1, 0},
			{seqs[0], 0}, {seqs[n/2], 0}, {seqs[n/2] + 1, 7}, {seqs[n-2], 0}, {seqs[n-1], 0}, {seqs[n-1] + 100, 0},
			{seqs[n/3], 1000}, {seqs[n/3], 1025},
		} {
			check(t, runID, seqs, c.after, c.limit)
		}
	}

	t.Run("MultiLast", func(t *testing.T) {
		cases(t, "run-small", publishRun("run-small", 300, 0))
	})
	t.Run("Buckets", func(t *testing.T) {
		// Past multi_last's 1,024 cap: read bucket by bucket.
		cases(t, "run-big", publishRun("run-big", 1500, 0))
	})
	t.Run("BucketWalk", func(t *testing.T) {
		// 1,100 events whose keys all start with "0": one bucket past the
		// cap, read with the next_by_subj walk.
		var seqs []int64
		for i := 0; len(seqs) < 1100; i++ {
			w := storetest.Event("run-one-bucket", statestore.StepStarted, fmt.Sprintf("s%06d", i))
			if w.IdempotencyKey[0] != '0' {
				continue
			}
			seqs = append(seqs, mustAppend(t, s, w).RunSeq)
			if len(seqs)%100 == 0 {
				mustAppend(t, s, storetest.Event(fmt.Sprintf("noise-%d", i), statestore.RunStarted, ""))
			}
		}
		cases(t, "run-one-bucket", seqs)
	})
	t.Run("ByteLimitedPages", func(t *testing.T) {
		// 200 events of ~60 KB exceed the 8 MiB a response may carry.
		seqs := publishRun("run-heavy", 200, 60<<10)
		check(t, "run-heavy", seqs, 0, 0)
		check(t, "run-heavy", seqs, seqs[10], 150)
	})
}

// TestStore_ForgedHeaders publishes around Append, straight onto the
// stream's subjects, with Nats-* headers of its own.
func TestStore_ForgedHeaders(t *testing.T) {
	ctx := context.Background()
	js := connect(t, startServer(t, t.TempDir()))
	s := openUnique(t, js)
	st, err := js.Stream(ctx, s.Stream())
	if err != nil {
		t.Fatal(err)
	}
	prefix := strings.TrimSuffix(st.CachedInfo().Config.Subjects[0], ".>")
	runID := "run.forged"
	mustAppend(t, s, storetest.Event(runID, statestore.RunStarted, ""))

	w := storetest.Event(runID, statestore.StepStarted, "a")
	subj := natsstore.EventSubject(prefix, runID, w.IdempotencyKey)
	body := fmt.Sprintf(`{"eventId":%q,"eventType":%q,"emittedAt":%q,"runId":%q,"tenantId":"t","projectId":"p","environmentId":"e","planId":%q,"planVersion":%q,"engineAttemptId":1,"logicalAttemptId":1,"idempotencyKey":%q,"stepId":"a"}`,
		w.EventID, w.EventType, w.EmittedAt, w.RunID, w.PlanID, w.PlanVersion, w.IdempotencyKey)
	forged := nats.Header{}
	forged.Set("Nats-Sequence", "1")
	forged.Set("Nats-Time-Stamp", "2000-01-01T00:00:00Z")
	forged.Set("Nats-Subject", subj)
	forged.Set("Status", "204")
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: forged, Data: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	// Garbage on the run's subjects: not JSON, and another run's record.
	if _, err := js.Publish(ctx, prefix+"."+natsstore.RunToken(runID)+".garbage", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	other := storetest.Event("run-other", statestore.RunStarted, "")
	otherBody := fmt.Sprintf(`{"eventId":%q,"eventType":"RunStarted","runId":"run-other","idempotencyKey":%q}`, other.EventID, other.IdempotencyKey)
	if _, err := js.Publish(ctx, natsstore.EventSubject(prefix, runID, other.IdempotencyKey), []byte(otherBody)); err != nil {
		t.Fatal(err)
	}
	last := mustAppend(t, s, storetest.Event(runID, statestore.RunCompleted, ""))

	recs := mustFetch(t, s, runID)
	if len(recs) != 3 || recs[2].RunSeq != last.RunSeq {
		t.Fatalf("got %d records %+v, want RunStarted, the forged StepStarted and RunCompleted", len(recs), recs)
	}
	got := recs[1]
	if got.RunSeq != int64(ack.Sequence) {
		t.Fatalf("runSeq: got %d, want the server's %d", got.RunSeq, ack.Sequence)
	}
	if at, err := time.Parse(time.RFC3339Nano, got.PersistedAt); err != nil || time.Since(at) > time.Minute {
		t.Fatalf("persistedAt: got %q, want the server's clock", got.PersistedAt)
	}
	dup := mustAppend(t, s, w)
	if !dup.Idempotent || dup.RunSeq != int64(ack.Sequence) || dup.PersistedAt != got.PersistedAt {
		t.Fatalf("duplicate of the forged record: got %+v, want runSeq %d persistedAt %s", dup, ack.Sequence, got.PersistedAt)
	}
	rec, err := s.Lookup(ctx, runID, w.IdempotencyKey)
	if err != nil || rec.RunSeq != int64(ack.Sequence) {
		t.Fatalf("lookup: %+v, %v", rec, err)
	}
}

// slowLink is the client's in-process link to the server with every write
// of the client held back by delay once delay is set: a slow network, or
// a server that takes a while to answer each request.
type slowLink struct {
	srv   *natsstore.Embedded
	delay atomic.Int64 // nanoseconds
	// readDelay holds back every read of the client once set: a page
	// that arrives slowly, or a client too busy to take it faster.
	readDelay atomic.Int64 // nanoseconds
}

func (l *slowLink) InProcessConn() (net.Conn, error) {
	c, err := l.srv.Server.InProcessConn()
	if err != nil {
		return nil, err
	}
	return &slowConn{Conn: c, delay: &l.delay, readDelay: &l.readDelay}, nil
}

type slowConn struct {
	net.Conn
	delay, readDelay *atomic.Int64
}

func (c *slowConn) Read(b []byte) (int, error) {
	time.Sleep(time.Duration(c.readDelay.Load()))
	return c.Conn.Read(b)
}

func (c *slowConn) Write(b []byte) (int, error) {
	time.Sleep(time.Duration(c.delay.Load()))
	return c.Conn.Write(b)
}

// TestStore_FetchTimeoutPerRequest: the store's timeout bounds each request
// of a Fetch, not the whole read. A run past multi_last's 1,024 subjects is
// read with 17 requests (the refused multi_last and one per bucket); each
// waits 250 ms on the link, so the whole read takes more than the 3 s
// timeout while every request stays well inside it.
func TestStore_FetchTimeoutPerRequest(t *testing.T) {
	srv := startServer(t, t.TempDir())
	link := &slowLink{srv: srv}
	nc, err := srv.Connect(nats.InProcessServer(link))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s := openUnique(t, js)
	var seqs []int64
	for i := range 1100 {
		seqs = append(seqs, mustAppend(t, s, storetest.Event("run-slow-link", statestore.StepStarted, fmt.Sprintf("s%05d", i))).RunSeq)
	}
	link.delay.Store(int64(250 * time.Millisecond))
	recs, err := s.Fetch(context.Background(), "run-slow-link", 0, 0)
	link.delay.Store(0)
	if err != nil {
		t.Fatalf("Fetch of %d events over a slow link: %v", len(seqs), err)
	}
	if len(recs) != len(seqs) || recs[0].RunSeq != seqs[0] || recs[len(recs)-1].RunSeq != seqs[len(seqs)-1] {
		t.Fatalf("Fetch over a slow link: %d records, want %d", len(recs), len(seqs))
	}
}

// TestStore_FetchSlowPage: the store's timeout is how long a Fetch waits
// for the server's next message, not how long one page may take to arrive
// and be decoded. 12 MiB of events come in two 8 MiB-capped pages; with
// every read of the client held back 15 ms, a page (at least 256 reads of
// at most 32 KiB) takes more than the 2 s timeout, while the next message
// is never more than a few reads away.
func TestStore_FetchSlowPage(t *testing.T) {
	srv := startServer(t, t.TempDir())
	link := &slowLink{srv: srv}
	nc, err := srv.Connect(nats.InProcessServer(link))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s := openUnique(t, js)
	var seqs []int64
	for i := range 200 {
		w := storetest.Event("run-slow-page", statestore.StepStarted, fmt.Sprintf("s%05d", i))
		storetest.WithPayload(w, map[string]string{"blob": strings.Repeat("x", 60<<10)})
		seqs = append(seqs, mustAppend(t, s, w).RunSeq)
	}
	link.readDelay.Store(int64(15 * time.Millisecond))
	recs, err := s.Fetch(context.Background(), "run-slow-page", 0, 0)
	link.readDelay.Store(0)
	if err != nil {
		t.Fatalf("Fetch of %d events of 60 KiB over a slow link: %v", len(seqs), err)
	}
	if len(recs) != len(seqs) || recs[0].RunSeq != seqs[0] || recs[len(recs)-1].RunSeq != seqs[len(seqs)-1] {
		t.Fatalf("Fetch over a slow link: %d records, want %d", len(recs), len(seqs))
	}
}

// TestStore_UnansweredRequestFailsWithinTheTimeout: a read or an append
// whose request the server never answers fails within the store's
// timeout, whatever the caller's context: one without a deadline (a
// worker's, a request's) and one whose deadline is an hour away.
// Otherwise the read waits for good, or for the hour, and with it every
// projection of the run that waits for its fetch (a replica's runs stop
// after a NATS node that held a request is killed); an append likewise
// holds its step, and its run's writes behind it, for the hour.
func TestStore_UnansweredRequestFailsWithinTheTimeout(t *testing.T) {
	srv := startServer(t, t.TempDir())
	const timeout = 300 * time.Millisecond
	js, deaf := natstest.ConnectDeaf(t, srv, jetstream.WithDefaultTimeout(timeout))
	s := openUnique(t, js)
	const runID = "run-deaf"
	var first statestore.AppendResult
	for i := range 3 {
		res := mustAppend(t, s, storetest.Event(runID, statestore.StepStarted, fmt.Sprintf("s%d", i)))
		if i == 0 {
			first = res
		}
	}
	key := storetest.Event(runID, statestore.StepStarted, "s0").IdempotencyKey
	// Every read of a run the store makes: the whole run, what follows a
	// watermark (a projector catching up), one record by key, and a read
	// that must see every append (the stream leader); and its appends.
	calls := map[string]func(context.Context, string) error{
		"whole run": func(ctx context.Context, _ string) error { _, err := s.Fetch(ctx, runID, 0, 0); return err },
		"after a watermark": func(ctx context.Context, _ string) error {
			_, err := s.Fetch(ctx, runID, first.RunSeq, 0)
			return err
		},
		"by key": func(ctx context.Context, _ string) error { _, err := s.Lookup(ctx, runID, key); return err },
		"latest": func(ctx context.Context, _ string) error {
			_, err := s.Fetch(statestore.WithLatest(ctx), runID, first.RunSeq+2, 0)
			return err
		},
		"append": func(ctx context.Context, name string) error {
			_, err := s.Append(ctx, storetest.Event(runID, statestore.StepStarted, "late-"+name))
			return err
		},
		"conditional append": func(ctx context.Context, name string) error {
			_, err := s.AppendIf(ctx, storetest.Event(runID, statestore.StepStarted, "late-if-"+name), first.RunSeq+2)
			return err
		},
	}
	deaf.Store(true)
	t.Cleanup(func() { deaf.Store(false) }) // after the parallel subtests
	storetest.UnansweredCalls(t, calls, statestore.ErrUnavailable, 100*timeout)
}
