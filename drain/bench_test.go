package drain_test

import (
	"context"
	"fmt"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// noEngine stands in for Conductor: the targets exclude its pause call.
type noEngine struct{}

func (noEngine) Pause(context.Context, string) error             { return nil }
func (noEngine) Resume(context.Context, string) error            { return nil }
func (noEngine) Terminate(context.Context, string, string) error { return nil }

func jsEnv(b *testing.B) (*natsstore.Store, *registry.Emitter) {
	b.Helper()
	js, _ := natstest.Start(b)
	store, err := natsstore.Open(context.Background(), js, natsstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ids, err := registry.Open(context.Background(), js, registry.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return store, registry.NewEmitter(ids, store)
}

func runningRun(b *testing.B, emit *registry.Emitter) string {
	b.Helper()
	runID := "bench-" + uuid.NewString()
	for _, w := range []*statestore.RunEventWrite{storetest.Event(runID, statestore.RunStarted, ""), storetest.Event(runID, statestore.StepStarted, "a")} {
		w.EventID = ""
		if _, err := emit.Emit(context.Background(), w); err != nil {
			b.Fatal(err)
		}
	}
	return runID
}

func report(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkPauseRecorded: pause request -> RunPaused persisted (fsync on
// every write, registry included), Conductor's own pause call excluded.
func BenchmarkPauseRecorded(b *testing.B) {
	store, emit := jsEnv(b)
	c := drain.New(store, emit, noEngine{}, drain.Options{})
	runs := make([]string, b.N)
	for i := range runs {
		runs[i] = runningRun(b, emit)
	}
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		began := time.Now()
		if _, err := c.Pause(context.Background(), runs[i], drain.PauseRequest{}); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(began)
	}
	report(b, lat)
}

// BenchmarkDrainDetected: the last in-flight step's StepCompleted persisted
// -> RunDrainCompleted persisted, through the worker's nudge.
func BenchmarkDrainDetected(b *testing.B) {
	store, emit := jsEnv(b)
	runs := make([]string, b.N)
	c := drain.New(store, emit, noEngine{}, drain.Options{ActiveRuns: func(context.Context) ([]string, error) { return nil, nil }})
	for i := range runs {
		runs[i] = runningRun(b, emit)
		if _, err := c.Pause(context.Background(), runs[i], drain.PauseRequest{}); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := storetest.Event(runs[i], statestore.StepCompleted, "a")
		w.EventID = ""
		if _, err := emit.Emit(context.Background(), w); err != nil {
			b.Fatal(err)
		}
		began := time.Now()
		c.Nudge(runs[i])
		for {
			snap, err := store.ProjectSnapshot(context.Background(), runs[i])
			if err != nil {
				b.Fatal(err)
			}
			if snap.Pause.DrainEndedAt != "" {
				break
			}
			if time.Since(began) > 10*time.Second {
				b.Fatal(fmt.Errorf("drain of %s not detected", runs[i]))
			}
			time.Sleep(200 * time.Microsecond)
		}
		lat[i] = time.Since(began)
	}
	report(b, lat)
}

// BenchmarkMonitorIdle: the drain monitor's CPU with N active runs, none
// of them draining, over 2 s of its loop (embedded JetStream store). The
// every-tick mode passes over every run every 250 ms, as the monitor once
// did; watched checks only open drains and passes over every
// run every 30 s. Reported as the share of one core.
func BenchmarkMonitorIdle(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		for _, mode := range []struct {
			name string
			full time.Duration
		}{{"every-tick", 250 * time.Millisecond}, {"watched", 30 * time.Second}} {
			b.Run(fmt.Sprintf("runs=%d/%s", n, mode.name), func(b *testing.B) {
				if testing.Short() && n > 1000 {
					b.Skip("-short")
				}
				store, emit := jsEnv(b)
				ids := make([]string, n)
				for i := range ids {
					ids[i] = runningRun(b, emit)
				}
				for range b.N {
					c := drain.New(store, emit, noEngine{}, drain.Options{FullScanInterval: mode.full,
						ActiveRuns: func(context.Context) ([]string, error) { return ids, nil }})
					if err := c.Open(context.Background()); err != nil {
						b.Fatal(err)
					}
					before := processCPU(b)
					time.Sleep(2 * time.Second)
					used := processCPU(b) - before
					_ = c.Close(context.Background())
					b.ReportMetric(100*used.Seconds()/2, "%core")
				}
			})
		}
	}
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
