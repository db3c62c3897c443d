package main

import (
	"flag"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
)

// TestAPIConfig_AllowedHosts: --api-allowed-hosts reaches the API (a Host
// it names is answered, another is refused), and a value with a port is
// a problem of the configuration.
func TestAPIConfig_AllowedHosts(t *testing.T) {
	var cfg apiConfig
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.registerFlags(fs)
	if err := fs.Parse([]string{"--api-allowed-hosts", "sidecar.jobs.svc, sidecar"}); err != nil {
		t.Fatal(err)
	}
	if p := cfg.validate("127.0.0.1:8787"); len(p) != 0 {
		t.Fatalf("validate: %v", p)
	}
	opts := httpapi.Options{Log: memstore.New(statestore.ProjectorOptions{}), Logger: zaptest.NewLogger(t)}
	if err := cfg.apply(&opts, zaptest.NewLogger(t)); err != nil {
		t.Fatal(err)
	}
	h := httpapi.NewServer(opts).Handler()
	for host, want := range map[string]int{"sidecar.jobs.svc:8787": http.StatusNotFound, "sidecar": http.StatusNotFound, "evil.example": http.StatusForbidden} {
		req := httptest.NewRequest("GET", "/v1/runs/none", nil)
		req.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != want {
			t.Errorf("Host %s: %d %s, want %d", host, w.Code, w.Body, want)
		}
	}
	bad := apiConfig{AllowedHosts: "sidecar:8787"}
	if p := bad.validate("127.0.0.1:8787"); len(p) != 1 || !strings.Contains(p[0], "--api-allowed-hosts") {
		t.Fatalf("a host with a port: %v, want one problem naming --api-allowed-hosts", p)
	}
}
