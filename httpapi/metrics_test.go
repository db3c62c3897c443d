package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// TestMetricsServer: the metrics listener answers GET /metrics without
// credentials and nothing else: another path is 404 NOT_FOUND (the control
// API is not there, with or without a token), another method 405.
func TestMetricsServer(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "sidecar_test_scrapes_total", Help: "A counter of the test."})
	reg.MustRegister(c)
	c.Add(3)
	s := httpapi.NewMetricsServer(reg, zaptest.NewLogger(t))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Open(ln)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	base := "http://" + ln.Addr().String()

	do := func(method, path, token string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	code := func(t *testing.T, body string) string {
		var e struct{ Code string }
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		return e.Code
	}

	t.Run("OK", func(t *testing.T) {
		resp, body := do("GET", "/metrics", "")
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "sidecar_test_scrapes_total 3") {
			t.Fatalf("GET /metrics without a token: %s\n%.500s", resp.Status, body)
		}
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		for _, p := range []string{"/v1/runs", "/v1/runs/r1", "/healthz", "/", "/metrics/x"} {
			resp, body := do("GET", p, "any-token")
			if resp.StatusCode != http.StatusNotFound || code(t, body) != httpapi.CodeNotFound {
				t.Errorf("GET %s: got %s %s, want 404 %s", p, resp.Status, body, httpapi.CodeNotFound)
			}
		}
	})
	t.Run("ErrMethodNotAllowed", func(t *testing.T) {
		resp, body := do("POST", "/metrics", "")
		if resp.StatusCode != http.StatusMethodNotAllowed || code(t, body) != httpapi.CodeMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("POST /metrics: got %s %s (Allow %q), want 405 %s", resp.Status, body, resp.Header.Get("Allow"), httpapi.CodeMethodNotAllowed)
		}
	})
}
