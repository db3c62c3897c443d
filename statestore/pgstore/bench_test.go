package pgstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func openB(b *testing.B, url string) *pgstore.Store {
	b.Helper()
	s, err := pgstore.Open(context.Background(), url, pgstore.Options{MaxConns: 64})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	return s
}

// BenchmarkAppend: Append at concurrency 1 and 64 over 1,000 runs, on the
// database's defaults (synchronous_commit on: every commit is flushed),
// and a duplicate's answer. natsstore's BenchmarkAppend is the JetStream
// counterpart (sync=always).
func BenchmarkAppend(b *testing.B) {
	ctx := context.Background()
	url := pgtest.URL(b)
	for _, conc := range []int{1, 64} {
		b.Run(fmt.Sprintf("conc=%d/store", conc), func(b *testing.B) {
			s := openB(b, url)
			tag := time.Now().UnixNano()
			events := make([]*statestore.RunEventWrite, b.N)
			for i := range events {
				events[i] = storetest.Event(fmt.Sprintf("run-%d-%06d", tag, i%1000), statestore.StepStarted, fmt.Sprintf("step-%06d", i))
			}
			storetest.Concurrently(b, conc, func(i int) error {
				res, err := s.Append(ctx, events[i])
				if err == nil && !res.Persisted {
					err = fmt.Errorf("append %d not persisted: %+v", i, res)
				}
				return err
			})
		})
		b.Run(fmt.Sprintf("conc=%d/dup", conc), func(b *testing.B) {
			s := openB(b, url)
			w := storetest.Event(fmt.Sprintf("run-dup-%d", time.Now().UnixNano()), statestore.StepCompleted, "a")
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
}

// BenchmarkFetch reads one run of 100 events among 100k events of other
// runs (and 1M with PGSTORE_BENCH_BIG=1), loaded with COPY; "tail" reads
// the events after its 90th.
func BenchmarkFetch(b *testing.B) {
	sizes := []int{100_000, 1_000_000}
	if testing.Short() {
		sizes = []int{2_000}
	}
	for _, others := range sizes {
		b.Run(fmt.Sprintf("others=%d", others), func(b *testing.B) {
			if others > 100_000 && os.Getenv("PGSTORE_BENCH_BIG") == "" {
				b.Skip("set PGSTORE_BENCH_BIG=1 for the 1M-event setup")
			}
			url := pgtest.URL(b)
			s := openB(b, url)
			load(b, url, others)
			ctx := context.Background()
			fetch := func(b *testing.B, after int64, want int) {
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					recs, err := s.Fetch(ctx, "run-small", after, 0)
					if err != nil || len(recs) != want {
						b.Fatalf("%d records, %v; want %d", len(recs), err, want)
					}
				}
			}
			b.Run("all", func(b *testing.B) { fetch(b, 0, 100) })
			b.Run("tail", func(b *testing.B) { fetch(b, 90, 10) })
		})
	}
}

// load writes others events of distinct runs and a run "run-small" of 100
// events spread among them, with COPY (the setup, not what is measured).
// Their chain hashes are zeros: Fetch does not check the chain (a
// snapshot's load and sidecar verify do).
func load(b *testing.B, url string, others int) {
	b.Helper()
	noChain := make([]byte, 32)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	every := others / 100
	rows := make([][]any, 0, others+100)
	small := 0
	for i := 0; i < others; i++ {
		w := storetest.Event(fmt.Sprintf("run-%07d", i), statestore.StepStarted, "s")
		body, _ := json.Marshal(w)
		rows = append(rows, []any{w.RunID, int64(1), w.IdempotencyKey, w.EventID, w.EventType, string(body), int64(len(rows) + 1), noChain})
		if every > 0 && i%every == 0 && small < 100 {
			small++
			w := storetest.Event("run-small", statestore.StepStarted, fmt.Sprintf("s%03d", small))
			body, _ := json.Marshal(w)
			rows = append(rows, []any{w.RunID, int64(small), w.IdempotencyKey, w.EventID, w.EventType, string(body), int64(len(rows) + 1), noChain})
		}
	}
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"run_events"}, []string{"run_id", "run_seq", "idempotency_key", "event_id", "event_type", "body", "log_seq", "chain_hash"},
		pgx.CopyFromRows(rows)); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT setval('run_events_log_seq', $1)", int64(len(rows))); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "ANALYZE run_events"); err != nil {
		b.Fatal(err)
	}
	if small != 100 {
		b.Fatalf("run-small has %d events", small)
	}
}

// BenchmarkColdProjection: the first projection of 500 runs of 201
// records each by a restarted store (nothing in memory), from the log
// alone and from the persisted snapshots of run_snapshots (each 9 records
// behind its run); natsstore's BenchmarkColdProjection is the JetStream
// counterpart. -short: 50 runs.
func BenchmarkColdProjection(b *testing.B) {
	runs, steps := 500, 100
	if testing.Short() {
		runs = 50
	}
	ctx := context.Background()
	url := pgtest.URL(b)
	open := func(durable bool) *pgstore.Store {
		s, err := pgstore.Open(ctx, url, pgstore.Options{DurableSnapshots: durable})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	w := open(true)
	defer w.Close()
	load := func(r int) error {
		id := fmt.Sprintf("cold-%d", r)
		evs := []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, "")}
		for i := range steps {
			evs = append(evs, storetest.Event(id, statestore.StepStarted, fmt.Sprintf("s%03d", i)), storetest.Event(id, statestore.StepCompleted, fmt.Sprintf("s%03d", i)))
		}
		for i, e := range evs {
			if _, err := w.Append(ctx, e); err != nil {
				return err
			}
			if i == len(evs)-10 {
				if _, err := w.ProjectSnapshot(ctx, id); err != nil { // saved here
					return err
				}
			}
		}
		return nil
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for r := g; r < runs; r += 16 {
				if err := load(r); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		return
	}
	for _, c := range []struct {
		name    string
		durable bool
	}{{"from-the-log", false}, {"from-snapshots", true}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				s := open(c.durable)
				began := time.Now()
				for r := range runs {
					if _, err := s.ProjectSnapshot(ctx, fmt.Sprintf("cold-%d", r)); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(time.Since(began).Microseconds())/float64(runs), "µs/run")
				s.Close()
			}
		})
	}
}

