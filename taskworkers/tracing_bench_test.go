package taskworkers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
	"github.com/conductor-sidecar/sidecar/tracing"
	"github.com/conductor-sidecar/sidecar/tracing/tracingtest"
)

// BenchmarkNoopStepsTracing runs noop steps (chains of 10 in parallel
// runs) through the sidecar's workers, with the watcher and the drain
// monitor beside them as in serve, in four phases of b.N/4 steps each:
// tracing off, on, off, on (A B A B, in the same process on the same
// Conductor, so drift on a shared machine touches both). On is a Tracer
// exporting over OTLP/HTTP to a real OpenTelemetry Collector
// ($SIDECAR_TEST_OTELCOL, with the SDK's default batching) plus the run
// span maker following the log, as serve runs them. It reports steps/s
// of each phase, on/off (the ratio of the two sums) and this process's
// CPU per step off and on (the embedded NATS server included; the
// collector is another process).
func BenchmarkNoopStepsTracing(b *testing.B) {
	col := tracingtest.Start(b)
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.HTTP)
	e := newBenchEnv(b)
	runsN := max(1, (b.N/4+benchSteps-1)/benchSteps)
	steps := runsN * benchSteps
	b.ResetTimer()
	b.StopTimer()
	var took, cpu [2]time.Duration // off, on
	for phase, on := range []bool{false, true, false, true} {
		d, c := e.tracedPhase(b, runsN, on)
		b.ReportMetric(float64(steps)/d.Seconds(), fmt.Sprintf("%d-%s-steps/s", phase+1, map[bool]string{false: "off", true: "on"}[on]))
		i := 0
		if on {
			i = 1
		}
		took[i] += d
		cpu[i] += c
	}
	// The on phases did trace: a span per step attempt reached the collector.
	col.WaitSpans(b, 30*time.Second, func(all []tracingtest.Span) bool {
		n := 0
		for _, s := range all {
			if s.Attributes[tracing.AttrStepID] != nil {
				n++
			}
		}
		return n >= 2*steps
	})
	b.ReportMetric(float64(2*steps)/took[0].Seconds(), "off-steps/s")
	b.ReportMetric(float64(2*steps)/took[1].Seconds(), "on-steps/s")
	b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "on/off")
	b.ReportMetric(float64(cpu[0].Microseconds())/1000/float64(2*steps), "off-cpu-ms/step")
	b.ReportMetric(float64(cpu[1].Microseconds())/1000/float64(2*steps), "on-cpu-ms/step")
}

// tracedPhase runs n chains through a fresh set of workers, with a Tracer
// when on, and returns the time from opening the workers to the last run
// ended, and this process's CPU in that time.
func (e *benchEnv) tracedPhase(b *testing.B, n int, on bool) (time.Duration, time.Duration) {
	ctx := context.Background()
	var tr *tracing.Tracer
	if on {
		var err error
		if tr, err = tracing.New(ctx, tracing.Config{On: true, Protocol: tracing.ProtocolHTTP}, zap.NewNop()); err != nil {
			b.Fatal(err)
		}
	}
	taskType := plan.TaskType(plan.ExecutorNoop)
	dc := adapter.DomainPoller{Client: e.client, Domain: e.domain}
	ids := e.startRuns(b, n, benchSteps)
	watcher := adapter.NewWatcher(e.runs, e.store, adapter.WatcherOptions{})
	var monitor *drain.Controller
	w := taskworkers.New(dc, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		Metrics:  taskworkers.NewMetrics(prometheus.NewRegistry()),
		WorkerID: "sidecar-bench", Concurrency: map[string]int{taskType: benchConcurrency()}, PollersPerType: benchPollers(),
		Tracer: tr,
		OnTaskDone: func(runID string, mayEndRun, mayEndDrain bool) { // as serve does
			if mayEndRun {
				watcher.Nudge(runID)
			}
			if mayEndDrain {
				monitor.Nudge(runID)
			}
		},
	})
	monitor = drain.New(e.store, e.emit, e.client, drain.Options{Interrupt: w.Interrupt, ActiveRuns: e.runs.ActiveRunIDs})
	spans := tracing.NewRunSpans(tr, e.store, tracing.RunSpansOptions{})
	b.StartTimer()
	cpu0 := processCPU(b)
	began := time.Now()
	for _, open := range []func(context.Context) error{spans.Open, watcher.Open, monitor.Open, w.Open} {
		if err := open(ctx); err != nil {
			b.Fatal(err)
		}
	}
	e.waitEnded(b, ids)
	took := time.Since(began)
	b.StopTimer()
	cpu := processCPU(b) - cpu0
	e.completed(b, ids)
	_ = w.Close(ctx)
	_ = watcher.Close(ctx)
	_ = monitor.Close(ctx)
	_ = spans.Close(ctx)
	if err := tr.Close(ctx); err != nil {
		b.Fatal(err)
	}
	return took, cpu
}
