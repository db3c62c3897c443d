package runlist_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// BenchmarkListAfterRetention: the first page (limit 50) of a list whose
// RUNLIST_BENCH_REMOVED finished runs (default 20,000) were all forgotten
// by retention, their purge markers still in the bucket, with 10 open
// runs and the default window. "replica" is a replica that watched the
// runs go (it knows nothing is beyond its window: memory only);
// "started-later" one that started after them (from the list's floor: it
// has not read the rows beyond it, so its first page reads the bucket
// once, logged as "first page"; the pages timed come after it).
func BenchmarkListAfterRetention(b *testing.B) {
	ctx := context.Background()
	removed := 20_000
	if v, err := strconv.Atoi(os.Getenv("RUNLIST_BENCH_REMOVED")); err == nil && v > 0 {
		removed = v
	}
	const open = 10
	js, _ := natstest.StartIn(b, b.TempDir(), natsstore.EmbeddedConfig{SyncInterval: 2 * time.Minute})
	store, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	// parallel runs f(i) for i in [0, n), 64 at a time.
	parallel := func(n int, f func(i int) error) {
		var wg sync.WaitGroup
		var next atomic.Int64
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					if err := f(i); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if b.Failed() {
			b.FailNow()
		}
	}
	runID := func(i int) string { return fmt.Sprintf("bench-run-%07d", i) }
	parallel(removed+open, func(i int) error {
		if _, err := store.Append(ctx, storetest.Event(runID(i), statestore.RunStarted, "")); err != nil {
			return err
		}
		if i >= removed {
			return nil
		}
		_, err := store.Append(ctx, storetest.Event(runID(i), statestore.RunCompleted, ""))
		return err
	})
	l, err := runlist.Open(ctx, js, runlist.Options{Log: store, Poll: 10 * time.Millisecond, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(ctx)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	if _, err := l.WaitIndexed(wctx); err != nil {
		b.Fatal(err)
	}
	parallel(removed, func(i int) error { return l.ForgetRun(ctx, runID(i)) })
	// waitOpenOnly waits until r's first page holds the open runs only.
	waitOpenOnly := func(r *runlist.List) {
		deadline := time.Now().Add(10 * time.Minute)
		for {
			p, err := r.List(runlist.Filter{}, 50, "")
			if err == nil && len(p.Runs) == open {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("the first page is not the %d open runs: %v", open, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitOpenOnly(l)
	later, err := runlist.Open(ctx, js, runlist.Options{Log: store, Owner: notOwner{}, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer later.Close(ctx)
	wctx2, cancel2 := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel2()
	if _, err := later.WaitIndexed(wctx2); err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	waitOpenOnly(later)
	b.Logf("started-later: first page %s (%d purge markers in the bucket)", time.Since(began).Round(time.Microsecond), removed)
	for name, r := range map[string]*runlist.List{"replica": l, "started-later": later} {
		b.Run(name, func(b *testing.B) {
			for range b.N {
				p, err := r.List(runlist.Filter{}, 50, "")
				if err != nil || len(p.Runs) != open {
					b.Fatalf("the first page: %d runs, %v; want the %d open ones", len(p.Runs), err, open)
				}
			}
		})
	}
}
