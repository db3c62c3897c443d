package adapter

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"go.uber.org/zap/zaptest"
)

// TestClient_ManyOnASlowConductor: Conductor acts on a bulk request's
// workflows one after the other, so a bulk call of many workflows takes
// longer than a single call. Here a proxy in front of the real Conductor
// answers each bulk terminate 1.3 s late, longer than the client's 1 s
// timeout for one call: the 80 workflows (4 requests of 20, each given
// 2 s more, so that a loaded Conductor's own time fits) are terminated,
// and the client says so, rather than reporting each one
// ENGINE_UNAVAILABLE.
func TestClient_ManyOnASlowConductor(t *testing.T) {
	target, err := url.Parse(conductortest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/workflow/bulk/terminate") {
			time.Sleep(1300 * time.Millisecond)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(slow.Close)
	ctx := context.Background()
	c, err := NewClient(ClientOptions{BaseURL: slow.URL + target.Path, Timeout: time.Second, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	def, _, first := startTestWorkflow(t, c)
	ids := []string{first}
	for range 79 {
		id, err := c.StartWorkflow(ctx, model.StartWorkflowRequest{Name: def.Name, Version: 1, Input: map[string]any{"runId": "r"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if errs := c.TerminateMany(ctx, ids, "over"); len(errs) != 0 {
		for id, err := range errs {
			t.Fatalf("terminate of %d workflows: %d errors, e.g. %s: %v; want none", len(ids), len(errs), id, err)
		}
	}
	for _, id := range ids {
		waitStatus(t, c, id, model.TerminatedWorkflow)
	}
}
