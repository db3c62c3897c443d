package natsstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestStore_TailFetchStaysFlat: a projector reads a run's records after
// its watermark after every append (a gated task reads its run two or
// three times), so what such a read asks of the server must not grow with
// the run. The direct get requests that reach the real server are counted
// by a second connection subscribed to the stream's direct get subjects,
// for one new record after the watermark of a run of 10 records and of
// one past multi_last's 1,024 subjects.
func TestStore_TailFetchStaysFlat(t *testing.T) {
	srv := startServer(t, t.TempDir())
	s := openUnique(t, connect(t, srv))
	requests := watchRequests(t, connect(t, srv).Conn(), "$JS.API.DIRECT.GET."+s.Stream(), "$JS.API.DIRECT.GET."+s.Stream()+".>")
	small := len(readNewest(t, s, requests, "run-small", 10, 0))
	big := len(readNewest(t, s, requests, "run-big", 1100, 0))
	if big != small || big > 2 {
		t.Fatalf("reading one new record made %d direct get requests for a run of 10 records and %d for one of 1,100: want the same, at most 2", small, big)
	}
}

// TestStore_TailFetchOfABusyStreamReadsTheIndex: with many runs in flight
// a run's records are far apart in the stream, and the server finds a
// next_by_subj match by scanning every message after the sequence (the
// one that finds nothing new scans to the end). A read after a watermark
// that far behind the stream's end must ask the run's subject index
// (multi_last) instead; one just behind it still reads the tail.
func TestStore_TailFetchOfABusyStreamReadsTheIndex(t *testing.T) {
	srv := startServer(t, t.TempDir())
	s := openUnique(t, connect(t, srv))
	requests := watchRequests(t, connect(t, srv).Conn(), "$JS.API.DIRECT.GET."+s.Stream())
	for _, m := range readNewest(t, s, requests, "run-busy", 5, 1000) {
		if strings.Contains(string(m.Data), "next_by_subj") {
			t.Errorf("a read 1,000 messages behind the stream's end scanned the stream: %s", m.Data)
		}
	}
	scanned := false
	for _, m := range readNewest(t, s, requests, "run-quiet", 5, 3) {
		scanned = scanned || strings.Contains(string(m.Data), "next_by_subj")
	}
	if !scanned {
		t.Error("a read 3 messages behind the stream's end did not read the tail")
	}
}

