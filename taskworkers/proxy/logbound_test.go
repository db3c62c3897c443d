package proxy_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/proctest"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// Conductor away, every worker call the proxy forwards is answered 502
// CONDUCTOR_UNAVAILABLE, and the log says so once a minute, not once a
// call: a fleet of workers retrying their calls wrote a line each.
func TestProxy_ConductorAwayIsLoggedBounded(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	p, err := proxy.New(nil, proxy.Options{Conductor: "http://" + proctest.FreeAddr(t) + "/api", Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.Open(ln)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	for i := range 20 {
		res, err := http.Get("http://" + ln.Addr().String() + "/api/metadata/taskdefs/any")
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Code string }
		_ = json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadGateway || body.Code != proxy.CodeConductorUnavailable {
			t.Fatalf("call %d: %d %s, want 502 %s", i, res.StatusCode, body.Code, proxy.CodeConductorUnavailable)
		}
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("%d warnings for 20 calls with Conductor away, want 1:\n%v", n, logs.All())
	}
}