// BenchmarkRemoveRun: remove_run of a finished 3-step run (8 records, a
// saved snapshot), one at a time, as the retention role, among the runs
// appended for it.
func BenchmarkRemoveRun(b *testing.B) {
	ctx := context.Background()
	r := pgtest.NewRoles(b)
	if _, err := pgstore.Migrate(ctx, r.OwnerURL, pgstore.MigrateOptions{RuntimeRole: r.Runtime, RetentionRole: r.Retention}); err != nil {
		b.Fatal(err)
	}
	s, err := pgstore.Open(ctx, r.RuntimeURL, pgstore.Options{MaxConns: 8, DurableSnapshots: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	append8 := func(i int) error {
		id := fmt.Sprintf("run-%06d", i)
		for _, w := range []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""),
			storetest.Event(id, statestore.StepStarted, "a"), storetest.Event(id, statestore.StepCompleted, "a"),
			storetest.Event(id, statestore.StepStarted, "b"), storetest.Event(id, statestore.StepCompleted, "b"),
			storetest.Event(id, statestore.StepStarted, "c"), storetest.Event(id, statestore.StepCompleted, "c"),
			storetest.Event(id, statestore.RunCompleted, "")} {
			if _, err := s.Append(ctx, w); err != nil {
				return err
			}
		}
		_, err := s.ProjectSnapshot(ctx, id)
		return err
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < b.N; i += 8 {
				if err := append8(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	rm, err := pgstore.OpenRemover(ctx, r.RetentionURL, pgstore.RemoverOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rm.Close)
	b.ResetTimer()
	for i := range b.N {
		if err := rm.RemoveRun(ctx, fmt.Sprintf("run-%06d", i), 8, 8); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRemovalSteadyState: rounds of 2,000 finished 3-step runs
// appended, then removed by remove_run, as retention does once its window
// is full; reports the database's size of the log's tables (with their
// indexes and TOAST) after the first round and after the last, with
// autovacuum left to its defaults. b.N is the number of rounds after the
// first.
func BenchmarkRemovalSteadyState(b *testing.B) {
	ctx := context.Background()
	r := pgtest.NewRoles(b)
	if _, err := pgstore.Migrate(ctx, r.OwnerURL, pgstore.MigrateOptions{RuntimeRole: r.Runtime, RetentionRole: r.Retention}); err != nil {
		b.Fatal(err)
	}
	s, err := pgstore.Open(ctx, r.RuntimeURL, pgstore.Options{MaxConns: 8, DurableSnapshots: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	rm, err := pgstore.OpenRemover(ctx, r.RetentionURL, pgstore.RemoverOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rm.Close)
	const runs = 2000
	round := func(n int) {
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < runs; i += 8 {
					id := fmt.Sprintf("run-%d-%06d", n, i)
					for _, e := range []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""),
						storetest.Event(id, statestore.StepStarted, "a"), storetest.Event(id, statestore.StepCompleted, "a"),
						storetest.Event(id, statestore.StepStarted, "b"), storetest.Event(id, statestore.StepCompleted, "b"),
						storetest.Event(id, statestore.StepStarted, "c"), storetest.Event(id, statestore.StepCompleted, "c"),
						storetest.Event(id, statestore.RunCompleted, "")} {
						if _, err := s.Append(ctx, e); err != nil {
							b.Error(err)
							return
						}
					}
					if _, err := s.ProjectSnapshot(ctx, id); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		for i := range runs {
			if err := rm.RemoveRun(ctx, fmt.Sprintf("run-%d-%06d", n, i), 8, 8); err != nil {
				b.Fatal(err)
			}
		}
	}
	size := func() float64 {
		var n int64
		if err := s.Pool().QueryRow(ctx, `SELECT sum(pg_total_relation_size(t)) FROM unnest(array['run_events', 'runs', 'run_snapshots', 'event_ids']::regclass[]) t`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return float64(n)
	}
	round(0)
	first := size()
	b.ResetTimer()
	for i := range b.N {
		round(i + 1)
		var dead int64
		var vacuumed bool
		if err := s.Pool().QueryRow(ctx, `SELECT n_dead_tup, last_autovacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'run_events'`).Scan(&dead, &vacuumed); err != nil {
			b.Fatal(err)
		}
		b.Logf("after round %d: %.1f MB; run_events: %d dead rows, autovacuumed %v", i+2, size()/1e6, dead, vacuumed)
	}
	b.StopTimer()
	b.ReportMetric(first, "bytes-after-round-1")
	b.ReportMetric(size(), "bytes-after-last")
}