// TestStore_TailFetchKnowsOtherReplicasAppends: with several replicas on
// one stream each Store appends only part of it, so its own appends do
// not say how far a watermark lies behind the stream's end. A read of the
// subject index reports the stream's last sequence, and what a read
// returns is stored: a Store learns the end from its reads too. Here a
// second Store (another replica) appends 1,000 records of other runs; the
// first reads one run whole, then reads another after a watermark from
// before those appends, and must ask the subject index, not scan.
func TestStore_TailFetchKnowsOtherReplicasAppends(t *testing.T) {
	srv := startServer(t, t.TempDir())
	a := openUnique(t, connect(t, srv))
	b, err := natsstore.Open(context.Background(), connect(t, srv), natsstore.Options{
		Stream: a.Stream(), SubjectPrefix: a.SubjectPrefix(), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	requests := watchRequests(t, connect(t, srv).Conn(), "$JS.API.DIRECT.GET."+a.Stream())
	last := mustAppend(t, a, storetest.Event("run-watched", statestore.StepStarted, "s1")).RunSeq
	mustAppend(t, a, storetest.Event("run-read", statestore.RunStarted, ""))
	for i := 0; i < 1000; i++ {
		mustAppend(t, b, storetest.Event(fmt.Sprintf("other-%d", i), statestore.RunStarted, ""))
	}
	next := mustAppend(t, b, storetest.Event("run-watched", statestore.StepStarted, "s2")).RunSeq
	if recs, err := a.Fetch(context.Background(), "run-read", 0, 0); err != nil || len(recs) != 1 {
		t.Fatalf("Fetch(run-read) = %d records, %v", len(recs), err)
	}
	requests()
	recs, err := a.Fetch(context.Background(), "run-watched", last, 0)
	if err != nil || len(recs) != 1 || recs[0].RunSeq != next {
		t.Fatalf("Fetch(run-watched after %d) = %+v, %v; want the record at %d", last, recs, err, next)
	}
	for _, m := range requests() {
		if strings.Contains(string(m.Data), "next_by_subj") {
			t.Errorf("a read 1,000 messages behind the stream's end, appended by another replica, scanned the stream: %s", m.Data)
		}
	}
}

// TestStore_LatestReadAsksTheLeaderForTheRunsLast: a read that must see
// every append (statestore.WithLatest: a fence's second look) asks the
// stream leader what the direct gets did not show. The leader's walk with
// next_by_subj scans the stream from the run's last record to the end, so
// it is made only when the leader's last message of the run is past what
// was read: not for a run with nothing new among other runs' records, and
// still for one whose newest message the direct gets did not return (here
// a message on the run's subjects that is not a record of the run).
func TestStore_LatestReadAsksTheLeaderForTheRunsLast(t *testing.T) {
	ctx := statestore.WithLatest(context.Background())
	srv := startServer(t, t.TempDir())
	js := connect(t, srv)
	s := openUnique(t, js)
	requests := watchRequests(t, connect(t, srv).Conn(), "$JS.API.STREAM.MSG.GET."+s.Stream())
	walks := func() int {
		t.Helper()
		n := 0
		for _, m := range requests() {
			if strings.Contains(string(m.Data), "next_by_subj") {
				n++
			}
		}
		return n
	}
	runID := "run-idle"
	last := mustAppend(t, s, storetest.Event(runID, statestore.RunStarted, "")).RunSeq
	for i := 0; i < 300; i++ {
		mustAppend(t, s, storetest.Event(fmt.Sprintf("other-%d", i), statestore.RunStarted, ""))
	}
	walks()
	if recs, err := s.Fetch(ctx, runID, last, 0); err != nil || len(recs) != 0 {
		t.Fatalf("Fetch after the run's last record: %d records, %v", len(recs), err)
	}
	if n := walks(); n != 0 {
		t.Errorf("a run with nothing new: the leader walked the stream %d times", n)
	}

	st, err := js.Stream(context.Background(), s.Stream())
	if err != nil {
		t.Fatal(err)
	}
	prefix := strings.TrimSuffix(st.CachedInfo().Config.Subjects[0], ".>")
	if _, err := js.Publish(context.Background(), prefix+"."+natsstore.RunToken(runID)+".garbage", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	walks()
	if recs, err := s.Fetch(ctx, runID, last, 0); err != nil || len(recs) != 0 {
		t.Fatalf("Fetch with a non-record after the run's last record: %d records, %v", len(recs), err)
	}
	if n := walks(); n == 0 {
		t.Error("the leader holds a message of the run past what the direct gets returned, and was not asked for it")
	}
}

// readNewest appends size records of runID, then others records of other
// runs, then one more of runID, and reads what follows the run's
// watermark (its size-th record): that last record, or the test fails. It
// returns the requests (requests) the read made.
func readNewest(t *testing.T, s *natsstore.Store, requests func() []*nats.Msg, runID string, size, others int) []*nats.Msg {
	t.Helper()
	var last int64
	for i := 0; i < size; i++ {
		last = mustAppend(t, s, storetest.Event(runID, statestore.StepStarted, fmt.Sprintf("s%05d", i))).RunSeq
	}
	for i := 0; i < others; i++ {
		mustAppend(t, s, storetest.Event(fmt.Sprintf("%s-other-%d", runID, i), statestore.RunStarted, ""))
	}
	next := mustAppend(t, s, storetest.Event(runID, statestore.StepStarted, "next")).RunSeq
	requests()
	recs, err := s.Fetch(context.Background(), runID, last, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].RunSeq != next {
		t.Fatalf("Fetch(%s after %d) = %d records, want the one at %d", runID, last, len(recs), next)
	}
	return requests()
}

// watchRequests subscribes nc to subjects (the API requests of a server
// whose user may watch them) and returns a function that hands over every
// request sent since its last call.
func watchRequests(t *testing.T, nc *nats.Conn, subjects ...string) func() []*nats.Msg {
	t.Helper()
	var subs []*nats.Subscription
	for _, subj := range subjects {
		sub, err := nc.SubscribeSync(subj)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() []*nats.Msg {
		t.Helper()
		if err := nc.Flush(); err != nil { // every copy sent before now has arrived
			t.Fatal(err)
		}
		var out []*nats.Msg
		for _, sub := range subs {
			for {
				m, err := sub.NextMsg(0)
				if err != nil {
					break
				}
				out = append(out, m)
			}
		}
		return out
	}
}

// BenchmarkTailFetch reads the one record after the watermark of runs of
// 10, 500 and 1,100 records (a projector catching up on a gated task's
// event): the cost should not grow with the run.
func BenchmarkTailFetch(b *testing.B) {
	ctx := context.Background()
	s := benchStore(b, benchServer(b, 2*time.Minute))
	for _, size := range []int{10, 500, 1100} {
		runID := fmt.Sprintf("run-%d", size)
		var seqs []int64
		for i := 0; i <= size; i++ {
			res, err := s.Append(ctx, storetest.Event(runID, statestore.StepStarted, fmt.Sprintf("s%05d", i)))
			if err != nil {
				b.Fatal(err)
			}
			seqs = append(seqs, res.RunSeq)
		}
		b.Run(fmt.Sprintf("run=%d", size), func(b *testing.B) {
			benchFetch(b, s, runID, seqs[len(seqs)-2], 1)
		})
	}
}

// BenchmarkTailFetchBusyStream reads the one record after the watermark
// of a run of 20 records while other runs appended n records between the
// run's last two (serve with n runs in flight: each of its records is
// followed by the others'): what the read costs the server should follow
// the run, not how much of the stream lies after the watermark. CPU is the
// process's (the embedded server is in it).
func BenchmarkTailFetchBusyStream(b *testing.B) {
	s := benchStore(b, benchServer(b, 2*time.Minute))
	for _, others := range []int{16, 256, 2048, 16384} {
		runID := fmt.Sprintf("run-%d", others)
		var last int64
		for i := 0; i < 20; i++ {
			last = mustAppend(b, s, storetest.Event(runID, statestore.StepStarted, fmt.Sprintf("s%05d", i))).RunSeq
		}
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < others; i += 16 {
					mustAppend(b, s, storetest.Event(fmt.Sprintf("%s-other-%d", runID, i), statestore.RunStarted, ""))
				}
			}()
		}
		wg.Wait()
		mustAppend(b, s, storetest.Event(runID, statestore.StepStarted, "next"))
		b.Run(fmt.Sprintf("others=%d", others), func(b *testing.B) {
			benchFetch(b, s, runID, last, 1)
		})
		// A read that must see every append (statestore.WithLatest) of a
		// run with nothing new while the others' records follow its last.
		idle := fmt.Sprintf("%s-idle", runID)
		lastIdle := mustAppend(b, s, storetest.Event(idle, statestore.RunStarted, "")).RunSeq
		for i := 0; i < others; i++ {
			mustAppend(b, s, storetest.Event(fmt.Sprintf("%s-later-%d", runID, i), statestore.RunStarted, ""))
		}
		b.Run(fmt.Sprintf("others=%d/latest-nothing-new", others), func(b *testing.B) {
			ctx := statestore.WithLatest(context.Background())
			for i := 0; i < b.N; i++ {
				recs, err := s.Fetch(ctx, idle, lastIdle, 0)
				if err != nil || len(recs) != 0 {
					b.Fatalf("got %d records (%v), want none", len(recs), err)
				}
			}
		})
	}
}
