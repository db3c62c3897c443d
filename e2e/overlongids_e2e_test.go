package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
)

// TestE2E_OverlongIDsLeaveServeConnected: requests that carry a run or
// step id longer than any run may have, on every route that takes one,
// are refused or not found, and leave serve connected to its store: ready,
// live, and able to start a run. One such GET used to cut serve off its
// NATS for good.
func TestE2E_OverlongIDsLeaveServeConnected(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	long := strings.Repeat("k", 4000)
	base := "http://" + p.addr + "/v1/runs/" + long
	for _, r := range []struct{ method, url string }{
		{"GET", base}, {"GET", base + "/events"},
		{"POST", base + "/pause"}, {"POST", base + "/resume"}, {"POST", base + "/cancel"},
		{"POST", "http://" + p.addr + "/v1/runs/run-1/steps/" + long + "/retry"},
	} {
		req, _ := http.NewRequest(r.method, r.url, strings.NewReader(`{"reason":"probe"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %d-byte id: %v", r.method, len(long), err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 4 {
			t.Errorf("%s %s...: %d, want a 4xx", r.method, r.url[:60], resp.StatusCode)
		}
	}
	for _, path := range []string{"/readyz", "/healthz"} {
		resp, err := http.Get("http://" + p.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s after the long ids: %d, want 200", path, resp.StatusCode)
		}
	}
	pl := mustPlan(t, `{"planId":"`+uniq("longid")+`","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`)
	st := submit(t, p, pl, uniq("req"))
	if v := waitTerminal(t, p, st.RunID, 2*time.Minute); v.Status != "COMPLETED" {
		t.Fatalf("a run after the long ids: %s", v.Status)
	}
}
