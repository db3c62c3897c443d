package statestore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// benchLog is a realistic run: RunStarted, then 10 steps of
// StepStarted/StepCompleted (with an artifact payload), a pause cycle, and
// RunCompleted, repeated across runs of `steps` steps.
func benchLog(steps int) []statestore.RunEventRecord {
	b := newLog("bench").ev(statestore.RunStarted)
	for i := 0; i < steps; i++ {
		id := fmt.Sprintf("step-%04d", i)
		b.step(statestore.StepStarted, id)
		if i%10 == 9 {
			b.add(statestore.StepCompleted, id, 1, map[string]any{"artifacts": []any{map[string]any{"uri": "nats-os://artifacts/" + id, "kind": "stdout", "sizeBytes": 10}}})
		} else {
			b.step(statestore.StepCompleted, id)
		}
	}
	return b.ev(statestore.RunCompleted).recs
}

// BenchmarkReduce reports events/s for a whole-run reduction. Runs of 50
// steps are typical; 1,000 steps shows the scaling.
func BenchmarkReduce(b *testing.B) {
	for _, steps := range []int{50, 1000} {
		recs := benchLog(steps)
		b.Run(fmt.Sprintf("steps=%d", steps), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				statestore.Reduce(nil, recs)
			}
			b.ReportMetric(float64(len(recs)*b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
	recs := benchLog(50)
	b.Run("incremental-one-event", func(b *testing.B) {
		snap, _ := statestore.Reduce(nil, recs[:len(recs)-1])
		last := recs[len(recs)-1:]
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			statestore.Reduce(snap, last)
		}
	})
}

func BenchmarkValidateWrite(b *testing.B) {
	w := storetest.WithPayload(storetest.Event("run-1", statestore.StepCompleted, "a"), map[string]any{"artifacts": []any{map[string]any{"uri": "u", "kind": "k"}}})
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := statestore.ValidateWrite(w); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMemstore_Append(b *testing.B) {
	for _, conc := range []int{1, 64} {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			s := memstore.New(statestore.ProjectorOptions{})
			events := make([]*statestore.RunEventWrite, b.N)
			for i := range events {
				events[i] = storetest.Event(fmt.Sprintf("run-%d", i%100), statestore.StepStarted, fmt.Sprintf("s%d", i))
			}
			var next atomic.Int64
			b.ResetTimer()
			runConcurrently(b, conc, func() {
				i := next.Add(1) - 1
				if _, err := s.Append(context.Background(), events[i]); err != nil {
					b.Error(err)
				}
			})
		})
	}
	b.Run("duplicate", func(b *testing.B) {
		s := memstore.New(statestore.ProjectorOptions{})
		w := storetest.Event("run-dup", statestore.RunStarted, "")
		s.Append(context.Background(), w)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if res, err := s.Append(context.Background(), w); err != nil || !res.Idempotent {
				b.Fatal(res, err)
			}
		}
	})
}

// runConcurrently calls op b.N times from conc goroutines.
func runConcurrently(b *testing.B, conc int, op func()) {
	var left atomic.Int64
	left.Store(int64(b.N))
	done := make(chan struct{})
	for g := 0; g < conc; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for left.Add(-1) >= 0 {
				op()
			}
		}()
	}
	for g := 0; g < conc; g++ {
		<-done
	}
}

// BenchmarkSchemaValidate is the alternative to ValidateWrite that was
// weighed: the same event checked by the published JSON Schemas
// (RunEventWrite and its type's), from the JSON the API receives.
func BenchmarkSchemaValidate(b *testing.B) {
	sch := schemas(b)
	w := storetest.WithPayload(storetest.Event("run-1", statestore.StepCompleted, "a"), map[string]any{"artifacts": []any{map[string]any{"uri": "u", "kind": "k"}}})
	doc := mustJSON(b, w)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := schemaValid(b, sch, doc); err != nil {
			b.Fatal(err)
		}
	}
}
