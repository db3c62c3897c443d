package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestServer_ListScope: GET /v1/runs needs the viewer role, and a scoped
// principal lists only the runs of its scope, whatever filter it asks for
// (a tenant outside it lists nothing); the run list is the real one, on
// a real log.
func TestServer_ListScope(t *testing.T) {
	ctx := context.Background()
	store, list := openListedLog(t, natstest.Connect(t, natstestServer(t)))
	for _, r := range []struct{ id, tenant string }{{"a1", "t1"}, {"a2", "t1"}, {"b1", "t2"}} {
		w := storetest.Event(r.id, statestore.RunStarted, "")
		w.TenantID = r.tenant
		storetest.Rekey(w)
		if _, err := store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := list.WaitIndexed(wctx); err != nil {
		t.Fatal(err)
	}
	creds, err := httpapi.LoadCredentials(writeTokens(t, t.TempDir(), tokensYAML(
		principal("viewer-t1", "tok-viewer", "viewer", "tenantId: t1"),
		principal("ci", "tok-ci", "submitter", ""),
		principal("root", "tok-admin", "admin", ""),
	)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: store, List: list, Auth: creds, Logger: zaptest.NewLogger(t)}).Handler())
	t.Cleanup(srv.Close)
	page := func(token, query string) (int, httpapi.RunList) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/runs"+query, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out httpapi.RunList
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	get := func(token, query string) (int, []string) {
		t.Helper()
		status, out := page(token, query)
		var ids []string
		for _, r := range out.Runs {
			ids = append(ids, r.RunID)
		}
		slices.Sort(ids)
		return status, ids
	}
	for _, c := range []struct {
		token, query string
		status       int
		want         []string
	}{
		{"tok-admin", "", 200, []string{"a1", "a2", "b1"}},
		{"tok-viewer", "", 200, []string{"a1", "a2"}},
		{"tok-viewer", "?tenantId=t2", 200, nil},
		{"tok-viewer", "?tenantId=t1", 200, []string{"a1", "a2"}},
		{"tok-viewer", "?watch=true&timeoutSeconds=0", 200, []string{"a1", "a2"}},
		{"tok-viewer", "?watch=true&timeoutSeconds=0&tenantId=t2", 200, nil},
		{"tok-ci", "", 403, nil},
		{"", "", 401, nil},
		{"tok-admin", "?updatedSince=2000-01-01T00:00:00Z", 200, []string{"a1", "a2", "b1"}},
		{"tok-admin", "?updatedSince=" + url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339Nano)), 200, nil},
		{"tok-viewer", "?updatedSince=2000-01-01T00:00:00Z", 200, []string{"a1", "a2"}},
		{"tok-admin", "?updatedSince=yesterday", 400, nil},
	} {
		if status, ids := get(c.token, c.query); status != c.status || !slices.Equal(ids, c.want) {
			t.Errorf("%s %q: %d %v, want %d %v", c.token, c.query, status, ids, c.status, c.want)
		}
	}
	// A filter outside the caller's scope lists nothing, with the list's
	// revision as any other page has it (a watch starts from it).
	_, all := page("tok-admin", "")
	if _, out := page("tok-viewer", "?tenantId=t2"); out.Revision != all.Revision || out.IndexedThrough != all.IndexedThrough || all.Revision == 0 {
		t.Errorf("a page outside the scope: revision %d, indexedThrough %d; want the list's %d and %d", out.Revision, out.IndexedThrough, all.Revision, all.IndexedThrough)
	}
}

func natstestServer(t testing.TB) *natsstore.Embedded {
	_, srv := natstest.Start(t)
	return srv
}

