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
// with --conductor-proxy-forward-all: the flag reaches the proxy. So does
// --conductor-proxy-max-upstream-connections: the metrics show its
// slots, a quarter for updates; and --conductor-max-concurrent-calls, the
// bound of serve's own calls.
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
		slots [3]string // sidecar_proxy_upstream_slots poll, update; sidecar_conductor_call_slots
	}{
		{"Default", nil, http.StatusForbidden, "PROXY_ROUTE_NOT_FORWARDED", [3]string{"48", "16", "64"}},
		{"ForwardAll", []string{"--conductor-proxy-forward-all", "--conductor-proxy-max-upstream-connections", "10", "--conductor-max-concurrent-calls", "7"},
			http.StatusOK, "", [3]string{"8", "2", "7"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			proxyAddr := sidecartest.FreeAddr(t)
			p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), append([]string{"--conductor-proxy-listen", proxyAddr, "--concurrency",
				"command=0,http=0,noop=0,sleep=0"}, c.extra...)...)
			for i, prefix := range []string{`sidecar_proxy_upstream_slots{kind="poll"} `, `sidecar_proxy_upstream_slots{kind="update"} `, "sidecar_conductor_call_slots "} {
				if l := metricLine(t, p, prefix); l != prefix+c.slots[i] {
					t.Fatalf("/metrics: %q, want %q", l, prefix+c.slots[i])
				}
			}
			if st, code := get(t, "http://"+proxyAddr+"/api/admin/config"); st != c.want || code != c.code {
				t.Fatalf("GET /api/admin/config through the proxy: %d %q, want %d %q", st, code, c.want, c.code)
			}
			if st, _ := get(t, "http://"+proxyAddr+"/health"); st != http.StatusOK {
				t.Fatalf("GET /health through the proxy: %d, want Conductor's 200", st)
			}
		})
	}
}
