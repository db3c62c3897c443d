package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// countingControl is the control side of the replay tests: it counts the
// actions that reached it and answers what the test sets. The replay layer
// under test is the real one, over a real JetStream KV bucket.
type countingControl struct {
	calls atomic.Int64
	delay time.Duration
	err   atomic.Pointer[error]
	// notice is the State.Notice of every answer (it sizes the answers).
	notice string
}

func (c *countingControl) act() (*drain.State, error) {
	c.calls.Add(1)
	time.Sleep(c.delay)
	if e := c.err.Load(); e != nil {
		return nil, *e
	}
	return &drain.State{Notice: c.notice}, nil
}

func (c *countingControl) setErr(err error) { c.err.Store(&err) }

func (c *countingControl) Pause(context.Context, string, drain.PauseRequest) (*drain.State, error) {
	return c.act()
}
func (c *countingControl) Resume(context.Context, string, drain.ResumeRequest) (*drain.State, error) {
	return c.act()
}
func (c *countingControl) Cancel(context.Context, string, string, string) (*drain.State, error) {
	return c.act()
}
func (c *countingControl) RetryStep(context.Context, string, string, drain.RetryRequest) (*drain.State, error) {
	return c.act()
}
func (c *countingControl) ResumeLater(context.Context, string, time.Time, drain.ResumeRequest) (*drain.State, error) {
	return c.act()
}

type replayEnv struct {
	srv     *httptest.Server
	control *countingControl
	replies httpapi.Replies
	// stale sets the replies' StaleAfter.
	stale func(time.Duration)
	reg   *prometheus.Registry
}

// replyBackends are the two stores of kept replies: the JetStream KV
// bucket (the default) and PostgreSQL's table (serve --store postgres://;
// skipped without a PostgreSQL, see package pgtest).
var replyBackends = []string{"jetstream", "postgres"}

// forEachBackend runs test on a fresh replayEnv of each backend.
func forEachBackend(t *testing.T, test func(t *testing.T, e *replayEnv)) {
	for _, b := range replyBackends {
		t.Run(b, func(t *testing.T) { test(t, newReplayEnvTB(t, b)) })
	}
}

func openReplies(t testing.TB, backend string) (httpapi.Replies, func(time.Duration)) {
	ctx := context.Background()
	if backend == "postgres" {
		store, err := pgstore.Open(ctx, pgtest.URL(t), pgstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(store.Close)
		replies, err := httpapi.OpenPostgresReplies(ctx, store.Pool(), time.Hour, 0)
		if err != nil {
			t.Fatal(err)
		}
		return replies, func(d time.Duration) { replies.StaleAfter = d }
	}
	js, _ := natstest.Start(t)
	replies, err := httpapi.OpenKVReplies(ctx, js, httpapi.KVRepliesOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return replies, func(d time.Duration) { replies.StaleAfter = d }
}

func newReplayEnvTB(t testing.TB, backend string) *replayEnv {
	t.Helper()
	replies, stale := openReplies(t, backend)
	return newReplayEnvWith(t, replies, stale)
}

// newReplayEnvWith serves the replay tests' API over replies.
func newReplayEnvWith(t testing.TB, replies httpapi.Replies, stale func(time.Duration)) *replayEnv {
	t.Helper()
	ctx := context.Background()
	runs := memstore.New(statestore.ProjectorOptions{})
	for _, run := range []string{"run-1", "run-2"} {
		if _, err := runs.Append(ctx, storetest.Event(run, statestore.RunStarted, "")); err != nil {
			t.Fatal(err)
		}
	}
	e := &replayEnv{control: &countingControl{}, replies: replies, stale: stale, reg: prometheus.NewRegistry()}
	api := httpapi.NewServer(httpapi.Options{Log: runs, Control: e.control, Replies: replies, Registerer: e.reg})
	e.srv = httptest.NewServer(api.Handler())
	t.Cleanup(e.srv.Close)
	return e
}

type replyAnswer struct {
	status   int
	body     string
	replayed bool
}

func (e *replayEnv) post(t *testing.T, path, key, body string) replyAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(httpapi.IdempotencyKeyHeader, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return replyAnswer{resp.StatusCode, string(bytes.TrimSpace(b)), resp.Header.Get(httpapi.ReplayedHeader) == "true"}
}

func TestMain(m *testing.M) { pgtest.Main(m) }

func codeOf(t *testing.T, body string) string {
	t.Helper()
	var e struct{ Code string }
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not an error body: %s", body)
	}
	return e.Code
}

func TestIdempotencyKey_ReplaysTheFirstAnswer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *replayEnv) {
		first := e.post(t, "/v1/runs/run-1/pause", "k-1", `{"reason":"deploy"}`)
		if first.status != http.StatusOK || first.replayed {
			t.Fatalf("first pause: %+v", first)
		}
		again := e.post(t, "/v1/runs/run-1/pause", "k-1", `{"reason":"deploy"}`)
		if again.status != first.status || again.body != first.body || !again.replayed {
			t.Fatalf("replay differs:\nfirst  %+v\nreplay %+v", first, again)
		}
		if n := e.control.calls.Load(); n != 1 {
			t.Fatalf("control reached %d times, want 1", n)
		}
		// Without a key, or with another key, the action runs again.
		e.post(t, "/v1/runs/run-1/pause", "", `{"reason":"deploy"}`)
		e.post(t, "/v1/runs/run-1/pause", "k-2", `{"reason":"deploy"}`)
		// The key is scoped to the run and the action.
		e.post(t, "/v1/runs/run-2/pause", "k-1", `{"reason":"deploy"}`)
		e.post(t, "/v1/runs/run-1/resume", "k-1", "")
		if n := e.control.calls.Load(); n != 5 {
			t.Fatalf("control reached %d times, want 5", n)
		}
		if got := controlCount(t, e.reg, "pause", "replayed"); got != 1 {
			t.Fatalf("replayed pauses counted %v, want 1", got)
		}
		if got := controlCount(t, e.reg, "pause", "ok"); got != 4 {
			t.Fatalf("ok pauses counted %v, want 4", got)
		}
	})
}

