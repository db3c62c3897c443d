package natsstore_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

var benchBig = flag.Bool("natsstore.big", false, "also run the Fetch benchmark among 1M events (slow setup)")

// envBenchBig is the environment alternative to -natsstore.big.
const envBenchBig = "NATSSTORE_BENCH_BIG"

var syncModes = []struct {
	name     string
	interval time.Duration
}{
	{"sync=always", 0},
	{"sync=2m", 2 * time.Minute}, // the nats-server default interval
}

// BenchmarkAppend compares Append with a raw synchronous JetStream publish
// of a body of the same size to a plain stream, on the same server, per
// fsync mode and concurrency. "dup" appends an existing key.
func BenchmarkAppend(b *testing.B) {
	ctx := context.Background()
	for _, mode := range syncModes {
		b.Run(mode.name, func(b *testing.B) {
			js := benchServer(b, mode.interval)
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}, Storage: jetstream.FileStorage})
			if err != nil {
				b.Fatal(err)
			}
			sample, _ := json.Marshal(storetest.Event("run-bench-000000", statestore.StepStarted, "step-000000"))
			for _, conc := range []int{1, 64} {
				b.Run(fmt.Sprintf("conc=%d/store", conc), func(b *testing.B) {
					s := benchStore(b, js)
					events := make([]*statestore.RunEventWrite, b.N)
					for i := range events {
						events[i] = storetest.Event(fmt.Sprintf("run-bench-%06d", i%1000), statestore.StepStarted, fmt.Sprintf("step-%06d", i))
					}
					storetest.Concurrently(b, conc, func(i int) error {
						res, err := s.Append(ctx, events[i])
						if err == nil && !res.Persisted {
							err = fmt.Errorf("append %d not persisted: %+v", i, res)
						}
						return err
					})
				})
				b.Run(fmt.Sprintf("conc=%d/raw", conc), func(b *testing.B) {
					base := fmt.Sprintf("raw.%d.", time.Now().UnixNano())
					storetest.Concurrently(b, conc, func(i int) error {
						_, err := js.Publish(ctx, base+fmt.Sprint(i), sample)
						return err
					})
				})
				b.Run(fmt.Sprintf("conc=%d/dup", conc), func(b *testing.B) {
					s := benchStore(b, js)
					w := storetest.Event("run-dup", statestore.StepCompleted, "a")
					if _, err := s.Append(ctx, w); err != nil {
						b.Fatal(err)
					}
					storetest.Concurrently(b, conc, func(int) error {
						res, err := s.Append(ctx, w)
						if err == nil && !res.Idempotent {
							err = fmt.Errorf("duplicate not idempotent: %+v", res)
						}
						return err
					})
				})
			}
		})
	}
}

// BenchmarkFetch reads one run of 100 events spread evenly among 100k
// events of other runs (and 1M with -natsstore.big or NATSSTORE_BENCH_BIG=1).
// "all" reads the whole run, "tail" the events after its 90th (a projector
// catching up), "big" a run of 1,500 events (past multi_last's cap: the
// stream walk).
func BenchmarkFetch(b *testing.B) {
	sizes := []int{100_000, 1_000_000}
	if testing.Short() {
		sizes = []int{2_000} // a smoke pass (CI runs every benchmark once with -short)
	}
	for _, others := range sizes {
		b.Run(fmt.Sprintf("others=%d", others), func(b *testing.B) {
			if others > 100_000 && !*benchBig && os.Getenv(envBenchBig) == "" {
				b.Skip("set -natsstore.big or " + envBenchBig + "=1 for the 1M-event setup")
			}
			js := benchServer(b, 2*time.Minute)
			s := benchStore(b, js)
			prefix := "bench." + s.Stream()
			small := loadRuns(b, js, prefix, others, "run-small", 100, "run-big", 1500)
			b.Run("all", func(b *testing.B) { benchFetch(b, s, "run-small", 0, 100) })
			b.Run("tail", func(b *testing.B) { benchFetch(b, s, "run-small", small[89], 10) })
			b.Run("big", func(b *testing.B) { benchFetch(b, s, "run-big", 0, 1500) })
		})
	}
}

func benchFetch(b *testing.B, s *natsstore.Store, runID string, after int64, want int) {
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		recs, err := s.Fetch(ctx, runID, after, 0)
		if err != nil {
			b.Fatal(err)
		}
		if len(recs) != want {
			b.Fatalf("got %d records, want %d", len(recs), want)
		}
	}
}

