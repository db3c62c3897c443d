package httpapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// MetricsServer serves GET /metrics and nothing else, without
// authentication: the listener of serve's --metrics-listen, for a
// Prometheus that cannot present a token (a network policy guards it
// instead). It reads no run and steers nothing; any other path is 404
// NOT_FOUND, another method on /metrics 405 METHOD_NOT_ALLOWED.
type MetricsServer struct {
	log *zap.Logger
	mux *http.ServeMux

	mu  sync.Mutex
	srv *http.Server
	wg  sync.WaitGroup
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
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv = &http.Server{Handler: s.mux, ReadHeaderTimeout: DefaultReadHeaderTimeout, ReadTimeout: DefaultReadTimeout,
		WriteTimeout: DefaultWriteTimeout, IdleTimeout: DefaultIdleTimeout, ErrorLog: zap.NewStdLog(s.log.Named("http"))}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("metrics server stopped", zap.Error(err))
		}
	}()
}

// Close stops the server, waiting for scrapes in flight until ctx is done.
func (s *MetricsServer) Close(ctx context.Context) error {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Shutdown(ctx)
	s.wg.Wait()
	return err
}