func TestIdempotencyKey_ReusedForAnotherBodyIsRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *replayEnv) {
		e.post(t, "/v1/runs/run-1/pause", "k", `{"reason":"a"}`)
		got := e.post(t, "/v1/runs/run-1/pause", "k", `{"reason":"b"}`)
		if got.status != http.StatusUnprocessableEntity || codeOf(t, got.body) != httpapi.CodeKeyReused {
			t.Fatalf("reused key: %+v", got)
		}
		if n := e.control.calls.Load(); n != 1 {
			t.Fatalf("control reached %d times, want 1", n)
		}
	})
}

func TestIdempotencyKey_RefusalsAreKeptFailuresAreNot(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *replayEnv) {
		e.control.setErr(&statestore.Error{Code: statestore.CodeInvalidTransition, Message: "RunResumed is not allowed from RUNNING"})
		first := e.post(t, "/v1/runs/run-1/resume", "k", "")
		if first.status != http.StatusConflict {
			t.Fatalf("resume of a running run: %+v", first)
		}
		// The first replyAnswer stands even though the action would now succeed.
		e.control.setErr(nil)
		if again := e.post(t, "/v1/runs/run-1/resume", "k", ""); again.status != http.StatusConflict || !again.replayed || again.body != first.body {
			t.Fatalf("409 not replayed: %+v", again)
		}
		// Conductor down: recorded but not told (503). Not kept: the retry
		// with the same key runs the action again and converges.
		e.control.setErr(&drain.EngineError{State: &drain.State{}, Err: errors.New("connection refused")})
		if got := e.post(t, "/v1/runs/run-1/pause", "k-503", ""); got.status != http.StatusServiceUnavailable {
			t.Fatalf("engine down: %+v", got)
		}
		e.control.setErr(nil)
		if got := e.post(t, "/v1/runs/run-1/pause", "k-503", ""); got.status != http.StatusOK || got.replayed {
			t.Fatalf("retry after a 503: %+v", got)
		}
		if n := e.control.calls.Load(); n != 3 {
			t.Fatalf("control reached %d times, want 3", n)
		}
	})
}

