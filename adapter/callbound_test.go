package adapter

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
)

// TestClient_CallsAtConductorAreBounded: of many calls made at once, at
// most MaxConcurrentCalls are at Conductor together; the others wait for
// a place (sidecar_conductor_calls_waiting) and all succeed. Batch polls
// are not counted: the poll loops are few and each holds its long poll.
// Conductor here is the real one behind a counter that answers each call
// 50 ms late (a busy Conductor), so that calls overlap.
func TestClient_CallsAtConductorAreBounded(t *testing.T) {
	const bound, calls, polls = 4, 40, 6
	u, err := url.Parse(conductortest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	rp := conductortest.ReverseProxy(t, u)
	var mu sync.Mutex
	now, most, pollsNow, mostPolls := 0, 0, 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		poll := r.URL.Query().Has("count")
		mu.Lock()
		if poll {
			pollsNow++
			mostPolls = max(mostPolls, pollsNow)
		} else {
			now++
			most = max(most, now)
		}
		mu.Unlock()
		time.Sleep(50 * time.Millisecond)
		rp.ServeHTTP(w, r)
		mu.Lock()
		if poll {
			pollsNow--
		} else {
			now--
		}
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	c, err := NewClient(ClientOptions{BaseURL: srv.URL + u.Path, MaxConcurrentCalls: bound, Metrics: NewMetrics(reg), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	waiting := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "sidecar_conductor_calls_waiting" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no sidecar_conductor_calls_waiting")
		return 0
	}
	var wg sync.WaitGroup
	errs := make(chan error, calls+polls)
	var sawWaiting sync.Once
	waited := make(chan struct{})
	for range calls {
		wg.Go(func() {
			if _, err := c.RunningWorkflows(context.Background(), "no_such_workflow_"+t.Name(), 1); err != nil && !errors.Is(err, ErrNotFound) {
				errs <- err
			}
			if waiting() > 0 {
				sawWaiting.Do(func() { close(waited) })
			}
		})
	}
	for range polls {
		wg.Go(func() {
			if _, err := c.BatchPoll(context.Background(), "nobody_polls_"+t.Name(), "bound-test", 1, 500*time.Millisecond); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a call failed: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if most != bound {
		t.Errorf("Conductor carried at most %d of the client's calls at once, want %d (MaxConcurrentCalls)", most, bound)
	}
	if mostPolls != polls {
		t.Errorf("Conductor carried at most %d of the %d batch polls at once, want all: polls are not bounded", mostPolls, polls)
	}
	select {
	case <-waited:
	default:
		t.Error("sidecar_conductor_calls_waiting never showed a call waiting")
	}
	if w := waiting(); w != 0 {
		t.Errorf("sidecar_conductor_calls_waiting %v once every call ended, want 0", w)
	}
}

// TestClient_ControlCallsLeaveRoomForWork: pause, resume, terminate and
// start calls (API requests, which one caller can send by the hundred)
// never take the last quarter of the places for calls at Conductor, which
// stay for the calls that keep runs moving (task reports and reads), and
// the health check (/readyz) waits for no place at all. Conductor here is
// the real one behind a proxy that holds every pause call until the test
// lets them go: while as many pauses as can be are held, a read and the
// health check must still reach Conductor.
func TestClient_ControlCallsLeaveRoomForWork(t *testing.T) {
	const bound, pauses = 8, 20
	u, err := url.Parse(conductortest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	rp := conductortest.ReverseProxy(t, u)
	release := make(chan struct{})
	var mu sync.Mutex
	held, mostHeld := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/pause") {
			mu.Lock()
			held++
			mostHeld = max(mostHeld, held)
			mu.Unlock()
			defer func() { mu.Lock(); held--; mu.Unlock() }()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient(ClientOptions{BaseURL: srv.URL + u.Path, MaxConcurrentCalls: bound, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	// The pauses' deadline outlasts the checks' below.
	pauseCtx, stopPauses := context.WithTimeout(context.Background(), 5*time.Minute)
	defer stopPauses()
	var wg sync.WaitGroup
	for i := range pauses {
		wg.Go(func() { _ = c.Pause(pauseCtx, fmt.Sprintf("no-such-workflow-%d", i)) })
	}
	t.Cleanup(func() {
		close(release)
		wg.Wait()
	})
	// Every control place taken and more pauses waiting for one.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := held
		mu.Unlock()
		if n >= bound-bound/4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pause calls reached Conductor in a minute, want %d", n, bound-bound/4)
		}
	}

	// Shorter than the 30 s after which the SDK's own HTTP client gives
	// a held pause up (its place would then go to what waits for one).
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Health(ctx); err != nil {
		t.Errorf("health check while control calls fill their places: %v", err)
	}
	if _, err := c.Workflow(ctx, "no-such-workflow-read", false); !errors.Is(err, ErrNotFound) {
		t.Errorf("a workflow read while control calls fill their places: %v, want Conductor's 404", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if mostHeld != bound-bound/4 {
		t.Errorf("Conductor held %d pause calls at once, want %d: three quarters of the %d places", mostHeld, bound-bound/4, bound)
	}
}

// TestClient_ControlPlacesGoToCallersInTurn: while one caller's control
// calls fill every control place and more of them wait, another caller's
// call waits for the next place only, not behind the first caller's
// queue (the places go to the callers in turn). Conductor is the real one
// behind a proxy that holds every pause call until the test lets one go.
func TestClient_ControlPlacesGoToCallersInTurn(t *testing.T) {
	const bound, flood = 8, 20
	u, err := url.Parse(conductortest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	rp := conductortest.ReverseProxy(t, u)
	let := make(chan struct{}, flood+1)
	var mu sync.Mutex
	var arrived []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/pause") {
			mu.Lock()
			arrived = append(arrived, path.Base(path.Dir(r.URL.Path))) // /api/workflow/{id}/pause
			mu.Unlock()
			select {
			case <-let:
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	c, err := NewClient(ClientOptions{BaseURL: srv.URL + u.Path, MaxConcurrentCalls: bound, Metrics: NewMetrics(reg), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	waitWaiting := func(n float64) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() == "sidecar_conductor_calls_waiting" && mf.GetMetric()[0].GetGauge().GetValue() == n {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("not %v calls waiting for a place within a minute", n)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(arrived) }
	waitArrived := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); count() < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d pause calls reached Conductor in a minute, want %d", count(), n)
			}
		}
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		for range flood + 1 {
			let <- struct{}{}
		}
		wg.Wait()
	})
	flooder := WithCaller(ctx, "flooder")
	for i := range flood {
		wg.Go(func() { _ = c.Pause(flooder, fmt.Sprintf("flood-%d", i)) })
	}
	places := bound - bound/4
	waitArrived(places)
	// Every flood call not at Conductor waits, queued before the other
	// caller's.
	waitWaiting(float64(flood - places))
	wg.Go(func() { _ = c.Pause(WithCaller(ctx, "other"), "other-1") })
	waitWaiting(float64(flood - places + 1))
	// One place frees: the other caller's turn comes first or second.
	let <- struct{}{}
	waitArrived(places + 1)
	let <- struct{}{}
	waitArrived(places + 2)
	mu.Lock()
	defer mu.Unlock()
	if got := arrived[places : places+2]; got[0] != "other-1" && got[1] != "other-1" {
		t.Fatalf("after the first %d flood calls Conductor got %v: the other caller's call waited behind the flood's queue", places, got)
	}
}
