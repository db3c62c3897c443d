package tracing

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultErrorEvery is how often an ErrorHandler logs at most, unless
// NewErrorHandler is given another interval.
const DefaultErrorEvery = time.Minute

// ErrorHandler logs the errors OpenTelemetry reports (an export that
// failed, a full span queue, a span dropped) to a zap logger, rate
// limited: the first error is logged at once, then at most one per
// interval with the number of errors not logged since. Its zero value is
// not usable; Close stops it logging. Safe for concurrent use.
//
// It is an otel.ErrorHandler. OpenTelemetry's SDK and its OTLP exporters
// report errors only through otel.Handle, which sends them to one global
// handler per process (otel.SetErrorHandler); there is no per-provider
// option. So the process installs one (the node does, when tracing is on)
// and the errors of every Tracer in the process go to it.
type ErrorHandler struct {
	log    *zap.Logger
	every  time.Duration
	errors prometheus.Counter // nil: not counted

	mu      sync.Mutex
	last    time.Time
	skipped int
	closed  bool
}

// NewErrorHandler returns an ErrorHandler logging to log, at most once
// per every (DefaultErrorEvery when every <= 0), and counting every error
// in errors when it is not nil (sidecar_tracing_errors_total: the errors
// it does not log count too).
func NewErrorHandler(log *zap.Logger, every time.Duration, errors prometheus.Counter) *ErrorHandler {
	if every <= 0 {
		every = DefaultErrorEvery
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &ErrorHandler{log: log.Named("tracing"), every: every, errors: errors}
}

// Handle logs err unless an error was logged less than the interval ago
// (then it only counts it) or the handler is closed.
func (h *ErrorHandler) Handle(err error) {
	if err == nil {
		return
	}
	h.mu.Lock()
	if h.errors != nil && !h.closed {
		h.errors.Inc()
	}
	now := time.Now()
	if h.closed || (!h.last.IsZero() && now.Sub(h.last) < h.every) {
		if !h.closed {
			h.skipped++
		}
		h.mu.Unlock()
		return
	}
	skipped := h.skipped
	h.last, h.skipped = now, 0
	h.mu.Unlock()
	h.log.Warn("tracing: OpenTelemetry error; spans may be lost", zap.Error(err),
		zap.Int("notLogged", skipped), zap.Duration("logsAtMostEvery", h.every))
}

// Close stops h logging: errors reported after it are dropped (a
// process's global handler may outlive the logger it was given).
func (h *ErrorHandler) Close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
}