func TestIdempotencyKey_ConcurrentRequestsRunOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *replayEnv) {
		e.control.delay = 300 * time.Millisecond
		var wg sync.WaitGroup
		answers := make([]replyAnswer, 8)
		for i := range answers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i] = e.post(t, "/v1/runs/run-1/cancel", "same", "")
			}()
		}
		wg.Wait()
		if n := e.control.calls.Load(); n != 1 {
			t.Fatalf("control reached %d times by 8 concurrent requests with one key, want 1", n)
		}
		for _, a := range answers {
			switch {
			case a.status == http.StatusOK:
			case a.status == http.StatusConflict && codeOf(t, a.body) == httpapi.CodeInProgress:
			default:
				t.Fatalf("unexpected replyAnswer %+v", a)
			}
		}
		if a := e.post(t, "/v1/runs/run-1/cancel", "same", ""); a.status != http.StatusOK || !a.replayed {
			t.Fatalf("after the first answered: %+v", a)
		}
	})
}

func TestIdempotencyKey_BadKeyAndStaleClaims(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *replayEnv) {
		got := e.post(t, "/v1/runs/run-1/pause", strings.Repeat("k", httpapi.MaxIdempotencyKeyBytes+1), "")
		if got.status != http.StatusBadRequest || codeOf(t, got.body) != httpapi.CodeBadRequest {
			t.Fatalf("long key: %+v", got)
		}
		if n := e.control.calls.Load(); n != 0 {
			t.Fatalf("a refused request reached the control")
		}
		// A claim whose process died blocks its key until it is stale.
		ctx := context.Background()
		if r, err := e.replies.Claim(ctx, "dead", "fp"); r != nil || err != nil {
			t.Fatalf("first claim: %v %v", r, err)
		}
		if _, err := e.replies.Claim(ctx, "dead", "fp"); !errors.Is(err, httpapi.ErrReplyPending) {
			t.Fatalf("claim of a held key: %v", err)
		}
		e.stale(0)
		if r, err := e.replies.Claim(ctx, "dead", "fp"); r != nil || err != nil {
			t.Fatalf("stale claim not taken over: %v %v", r, err)
		}
	})
}

// controlCount reads sidecar_control_requests_total{action,result}.
func controlCount(t *testing.T, reg *prometheus.Registry, action, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sidecar_control_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["action"] == action && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no sidecar_control_requests_total{action=%q,result=%q}", action, result)
	return 0
}

// TestIdempotencyKey_ScopedToThePrincipal: each principal has keys of its
// own. Another principal sending a key someone else used, with the same
// body, is answered as a key never seen (its action runs, its answer is
// kept for it): it learns nothing of the first request, not even that the
// key was used, and never sees the first answer. Each principal's retry
// replays its own answer.
func TestIdempotencyKey_ScopedToThePrincipal(t *testing.T) {
	for _, backend := range replyBackends {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			replies, _ := openReplies(t, backend)
			runs := memstore.New(statestore.ProjectorOptions{})
			if _, err := runs.Append(ctx, storetest.Event("run-1", statestore.RunStarted, "")); err != nil {
				t.Fatal(err)
			}
			creds, err := httpapi.LoadCredentials(writeTokens(t, t.TempDir(), tokensYAML(
				principal("root", "tok-admin", "admin", ""),
				principal("ops-2", "tok-ops-2", "operator", ""),
			)))
			if err != nil {
				t.Fatal(err)
			}
			control := &countingControl{}
			srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: runs, Control: control, Replies: replies, Auth: creds}).Handler())
			t.Cleanup(srv.Close)
			post := func(token string) replyAnswer {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/runs/run-1/pause", strings.NewReader(`{"reason":"deploy"}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set(httpapi.IdempotencyKeyHeader, "shared-key")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return replyAnswer{resp.StatusCode, string(bytes.TrimSpace(b)), resp.Header.Get(httpapi.ReplayedHeader) == "true"}
			}
			if first := post("tok-admin"); first.status != http.StatusOK {
				t.Fatalf("admin's pause: %+v", first)
			}
			got := post("tok-ops-2")
			if got.status != http.StatusOK || got.replayed {
				t.Fatalf("another principal sending the same key: got %+v, want its own answer, as for a key never seen", got)
			}
			if again := post("tok-admin"); again.status != http.StatusOK || !again.replayed {
				t.Fatalf("the admin's own retry: %+v, want the replay", again)
			}
			if again := post("tok-ops-2"); again.status != http.StatusOK || !again.replayed {
				t.Fatalf("the other principal's retry: %+v, want the replay of its own answer", again)
			}
			if n := control.calls.Load(); n != 2 {
				t.Fatalf("control reached %d times, want 2 (once for each principal)", n)
			}
		})
	}
}
