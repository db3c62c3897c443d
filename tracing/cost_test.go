package tracing_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/tracing"
	"github.com/conductor-sidecar/sidecar/tracing/tracingtest"
)

// BenchmarkStepSpansExported is what tracing adds to a step attempt when
// it is on: the step span's start, its traceparent and its end, batched
// and exported over OTLP/HTTP to a real OpenTelemetry Collector, with the
// flush at the end inside the measurement. It reports the CPU of this
// process and of the collector per span: set beside a step's CPU
// (BenchmarkNoopSteps), it bounds what tracing can cost throughput, a
// figure the machine's load moves far less than steps/s.
func BenchmarkStepSpansExported(b *testing.B) {
	col := tracingtest.Start(b)
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.HTTP)
	ctx := context.Background()
	tr, err := tracing.New(ctx, tracing.Config{On: true, Protocol: tracing.ProtocolHTTP}, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	runs := make([]string, 1000)
	for i := range runs {
		runs[i] = "run-" + strconv.Itoa(i)
	}
	col0, self0 := col.CPU(b), rusage(b)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		s := tr.StartStep(tracing.Step{RunID: runs[n%len(runs)], StepID: "s" + strconv.Itoa(n%10), Executor: "noop", TaskID: "task", LogicalAttempt: 1, EngineAttempt: 1}, time.Now())
		_ = s.Traceparent()
		s.End(tracing.OutcomeCompleted, "")
		n++
		if n%256 == 0 {
			// A step takes milliseconds: leave the batcher time to
			// export, as it has in serve, so that no span is dropped
			// from a full queue. Sleeping costs no CPU.
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := tr.Close(ctx); err != nil {
		b.Fatal(err)
	}
	self := rusage(b) - self0
	// The collector writes what it received within its flush interval.
	deadline := time.Now().Add(30 * time.Second)
	for got := len(col.Spans(b)); got < n; got = len(col.Spans(b)) {
		if time.Now().After(deadline) {
			b.Fatalf("the collector received %d of %d spans", got, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.ReportMetric(float64(self.Nanoseconds())/1000/float64(n), "self-cpu-µs/span")
	b.ReportMetric(float64((col.CPU(b)-col0).Nanoseconds())/1000/float64(n), "collector-cpu-µs/span")
}

func rusage(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
