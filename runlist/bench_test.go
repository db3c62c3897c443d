package runlist_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// benchRuns is the number of runs in the benchmark's log (5 or 6 events
// each). BENCHMARKS.md has the numbers for 100,000
// (RUNLIST_BENCH_RUNS=100000).
var benchRuns = flag.Int("runlist.runs", 10_000, "runs in the log of BenchmarkList")

func runsInLog() int {
	if v, err := strconv.Atoi(os.Getenv("RUNLIST_BENCH_RUNS")); err == nil && v > 0 {
		return v
	}
	return *benchRuns
}

// BenchmarkList builds the run list from a log of runsInLog() runs,
// against the raw limit (an ordered consumer reading the whole stream, no
// decoding, no fold, no writes), loads a second replica's mirror, and
// queries it.
func BenchmarkList(b *testing.B) {
	ctx := context.Background()
	js, _ := natstest.StartIn(b, b.TempDir(), natsstore.EmbeddedConfig{SyncInterval: 2 * time.Minute})
	store, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	n := runsInLog()
	began := time.Now()
	events := writeLog(b, store, n)
	b.Logf("log: %d runs, %d events, written in %s", n, events, time.Since(began).Round(time.Millisecond))

	// The raw limit of reading the stream: an ordered consumer, no decoding.
	b.Run("raw-ordered-consumer", func(b *testing.B) {
		for range b.N {
			began := time.Now()
			c, err := js.OrderedConsumer(ctx, store.Stream(), jetstream.OrderedConsumerConfig{})
			if err != nil {
				b.Fatal(err)
			}
			total := int64(0)
			for total < events {
				batch, err := c.FetchNoWait(1024)
				if err != nil {
					b.Fatal(err)
				}
				for m := range batch.Messages() {
					_ = m
					total++
				}
			}
			b.ReportMetric(float64(total)/time.Since(began).Seconds(), "events/s")
		}
	})
	var built *runlist.List
	bucket := 0
	b.Run("build", func(b *testing.B) {
		for range b.N {
			bucket++
			began := time.Now()
			l, err := runlist.Open(ctx, js, runlist.Options{Log: store, Bucket: fmt.Sprintf("BENCH_%d", bucket), Poll: 10 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
			if _, err := l.WaitIndexed(wctx); err != nil {
				b.Fatal(err)
			}
			cancel()
			s := time.Since(began).Seconds()
			b.ReportMetric(float64(events)/s, "events/s")
			b.ReportMetric(float64(n)/s, "runs/s")
			if built != nil {
				built.Close(context.Background())
			}
			built = l
		}
	})
	defer built.Close(context.Background())
	b.Run("mirror-load", func(b *testing.B) {
		for range b.N {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			began := time.Now()
			l, err := runlist.Open(ctx, js, runlist.Options{Log: store, Bucket: fmt.Sprintf("BENCH_%d", bucket), Owner: notOwner{}})
			if err != nil {
				b.Fatal(err)
			}
			for {
				if _, err := l.List(runlist.Filter{}, 1, ""); err == nil {
					break
				}
				time.Sleep(time.Millisecond)
			}
			b.ReportMetric(time.Since(began).Seconds(), "s/load")
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heap-B/run")
			l.Close(context.Background())
		}
	})
	gold, _ := runlist.ParseSelector("tier=gold,team in (t1,t2)")
	queries := []struct {
		name   string
		filter runlist.Filter
		limit  int
	}{
		{"first-page-of-all", runlist.Filter{}, 500},
		{"selective", runlist.Filter{PlanID: "plan-3", Statuses: []string{statestore.RunStatusPaused}, Selector: gold}, 500},
		{"status-draining", runlist.Filter{Substatus: statestore.SubstatusDraining}, 500},
	}
	for _, q := range queries {
		b.Run("query/"+q.name, func(b *testing.B) {
			for range b.N {
				if _, err := built.List(q.filter, q.limit, ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("query/all-pages-of-500", func(b *testing.B) {
		for range b.N {
			cont, rows := "", 0
			for {
				p, err := built.List(runlist.Filter{}, 500, cont)
				if err != nil {
					b.Fatal(err)
				}
				rows += len(p.Runs)
				if cont = p.Continue; cont == "" {
					break
				}
			}
			if rows != n {
				b.Fatalf("paged through %d rows, want %d", rows, n)
			}
		}
	})
}

type notOwner struct{}

func (notOwner) Owns(string) bool { return false }

// writeLog appends n runs of 10 plans with labels, 64 at a time: every
// run starts two steps and completes the first; a tenth are paused with
// the second in flight (DRAINING), half of the rest complete.
func writeLog(b *testing.B, s *natsstore.Store, n int) int64 {
	ctx := context.Background()
	var written atomic.Int64
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				runID := fmt.Sprintf("bench-run-%07d", i)
				plan := fmt.Sprintf("plan-%d", i%10)
				ev := func(typ, step string, payload any) {
					w := storetest.Event(runID, typ, step)
					w.PlanID = plan
					storetest.Rekey(w)
					if payload != nil {
						storetest.WithPayload(w, payload)
					}
					if _, err := s.Append(ctx, w); err != nil {
						b.Error(err)
					}
					written.Add(1)
				}
				ev(statestore.RunStarted, "", map[string]any{"labels": map[string]string{
					"tier": []string{"gold", "silver", "bronze"}[i%3], "team": fmt.Sprintf("t%d", i%7)}})
				ev(statestore.StepStarted, "a", nil)
				ev(statestore.StepCompleted, "a", nil)
				ev(statestore.StepStarted, "b", nil)
				switch {
				case i%10 == 0:
					ev(statestore.RunPaused, "", map[string]any{"reason": "bench"})
				case i%2 == 1:
					ev(statestore.StepCompleted, "b", nil)
					ev(statestore.RunCompleted, "", nil)
				}
			}
		}()
	}
	wg.Wait()
	return written.Load()
}
