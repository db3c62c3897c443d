package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// TestServer_ReadyChecksWithinTheProbesTimeout: /readyz gives its checks
// (Conductor's health above all, which a frozen Conductor holds to the
// end) at most ReadyTimeout, shorter than the readiness probes' timeout
// the chart and the manifests set (5 s): a probe gets the 503 with its
// reason rather than timing out on a check that hangs.
func TestServer_ReadyChecksWithinTheProbesTimeout(t *testing.T) {
	var budget time.Duration
	ready := func(ctx context.Context) error {
		deadline, ok := ctx.Deadline()
		if !ok {
			t.Error("the readiness checks got a context without a deadline")
			return nil
		}
		budget = time.Until(deadline)
		return nil
	}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Ready: ready, Logger: zaptest.NewLogger(t)}).Handler())
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if budget > httpapi.ReadyTimeout || httpapi.ReadyTimeout >= 5*time.Second {
		t.Fatalf("the readiness checks had %v (ReadyTimeout %v): want at most ReadyTimeout, below the 5 s probe timeout", budget, httpapi.ReadyTimeout)
	}
}
