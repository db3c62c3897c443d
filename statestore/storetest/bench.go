package storetest

import (
	"sync"
	"sync/atomic"
	"testing"
)

// Concurrently runs op for i in [0, b.N) on conc goroutines, timing only
// that, and reports ops/s. The first error fails the benchmark.
func Concurrently(b *testing.B, conc int, op func(i int) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	b.ResetTimer()
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := op(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
