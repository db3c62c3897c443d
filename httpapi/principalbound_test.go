package httpapi_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// heldControl holds every pause until release is closed, and tells on
// held when one arrives.
type heldControl struct {
	countingControl
	held    chan string
	release chan struct{}
}

func (c *heldControl) Pause(_ context.Context, runID string, _ drain.PauseRequest) (*drain.State, error) {
	c.held <- runID
	<-c.release
	return c.act()
}

// TestServer_WritingRequestsBoundedPerPrincipal: a principal with
// MaxRequestsPerPrincipal writing requests in progress gets 429
// TOO_MANY_REQUESTS with Retry-After for the next one, at once, while
// another principal's request and the first principal's reads go on; once
// one of its requests is answered, its next is taken.
func TestServer_WritingRequestsBoundedPerPrincipal(t *testing.T) {
	ctx := context.Background()
	runs := memstore.New(statestore.ProjectorOptions{})
	for _, id := range []string{"run-1", "run-2", "run-3", "run-4"} {
		if _, err := runs.Append(ctx, storetest.Event(id, statestore.RunStarted, "")); err != nil {
			t.Fatal(err)
		}
	}
	creds, err := httpapi.LoadCredentials(writeTokens(t, t.TempDir(), tokensYAML(
		principal("flood", "tok-flood", "operator, viewer", ""),
		principal("other", "tok-other", "operator", ""),
	)))
	if err != nil {
		t.Fatal(err)
	}
	control := &heldControl{held: make(chan string, 8), release: make(chan struct{})}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: runs, Control: control, Auth: creds, MaxRequestsPerPrincipal: 2}).Handler())
	t.Cleanup(srv.Close)
	var released sync.Once
	release := func() { released.Do(func() { close(control.release) }) }
	t.Cleanup(release) // before the server closes: a failed test leaves none held
	type answer struct {
		status     int
		body       string
		retryAfter string
	}
	do := func(method, path, token string) answer {
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"reason":"deploy"}`)
		}
		req, _ := http.NewRequest(method, srv.URL+path, body)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Error(err)
			return answer{}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{resp.StatusCode, string(b), resp.Header.Get("Retry-After")}
	}
	var wg sync.WaitGroup
	held := make([]answer, 2)
	for i, id := range []string{"run-1", "run-2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			held[i] = do(http.MethodPost, "/v1/runs/"+id+"/pause", "tok-flood")
		}()
	}
	for range 2 {
		select {
		case <-control.held:
		case <-time.After(10 * time.Second):
			t.Fatal("the principal's first two pauses did not reach the controller")
		}
	}
	got := do(http.MethodPost, "/v1/runs/run-3/pause", "tok-flood")
	if got.status != http.StatusTooManyRequests || codeOf(t, got.body) != httpapi.CodeTooManyRequests || got.retryAfter != "1" {
		t.Fatalf("the principal's third pause while two are held: %+v, want 429 %s with Retry-After 1", got, httpapi.CodeTooManyRequests)
	}
	if got := do(http.MethodGet, "/v1/runs/run-3", "tok-flood"); got.status != http.StatusOK {
		t.Fatalf("the principal's read while two pauses are held: %+v, want 200", got)
	}
	other := make(chan answer, 1)
	go func() { other <- do(http.MethodPost, "/v1/runs/run-4/pause", "tok-other") }()
	select {
	case id := <-control.held:
		if id != "run-4" {
			t.Fatalf("held %s, want the other principal's run-4", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("another principal's pause did not reach the controller while the first principal was at its bound")
	}
	release()
	wg.Wait()
	if got := <-other; got.status != http.StatusOK {
		t.Fatalf("the other principal's pause: %+v", got)
	}
	for i, a := range held {
		if a.status != http.StatusOK {
			t.Fatalf("held pause %d: %+v", i, a)
		}
	}
	go func() {
		for range control.held {
		}
	}()
	if got := do(http.MethodPost, "/v1/runs/run-3/pause", "tok-flood"); got.status != http.StatusOK {
		t.Fatalf("the principal's pause once its others were answered: %+v, want 200", got)
	}
}
