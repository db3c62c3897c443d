package natsstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// BenchmarkAppendBatch measures a bulk pause's writes on the event log:
// runs runs, each with a RunPaused and a RunDrainCompleted conditional on
// the run's last sequence, either with AppendBatch (up to 256 runs in
// flight) or each run's two AppendIf calls with 32 runs at once (what the
// bulk actions did before). One op is one batch; fsync always (the
// embedded server's default). BENCHMARKS.md, "Bulk control with each
// batch's events in one write".
func BenchmarkAppendBatch(b *testing.B) {
	const runs = 1000
	ctx := context.Background()
	js := benchServer(b, 0)
	prepare := func(b *testing.B, s statestore.Store, round int) []statestore.RunBatch {
		in := make([]statestore.RunBatch, runs)
		for i := range in {
			id := fmt.Sprintf("r%d-%d", round, i)
			res, err := s.Append(ctx, storetest.Event(id, statestore.RunStarted, ""))
			if err != nil {
				b.Fatal(err)
			}
			in[i] = statestore.RunBatch{LastSeq: res.RunSeq, Events: []*statestore.RunEventWrite{
				storetest.Event(id, statestore.RunPaused, ""), storetest.Event(id, statestore.RunDrainCompleted, "")}}
		}
		return in
	}
	b.Run("AppendBatch", func(b *testing.B) {
		s := benchStore(b, js)
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			in := prepare(b, s, i)
			b.StartTimer()
			for _, r := range s.AppendBatch(ctx, in) {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		}
	})
	b.Run("AppendIf32", func(b *testing.B) {
		s := benchStore(b, js)
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			in := prepare(b, s, i)
			b.StartTimer()
			var wg sync.WaitGroup
			sem := make(chan struct{}, 32)
			for _, r := range in {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					last := r.LastSeq
					for _, w := range r.Events {
						res, err := s.AppendIf(ctx, w, last)
						if err != nil {
							b.Error(err)
							return
						}
						last = res.RunSeq
					}
				}()
			}
			wg.Wait()
		}
	})
}
