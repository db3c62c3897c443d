package httpapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"

	"go.uber.org/zap"
)

// serving is the lifecycle both of the package's listeners share: serve
// an http.Server on a listener until close, which waits for the requests
// in flight until its context is done.
type serving struct {
	mu  sync.Mutex
	srv *http.Server
	wg  sync.WaitGroup
}

// start serves srv on ln in the background; log names the server in the
// one line it logs if serving stops on an error.
func (s *serving) start(srv *http.Server, ln net.Listener, log *zap.Logger) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv = srv
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("server stopped", zap.Error(err))
		}
	}()
}

// close stops accepting requests and waits for those in flight until ctx
// is done. Closing what never started is a no-op.
func (s *serving) close(ctx context.Context) error {
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
