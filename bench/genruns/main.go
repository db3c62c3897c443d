// Command genruns appends finished runs directly to an embedded JetStream
// store (no Conductor), for the benchmarks of serve on a long history
// (BENCHMARKS.md): each run is RunStarted, StepStarted, StepCompleted,
// RunCompleted of one step, as a 1-step run leaves them.
//
//	go run ./bench/genruns -data-dir /tmp/hist -runs 100000
//
// Then start serve on that data dir. The data dir must not be in use.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func main() {
	dir := flag.String("data-dir", "", "embedded NATS store directory (required)")
	runs := flag.Int("runs", 100_000, "finished runs to append")
	workers := flag.Int("workers", 32, "concurrent appenders")
	prefix := flag.String("prefix", "hist", "runId prefix")
	removable := flag.Bool("removable", false, "create the stream removable (for serve --retain-finished)")
	flag.Parse()
	if err := run(*dir, *runs, *workers, *prefix, *removable); err != nil {
		fmt.Fprintln(os.Stderr, "genruns:", err)
		os.Exit(1)
	}
}

func run(dir string, runs, workers int, prefix string, removable bool) error {
	if dir == "" {
		return fmt.Errorf("-data-dir is required")
	}
	// Fsync once a minute (and at shutdown): a generator, not a producer.
	srv, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: dir, SyncInterval: time.Minute})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx := context.Background()
	s, err := natsstore.Open(ctx, js, natsstore.Options{Removable: removable})
	if err != nil {
		return err
	}
	defer s.Close()
	start := time.Now()
	var next, done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(runs) {
					return
				}
				id := fmt.Sprintf("%s-%08d", prefix, i)
				for _, w := range []*statestore.RunEventWrite{
					storetest.Event(id, statestore.RunStarted, ""), storetest.Event(id, statestore.StepStarted, "s1"),
					storetest.Event(id, statestore.StepCompleted, "s1"), storetest.Event(id, statestore.RunCompleted, ""),
				} {
					if err := appendRetrying(ctx, s, w); err != nil {
						errs <- fmt.Errorf("run %s: %w", id, err)
						return
					}
				}
				if n := done.Add(1); n%50_000 == 0 {
					fmt.Fprintf(os.Stderr, "%d runs, %.0f runs/s\n", n, float64(n)/time.Since(start).Seconds())
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Printf("appended %d finished runs (%d events) in %s\n", runs, 4*runs, time.Since(start).Round(time.Millisecond))
	return nil
}

// appendRetrying appends w, again after a failure (a timeout on a loaded
// machine): an append is idempotent, so a retry of one that was stored
// stores nothing more.
func appendRetrying(ctx context.Context, s *natsstore.Store, w *statestore.RunEventWrite) error {
	var err error
	for try := range 8 {
		if _, err = s.Append(ctx, w); err == nil {
			return nil
		}
		time.Sleep(time.Duration(try+1) * 250 * time.Millisecond)
	}
	return err
}