// loadRuns publishes others events of distinct runs with two runs of nA and
// nB events spread evenly among them, asynchronously, and returns the
// runSeqs of run A.
func loadRuns(b *testing.B, js jetstream.JetStream, prefix string, others int, runA string, nA int, runB string, nB int) []int64 {
	b.Helper()
	type pending struct {
		f   jetstream.PubAckFuture
		isA bool
	}
	var acks []pending
	publish := func(w *statestore.RunEventWrite, isA bool) {
		body, err := json.Marshal(w)
		if err != nil {
			b.Fatal(err)
		}
		subj := natsstore.EventSubject(prefix, w.RunID, w.IdempotencyKey)
		f, err := js.PublishMsgAsync(&nats.Msg{Subject: subj, Data: body})
		if err != nil {
			b.Fatal(err)
		}
		acks = append(acks, pending{f, isA})
	}
	everyA, everyB := others/nA, others/nB
	for i := 0; i < others; i++ {
		publish(storetest.Event(fmt.Sprintf("other-%07d", i), statestore.RunStarted, ""), false)
		if i%everyA == 0 && i/everyA < nA {
			publish(storetest.Event(runA, statestore.StepStarted, fmt.Sprintf("s%04d", i/everyA)), true)
		}
		if i%everyB == 0 && i/everyB < nB {
			publish(storetest.Event(runB, statestore.StepStarted, fmt.Sprintf("s%04d", i/everyB)), false)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("async publishes did not complete")
	}
	var seqs []int64
	for _, p := range acks {
		select {
		case ack := <-p.f.Ok():
			if p.isA {
				seqs = append(seqs, int64(ack.Sequence))
			}
		case err := <-p.f.Err():
			b.Fatal(err)
		}
	}
	return seqs
}

func benchServer(b *testing.B, syncInterval time.Duration) jetstream.JetStream {
	b.Helper()
	// The benchmarks use streams and subjects of their own (and the raw
	// publish baseline), which the sidecar's least-privilege user may not.
	srv, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: b.TempDir(), SyncInterval: syncInterval, Logger: zap.NewNop(), Permissions: natsstore.AllPermissions})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	return natstest.Connect(b, srv, jetstream.WithPublishAsyncMaxPending(4096))
}

var benchStreams atomic.Int64

func benchStore(b *testing.B, js jetstream.JetStream) *natsstore.Store {
	b.Helper()
	name := fmt.Sprintf("BENCH%d", benchStreams.Add(1))
	s, err := natsstore.Open(context.Background(), js, natsstore.Options{Stream: name, SubjectPrefix: "bench." + name})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkAppendPermissions measures what the sidecar user's least
// privilege (a permission check on every publish and subscription) and the
// watermark cost an append: the same Append on a server whose user has the
// sidecar's Permissions and on one whose user may do everything.
func BenchmarkAppendPermissions(b *testing.B) {
	ctx := context.Background()
	for _, mode := range syncModes {
		for _, perm := range []struct {
			name  string
			perms *server.Permissions
		}{{"least", nil}, {"all", natsstore.AllPermissions}} {
			b.Run(mode.name+"/perm="+perm.name, func(b *testing.B) {
				srv, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: b.TempDir(), SyncInterval: mode.interval, Logger: zap.NewNop(), Permissions: perm.perms})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(srv.Shutdown)
				s, err := natsstore.Open(ctx, natstest.Connect(b, srv), natsstore.Options{})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = s.Close() })
				for _, conc := range []int{1, 64} {
					b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
						prefix := fmt.Sprintf("run-perm-%d-", time.Now().UnixNano())
						events := make([]*statestore.RunEventWrite, b.N)
						for i := range events {
							events[i] = storetest.Event(fmt.Sprintf("%s%04d", prefix, i%1000), statestore.StepStarted, fmt.Sprintf("step-%06d", i))
						}
						storetest.Concurrently(b, conc, func(i int) error {
							_, err := s.Append(ctx, events[i])
							return err
						})
					})
				}
			})
		}
	}
}

// BenchmarkColdProjection: the first projection of 500 runs of 201
// records each by a restarted store (nothing in memory), from the log
// alone and from persisted snapshots (each 9 records behind its run: the
// worst case under SaveEvery 32 is 31).
func BenchmarkColdProjection(b *testing.B) {
	const runs, steps = 500, 100
	js, _ := natstest.StartIn(b, b.TempDir(), natsstore.EmbeddedConfig{SyncInterval: time.Minute})
	ctx := context.Background()
	open := func(bucket string) *natsstore.Store {
		s, err := natsstore.Open(ctx, js, natsstore.Options{SnapshotBucket: bucket})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	w := open(natsstore.DefaultSnapshotBucket)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := g; r < runs; r += 8 {
				id := fmt.Sprintf("cold-%d", r)
				evs := []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, "")}
				for i := range steps {
					evs = append(evs, storetest.Event(id, statestore.StepStarted, fmt.Sprintf("s%03d", i)), storetest.Event(id, statestore.StepCompleted, fmt.Sprintf("s%03d", i)))
				}
				for i, e := range evs {
					if _, err := w.Append(ctx, e); err != nil {
						b.Error(err)
						return
					}
					if i == len(evs)-10 {
						if _, err := w.ProjectSnapshot(ctx, id); err != nil { // saved here
							b.Error(err)
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, c := range []struct{ name, bucket string }{{"from-the-log", ""}, {"from-snapshots", natsstore.DefaultSnapshotBucket}} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				s := open(c.bucket)
				began := time.Now()
				for r := range runs {
					if _, err := s.ProjectSnapshot(ctx, fmt.Sprintf("cold-%d", r)); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(time.Since(began).Microseconds())/runs, "µs/run")
				s.Close()
			}
		})
	}
}
