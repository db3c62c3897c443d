package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
)

// TestServe_ProxyRouteRule: serve's task proxy refuses Conductor's admin
// and workflow calls (403 PROXY_ROUTE_NOT_FORWARDED) and forwards them
// with --conductor-proxy-forward-all: the flag reaches the proxy.
func TestServe_ProxyRouteRule(t *testing.T) {
	get := func(t *testing.T, u string) (int, string) {
		t.Helper()
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var e struct{ Code string }
		_ = json.Unmarshal(b, &e)
		return resp.StatusCode, e.Code
	}
	for _, c := range []struct {
		name  string
		extra []string
		want  int
		code  string
	}{
		{"Default", nil, http.StatusForbidden, "PROXY_ROUTE_NOT_FORWARDED"},
		{"ForwardAll", []string{"--conductor-proxy-forward-all"}, http.StatusOK, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			proxyAddr := sidecartest.FreeAddr(t)
			startServe(t, t.TempDir(), sidecartest.FreeAddr(t), append([]string{"--conductor-proxy-listen", proxyAddr, "--concurrency",
				"command=0,http=0,noop=0,sleep=0"}, c.extra...)...)
			if st, code := get(t, "http://"+proxyAddr+"/api/admin/config"); st != c.want || code != c.code {
				t.Fatalf("GET /api/admin/config through the proxy: %d %q, want %d %q", st, code, c.want, c.code)
			}
			if st, _ := get(t, "http://"+proxyAddr+"/health"); st != http.StatusOK {
				t.Fatalf("GET /health through the proxy: %d, want Conductor's 200", st)
			}
		})
	}
}
