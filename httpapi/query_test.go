package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestServer_UnknownQueryParameter: a query parameter a route does not
// take, or one given twice, is 400 BAD_REQUEST naming it, as an unknown
// body field is. Ignored, a typo in a filter (lableSelector, aftreSeq)
// answered every run, or the log from its first event.
func TestServer_UnknownQueryParameter(t *testing.T) {
	ctx := context.Background()
	store, list := openListedLog(t, natstest.Connect(t, natstestServer(t)))
	if _, err := store.Append(ctx, storetest.Event("run-q", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := list.WaitIndexed(wctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: store, List: list, Logger: zaptest.NewLogger(t)}).Handler())
	t.Cleanup(srv.Close)
	call := func(method, path string) (int, httpapi.Error) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(`{"reason":"q"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e httpapi.Error
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e
	}
	for _, tc := range []struct{ method, path, field string }{
		{"GET", "/v1/runs?lableSelector=team%3Ddata", "lableSelector"},
		{"GET", "/v1/runs?planId=p&planId=q", "planId"},
		{"GET", "/v1/runs/run-q/events?aftreSeq=3", "aftreSeq"},
		{"GET", "/v1/runs/run-q/events?afterSeq=1&afterSeq=2", "afterSeq"},
		{"GET", "/v1/runs/run-q?include=archived", "include"},
		{"POST", "/v1/runs/run-q/pause?force=true", "force"},
	} {
		if code, e := call(tc.method, tc.path); code != http.StatusBadRequest || e.Code != httpapi.CodeBadRequest || e.Field != tc.field {
			t.Errorf("%s %s: %d %+v, want 400 BAD_REQUEST naming %s", tc.method, tc.path, code, e, tc.field)
		}
	}
	for _, path := range []string{"/v1/runs?status=RUNNING&status=PAUSED&limit=5", "/v1/runs/run-q/events?afterSeq=0&limit=10", "/v1/runs/run-q", "/healthz?verbose=1"} {
		if code, e := call("GET", path); code != http.StatusOK {
			t.Errorf("GET %s: %d %+v, want 200", path, code, e)
		}
	}
}
