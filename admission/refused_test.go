package admission_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestAdmission_AStartConductorRefusesHoldsOnlyItsTenant: Conductor (here
// an authorizing gateway in front of it, as Orkes' or a company's is)
// answers 403 to every start of one tenant's plan. That run is neither
// ended nor skipped: its start is tried again, and its tenant's later
// runs wait behind it, in order. Another tenant's queued run starts as
// soon as there is room, instead of waiting behind a start that keeps
// failing.
func TestAdmission_AStartConductorRefusesHoldsOnlyItsTenant(t *testing.T) {
	refusedPlan := &plan.Plan{PlanID: "adm-refused-" + uuid.NewString()[:8], PlanVersion: "1",
		Steps: []plan.Step{{StepID: "r", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}}}
	gate := refusingStarts(t, refusedPlan.PlanID)
	e := newEnvOn(t, gate.url)
	c := e.open(admission.Options{Limits: admission.Limits{Global: 1}, Policy: admission.Queue, Wait: 5 * time.Second})
	defer c.Close(t.Context())

	first, err := e.submit(c, "t1", "h-1")
	if err != nil || first.Started == nil {
		t.Fatalf("first: %+v %v", first, err)
	}
	stuck, err := e.submitPlan(c, "t1", "h-2", refusedPlan)
	if err != nil || stuck.State != statestore.RunStatusQueued {
		t.Fatalf("the refused plan's run: %+v %v, want QUEUED", stuck, err)
	}
	behind, err := e.submit(c, "t1", "h-3")
	if err != nil || behind.State != statestore.RunStatusQueued {
		t.Fatalf("t1's next run: %+v %v, want QUEUED", behind, err)
	}
	other, err := e.submit(c, "t2", "h-4")
	if err != nil || other.State != statestore.RunStatusQueued {
		t.Fatalf("t2's run: %+v %v, want QUEUED", other, err)
	}
	e.end(first.RunID)
	e.waitStarted(other.RunID)
	if n := gate.refused.Load(); n == 0 {
		t.Fatal("the refused plan's start was never tried")
	}
	// Room again: the refused start is tried again, t1's next run still
	// waits behind it, and t2's next run starts.
	e.end(other.RunID)
	tried := gate.refused.Load()
	for deadline := time.Now().Add(20 * time.Second); gate.refused.Load() < tried+2; {
		if time.Now().After(deadline) {
			t.Fatalf("the refused start was tried %d times more in 20 s, want it retried", gate.refused.Load()-tried)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if e.started(behind.RunID) {
		t.Fatal("t1's later run started ahead of its earlier one")
	}
	if got := types(e.events(stuck.RunID)); got != statestore.RunQueued {
		t.Fatalf("the refused run's log: %s, want RunQueued only (it waits, its start retried)", got)
	}
	next, err := e.submit(c, "t2", "h-5")
	if err != nil || next.Started == nil {
		t.Fatalf("t2's next run with room: %+v %v, want started", next, err)
	}
	// The gateway lets the start through while the limit is reached: it
	// waits for room like any queued run, then starts; t1's next run
	// follows it.
	gate.open.Store(true)
	// A later run of t1 decided (queued: the limit is reached) is a pass
	// of the decider over the once refused run, which comes before it.
	if probe, err := e.submit(c, "t1", "h-6"); err != nil || probe.State != statestore.RunStatusQueued {
		t.Fatalf("t1's next run with the limit reached: %+v %v, want QUEUED", probe, err)
	}
	if e.started(stuck.RunID) {
		t.Fatal("the once refused run started beyond the limit")
	}
	e.end(next.RunID)
	e.waitStarted(stuck.RunID)
	if e.started(behind.RunID) {
		t.Fatal("t1's later run started beyond the limit")
	}
	e.end(stuck.RunID)
	e.waitStarted(behind.RunID)
}

// startGate is a pass-through in front of the test Conductor that answers
// 403 to every workflow start naming planID until open.
type startGate struct {
	url     string
	open    atomic.Bool
	refused atomic.Int64
}

func refusingStarts(t *testing.T, planID string) *startGate {
	t.Helper()
	u, err := url.Parse(conductortest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	g := &startGate{}
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(&url.URL{Scheme: u.Scheme, Host: u.Host})
		r.Out.Body = conductortest.EndedBody(r.Out.Body)
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/api/workflow") && !g.open.Load() {
			body, _ := io.ReadAll(r.Body)
			if bytes.Contains(body, []byte(planID)) {
				g.refused.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusForbidden)
				_, _ = io.WriteString(w, `{"status":403,"message":"not allowed to start this workflow"}`)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	g.url = "http://" + ln.Addr().String() + "/api"
	return g
}