// openListedLog opens the event log and the run list on js, both closed
// when t ends.
func openListedLog(t testing.TB, js jetstream.JetStream) (*natsstore.Store, *runlist.List) {
	t.Helper()
	ctx := context.Background()
	log := zaptest.NewLogger(t)
	if _, fuzz := t.(*testing.F); fuzz {
		log = zap.NewNop() // a fuzz target may not log through f
	}
	store, err := natsstore.Open(ctx, js, natsstore.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	list, err := runlist.Open(ctx, js, runlist.Options{Log: store, Poll: 10 * time.Millisecond, Timeout: 500 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = list.Close(context.Background()) })
	return store, list
}

// TestServer_CloseEndsWatches: a list watch (a console page, `runs -w`)
// waits up to a minute for a change; closing the server answers it at once
// with what changed so far, instead of holding shutdown until the watch's
// wait runs out.
// openListServer opens the API over a log and its run list (indexed: a
// list still syncing answers 503) on a loopback listener of its own.
func openListServer(t *testing.T) (*httpapi.Server, net.Listener) {
	t.Helper()
	store, list := openListedLog(t, natstest.Connect(t, natstestServer(t)))
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if _, err := list.WaitIndexed(wctx); err != nil {
		t.Fatal(err)
	}
	api := httpapi.NewServer(httpapi.Options{Log: store, List: list, Logger: zaptest.NewLogger(t)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api.Open(ln)
	return api, ln
}

func TestServer_CloseEndsWatches(t *testing.T) {
	api, ln := openListServer(t)
	answered := make(chan int, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/v1/runs?watch=true&timeoutSeconds=60")
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	time.Sleep(300 * time.Millisecond) // the watch is waiting
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := api.Close(ctx); err != nil {
		t.Fatalf("close with a watch waiting: %v", err)
	}
	if code := <-answered; code != http.StatusOK {
		t.Fatalf("watch answered %d, want 200 (an empty change set)", code)
	}
}

// TestServer_ListWatchEndsWithItsPrincipal: a list watch that waits while
// its token is removed from the tokens file (or its scope changed) does
// not answer the change it woke for as the principal it no longer is: it
// answers 401, and the caller asks again with what it holds now.
func TestServer_ListWatchEndsWithItsPrincipal(t *testing.T) {
	ctx := context.Background()
	store, list := openListedLog(t, natstest.Connect(t, natstestServer(t)))
	appendRun := func(id, tenant string) {
		t.Helper()
		w := storetest.Event(id, statestore.RunStarted, "")
		w.TenantID = tenant
		storetest.Rekey(w)
		if _, err := store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	appendRun("a1", "t1")
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := list.WaitIndexed(wctx); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := writeTokens(t, dir, tokensYAML(principal("viewer-t1", "tok-viewer", "viewer", "tenantId: t1"), principal("root", "tok-admin", "admin", "")))
	creds, err := httpapi.LoadCredentials(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: store, List: list, Auth: creds, Logger: zaptest.NewLogger(t)}).Handler())
	t.Cleanup(srv.Close)
	for _, c := range []struct {
		name   string
		tokens string
	}{
		{"TokenRemoved", tokensYAML(principal("root", "tok-admin", "admin", ""))},
		{"ScopeMoved", tokensYAML(principal("viewer-t1", "tok-viewer", "viewer", "tenantId: t2"), principal("root", "tok-admin", "admin", ""))},
	} {
		t.Run(c.name, func(t *testing.T) {
			writeTokens(t, dir, tokensYAML(principal("viewer-t1", "tok-viewer", "viewer", "tenantId: t1"), principal("root", "tok-admin", "admin", "")))
			if err := creds.Reload(); err != nil {
				t.Fatal(err)
			}
			// The list's revision now: the watch waits for a change after it.
			req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/runs", nil)
			req.Header.Set("Authorization", "Bearer tok-admin")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var now httpapi.RunList
			err = json.NewDecoder(resp.Body).Decode(&now)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			rev := now.Revision
			done := make(chan int, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/runs?watch=true&timeoutSeconds=30&revision=%d", srv.URL, rev), nil)
				req.Header.Set("Authorization", "Bearer tok-viewer")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					done <- 0
					return
				}
				resp.Body.Close()
				done <- resp.StatusCode
			}()
			time.Sleep(300 * time.Millisecond) // the watch waits
			writeTokens(t, dir, c.tokens)
			if err := creds.Reload(); err != nil {
				t.Fatal(err)
			}
			id := "t1-" + c.name
			appendRun(id, "t1") // the change the watch wakes for
			select {
			case status := <-done:
				if status != http.StatusUnauthorized {
					t.Fatalf("the watch answered %d after its principal changed, want 401", status)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the watch did not answer the change")
			}
		})
	}
}

// TestServer_ListWatchValue: watch takes true (a watch) or false (a
// page); any other value is refused, so that a client that meant a watch
// does not poll in a tight loop on pages answered at once.
func TestServer_ListWatchValue(t *testing.T) {
	api, ln := openListServer(t)
	t.Cleanup(func() { _ = api.Close(context.Background()) })
	for _, tt := range []struct {
		query  string
		status int
	}{
		{"watch=true&timeoutSeconds=0", http.StatusOK},
		{"watch=false", http.StatusOK},
		{"watch=1", http.StatusBadRequest},
		{"watch=yes", http.StatusBadRequest},
		{"watch=TRUE", http.StatusBadRequest},
		{"watch=", http.StatusBadRequest},
	} {
		resp, err := http.Get("http://" + ln.Addr().String() + "/v1/runs?" + tt.query)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Code, Field string }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || (tt.status == http.StatusBadRequest && (body.Code != "BAD_REQUEST" || body.Field != "watch")) {
			t.Errorf("GET /v1/runs?%s: %d %+v, want %d (BAD_REQUEST naming watch when refused)", tt.query, resp.StatusCode, body, tt.status)
		}
	}
}
