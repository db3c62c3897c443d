package tracing_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/tracing"
)

func TestErrorHandler_Handle(t *testing.T) {
	t.Run("RateLimited", func(t *testing.T) {
		core, logs := observer.New(zap.WarnLevel)
		errs := prometheus.NewCounter(prometheus.CounterOpts{Name: "errors"})
		h := tracing.NewErrorHandler(zap.New(core), 200*time.Millisecond, errs)
		for i := 0; i < 5; i++ {
			h.Handle(errors.New("export failed"))
		}
		if n := logs.Len(); n != 1 {
			t.Fatalf("got %d log lines for 5 errors within the interval, want 1", n)
		}
		if n := testutil.ToFloat64(errs); n != 5 {
			t.Fatalf("counted %v errors, want every one of the 5 (those not logged too)", n)
		}
		time.Sleep(250 * time.Millisecond)
		h.Handle(errors.New("export failed again"))
		all := logs.All()
		if len(all) != 2 {
			t.Fatalf("got %d log lines after the interval, want 2", len(all))
		}
		if got := all[1].ContextMap()["notLogged"]; got != int64(4) {
			t.Fatalf("second line says notLogged=%v, want 4", got)
		}
	})
	t.Run("Closed", func(t *testing.T) {
		core, logs := observer.New(zap.WarnLevel)
		h := tracing.NewErrorHandler(zap.New(core), time.Millisecond, nil)
		h.Close()
		h.Handle(errors.New("export failed"))
		if logs.Len() != 0 {
			t.Fatalf("a closed handler logged %v", logs.All())
		}
	})
	t.Run("Nil", func(t *testing.T) {
		core, logs := observer.New(zap.WarnLevel)
		tracing.NewErrorHandler(zap.New(core), 0, nil).Handle(nil)
		if logs.Len() != 0 {
			t.Fatal("a nil error was logged")
		}
	})
}

// TestErrorHandler_ExportErrors: a Tracer whose collector does not
// answer reports the failed exports through otel's global handler, and
// the ErrorHandler installed there logs them to the logger it was given.
func TestErrorHandler_ExportErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nobody listens there now
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+dead)
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "300")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")

	core, logs := observer.New(zap.WarnLevel)
	h := tracing.NewErrorHandler(zap.New(core), time.Hour, nil)
	otel.SetErrorHandler(h)
	t.Cleanup(h.Close)

	ctx := context.Background()
	tr, err := tracing.New(ctx, tracing.Config{On: true, Protocol: tracing.ProtocolHTTP}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		tr.StartStep(tracing.Step{RunID: "r", StepID: "a"}, time.Now()).End(tracing.OutcomeCompleted, "")
	}
	deadline := time.Now().Add(20 * time.Second)
	for logs.Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = tr.Close(cctx)
	if logs.Len() != 1 {
		t.Fatalf("got %d log lines, want the export error logged once (rate limited): %v", logs.Len(), logs.All())
	}
	if e := logs.All()[0].ContextMap()["error"]; e == nil {
		t.Fatalf("log line without the error: %v", logs.All()[0])
	}
	t.Logf("logged: %s %v", logs.All()[0].Message, logs.All()[0].ContextMap()["error"])
}
