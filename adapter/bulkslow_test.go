package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"go.uber.org/zap/zaptest"
)

// TestClient_ManyOnASlowConductor: Conductor acts on a bulk request's
// workflows one after the other, so a bulk call of many workflows takes
// longer than a single call. Here a proxy in front of the real Conductor
// answers each bulk terminate no sooner than 1.3 s after it came, longer
// than the client's 1 s timeout for one call: the 80 workflows (4 requests of 20, each given
// 2 s more, so that a loaded Conductor's own time fits) are terminated,
// and the client says so, rather than reporting each one
// ENGINE_UNAVAILABLE.
func TestClient_ManyOnASlowConductor(t *testing.T) {
	target, err := url.Parse(conductortest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := conductortest.ReverseProxy(t, target)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/workflow/bulk/terminate") {
			proxy.ServeHTTP(w, r)
			return
		}
		// Conductor's answer, given no sooner than 1.3 s after the
		// request: later than one call's timeout however fast Conductor
		// was, and no later than Conductor itself (a loaded one takes
		// seconds for 20 workflows) when it was slower.
		arrived := time.Now()
		rec := httptest.NewRecorder()
		proxy.ServeHTTP(rec, r)
		time.Sleep(time.Until(arrived.Add(1300 * time.Millisecond)))
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(slow.Close)
	ctx := context.Background()
	c, err := NewClient(ClientOptions{BaseURL: slow.URL + target.Path, Timeout: time.Second, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	// The workflows are made with the default timeout: the 1 s one is the
	// bulk call's, and a loaded Conductor takes longer to register a
	// definition.
	setup, err := NewClient(ClientOptions{BaseURL: target.String(), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	def, _, first := startTestWorkflow(t, setup)
	ids := []string{first}
	for range 79 {
		id, err := setup.StartWorkflow(ctx, model.StartWorkflowRequest{Name: def.Name, Version: 1, Input: map[string]any{"runId": "r"}})
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
		waitStatus(t, setup, id, model.TerminatedWorkflow)
	}
}

// TestClient_PauseCallsFitTheLongestPauseCall: no bulk pause or resume
// request carries more workflows than its time per workflow lets finish
// within LongestPauseCall, the bound on a late call that a follower on
// another replica waits out twice (drain.GraceFor). 240 ids (of no
// workflow: Conductor refuses each, which is asked again on its own) go
// to each of PauseMany and ResumeMany.
func TestClient_PauseCallsFitTheLongestPauseCall(t *testing.T) {
	target, err := url.Parse(conductortest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := conductortest.ReverseProxy(t, target)
	var mu sync.Mutex
	var sizes []int
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/workflow/bulk/pause") || strings.HasSuffix(r.URL.Path, "/workflow/bulk/resume") {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				t.Error(err)
			}
			var ids []string
			if err := json.Unmarshal(body, &ids); err != nil {
				t.Errorf("bulk body %q: %v", body, err)
			}
			mu.Lock()
			sizes = append(sizes, len(ids))
			mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(counting.Close)
	c, err := NewClient(ClientOptions{BaseURL: counting.URL + target.Path, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 240)
	for i := range ids {
		ids[i] = fmt.Sprintf("no-such-workflow-%d-%d", time.Now().UnixNano(), i)
	}
	if errs := c.PauseMany(t.Context(), ids); len(errs) != len(ids) {
		t.Fatalf("pause of %d workflows that do not exist: %d errors", len(ids), len(errs))
	}
	_ = c.ResumeMany(t.Context(), ids)
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, n := range sizes {
		total += n
		if d := DefaultTimeout + time.Duration(n)*bulkPerWorkflow; d > c.LongestPauseCall() {
			t.Fatalf("a bulk request of %d workflows may last %v, longer than LongestPauseCall %v (requests %v)", n, d, c.LongestPauseCall(), sizes)
		}
	}
	if total != 2*len(ids) {
		t.Fatalf("the bulk requests carried %d ids, want %d (requests %v)", total, 2*len(ids), sizes)
	}
}
