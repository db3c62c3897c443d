package httpapi

import (
	"context"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/connlimit"
	"github.com/conductor-sidecar/sidecar/ratelog"
)

// MetricsServer serves GET /metrics and nothing else, without
// authentication: the listener of serve's --metrics-listen, for a
// Prometheus that cannot present a token (a network policy guards it
// instead). It reads no run and steers nothing; any other path is 404
// NOT_FOUND, another method on /metrics 405 METHOD_NOT_ALLOWED.
type MetricsServer struct {
	// MaxConnections bounds the connections its listener keeps open, as
	// Options.MaxConnections does the API's (0: no bound); set it before
	// Open.
	MaxConnections int

	log *zap.Logger
	mux *http.ServeMux

	serving serving
}

// NewMetricsServer returns a MetricsServer for g; Open serves it.
func NewMetricsServer(g prometheus.Gatherer, log *zap.Logger) *MetricsServer {
	if log == nil {
		log = zap.NewNop()
	}
	s := &MetricsServer{log: log.Named("metrics"), mux: http.NewServeMux()}
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, Code: CodeMethodNotAllowed, Message: r.Method + " /metrics: allowed: GET, HEAD"})
	})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, Code: CodeNotFound, Message: "the metrics listener serves only GET /metrics; the control API is on --listen"})
	})
	return s
}

// Handler returns the server's handler.
func (s *MetricsServer) Handler() http.Handler { return s.mux }

// Open serves on ln until Close.
func (s *MetricsServer) Open(ln net.Listener) {
	if s.MaxConnections > 0 {
		ln = connlimit.New(ln, connlimit.Options{Max: s.MaxConnections, Refusal: tooManyConnections})
	}
	s.serving.start(&http.Server{Handler: s.Handler(), ReadHeaderTimeout: DefaultReadHeaderTimeout, ReadTimeout: DefaultReadTimeout,
		WriteTimeout: DefaultWriteTimeout, IdleTimeout: DefaultIdleTimeout, ErrorLog: ratelog.NewStdLog(s.log.Named("http"))}, ln, s.log)
}

// Close stops the server, waiting for scrapes in flight until ctx is done.
func (s *MetricsServer) Close(ctx context.Context) error { return s.serving.close(ctx) }
