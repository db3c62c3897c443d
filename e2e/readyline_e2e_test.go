package e2e

import (
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
)

// TestE2E_ReadyLineFollowsReadiness: serve started while Conductor does
// not answer serves (live, /readyz 503) and says why it is not ready,
// without the "sidecar ready" line scripts wait for; once Conductor
// answers, the line follows, with the API's address, as /readyz turns 200.
func TestE2E_ReadyLineFollowsReadiness(t *testing.T) {
	t.Parallel() // its own serve and data dir
	target, err := url.Parse(conductortest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	front := sidecartest.FreeAddr(t)
	s := sidecartest.Start(t, sidecartest.Options{ConductorURL: "http://" + front + "/api", Probe: "/healthz"})
	logText := func() string {
		b, _ := os.ReadFile(s.Log.Name())
		return string(b)
	}
	sidecartest.WaitFor(t, "the line saying why serve is not ready", time.Minute, func() bool {
		return strings.Contains(logText(), "sidecar serving, not ready yet")
	})
	if strings.Contains(logText(), "sidecar ready") {
		t.Fatal(`"sidecar ready" logged while Conductor does not answer`)
	}
	if res, err := http.Get(s.URL() + "/readyz"); err != nil || res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while Conductor does not answer: %v %v, want 503", res, err)
	}
	// Conductor answers from now on.
	ln, err := net.Listen("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: conductortest.ReverseProxy(t, target), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	sidecartest.WaitFor(t, `"sidecar ready"`, 2*time.Minute, func() bool {
		return strings.Contains(logText(), "sidecar ready")
	})
	if !strings.Contains(logText(), s.Addr) {
		t.Fatalf("the ready line does not name the API's address %s", s.Addr)
	}
	if res, err := http.Get(s.URL() + "/readyz"); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("/readyz once Conductor answers: %v %v, want 200", res, err)
	}
}
