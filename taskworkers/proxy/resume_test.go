package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// countingConductor is a reverse proxy to the real Conductor that counts
// the reads of one workflow (GET /workflow/{id}).
type countingConductor struct {
	mu    sync.Mutex
	wfID  string
	reads atomic.Int64
}

func (c *countingConductor) watch(wfID string) {
	c.mu.Lock()
	c.wfID = wfID
	c.mu.Unlock()
}

func (c *countingConductor) serve(t *testing.T) string {
	t.Helper()
	target, err := url.Parse(conductortest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	rp := conductortest.ReverseProxy(t, target)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		id := c.wfID
		c.mu.Unlock()
		if id != "" && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/workflow/"+id) {
			c.reads.Add(1)
		}
		rp.ServeHTTP(rw, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + target.Path
}

// TestProxy_ResumeInConductorLetsTasksThrough: a run paused through the
// sidecar (the log and Conductor PAUSED) whose workflow is then resumed in
// Conductor itself: the gate, which holds the run's task back, has the
// run watcher read the workflow (at most once per run per recheck
// interval, however often the task is polled), the resume is recorded
// and the task reaches the worker long before the watcher's next scan
// (30 minutes away), with RunResumed before its StepStarted.
func TestProxy_ResumeInConductorLetsTasksThrough(t *testing.T) {
	const recheckEvery = 4 * time.Second
	var recheck atomic.Pointer[func(string)]
	e := newEnvOpts(t, envOpts{pausedTask: func(runID string) {
		if f := recheck.Load(); f != nil {
			(*f)(runID)
		}
	}})
	ctx := context.Background()
	counting := &countingConductor{}
	wclient, err := adapter.NewClient(adapter.ClientOptions{BaseURL: counting.serve(t)})
	if err != nil {
		t.Fatal(err)
	}
	wruns, err := adapter.OpenRuns(ctx, e.js, wclient, e.emit, adapter.RunsOptions{TaskDomain: e.domain})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := drain.OpenKeys(ctx, e.js, drain.KeysOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pauses := drain.NewFollower(e.store, e.emit, wclient, keys, drain.FollowerOptions{Logger: zaptest.NewLogger(t)})
	watcher := adapter.NewWatcher(wruns, e.store, adapter.WatcherOptions{Pauses: pauses, Interval: 30 * time.Minute,
		ReconcileInterval: 30 * time.Minute, RecheckInterval: recheckEvery, Logger: zaptest.NewLogger(t)})
	if err := watcher.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = watcher.Close(context.Background()) })
	f := watcher.Recheck
	recheck.Store(&f)

	runID, wfID := e.start(t, 1, 60)
	waitFor(t, "RunStarted", time.Minute, func() bool { return count(e.events(t, runID), statestore.RunStarted) == 1 })
	// Paused through the sidecar: the log, Conductor, and the ledger that
	// says the sidecar put the workflow there.
	e.control(t, runID, statestore.RunPaused, 1)
	if err := e.client.Pause(ctx, wfID); err != nil {
		t.Fatal(err)
	}
	if err := keys.NoteEngine(ctx, runID, true, 1); err != nil {
		t.Fatal(err)
	}
	wf, err := e.client.Workflow(ctx, wfID, true)
	if err != nil || len(wf.Tasks) != 1 {
		t.Fatalf("workflow %+v: %v", wf, err)
	}
	taskID := wf.Tasks[0].TaskId
	polls := func() int32 {
		var n int32
		waitFor(t, "the task's poll count", 2*time.Minute, func() bool {
			tk, err := e.client.Task(ctx, taskID) // a busy machine may time a read out
			if err == nil {
				n = tk.PollCount
			}
			return err == nil
		})
		return n
	}

	// Held back while Conductor says PAUSED too: the reads are rate-limited.
	counting.watch(wfID)
	began, first := time.Now(), polls()
	waitFor(t, "the held task to be polled 8 times", 3*time.Minute, func() bool {
		if got := e.pollBatch(t, 1); len(got) > 0 {
			t.Fatalf("a task of a paused run reached the worker: %+v", got)
		}
		return polls()-first >= 8
	})
	reads := counting.reads.Load() // every read counted was asked for within held
	held := time.Since(began)
	if most := int64(held/recheckEvery) + 1; reads > most {
		t.Fatalf("%d reads of the workflow for %d refused polls in %s, want at most %d (one per %s)",
			reads, polls()-first, held.Round(time.Millisecond), most, recheckEvery)
	}
	t.Logf("held back: %d polls, %d reads of the workflow in %s", polls()-first, reads, held.Round(time.Millisecond))
	if n := count(e.events(t, runID), statestore.RunResumed); n != 0 {
		t.Fatalf("RunResumed while Conductor says PAUSED: %d", n)
	}

	// Resumed in Conductor itself: the task passes at a later poll.
	if err := e.client.Resume(ctx, wfID); err != nil {
		t.Fatal(err)
	}
	resumedAt := time.Now()
	var got []task
	waitFor(t, "the task after a resume in Conductor", 2*time.Minute, func() bool {
		got = e.pollBatch(t, 1)
		return len(got) > 0
	})
	t.Logf("the worker got the task %s after the resume in Conductor", time.Since(resumedAt).Round(time.Millisecond))
	evs := e.events(t, runID)
	resumed, started := -1, -1
	for i, r := range evs {
		switch {
		case r.EventType == statestore.RunResumed && resumed < 0:
			resumed = i
		case r.EventType == statestore.StepStarted && started < 0:
			started = i
		}
	}
	if resumed < 0 || started < resumed {
		t.Fatalf("RunResumed at %d, StepStarted at %d: want the resume first", resumed, started)
	}
	if !strings.Contains(string(evs[resumed].Payload), statestore.RequestedByConductor) {
		t.Fatalf("RunResumed %s, want requestedBy conductor", evs[resumed].Payload)
	}
}
