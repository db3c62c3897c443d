package adapter

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// owns is an Owner that owns the keys of its set (membership.Members is
// the real one; here the split must be known in advance).
type owns map[string]bool

func (o owns) Owns(key string) bool { return o[key] }

// TestWatcher_ReplicasDivideTheRuns checks that a watcher reads and ends
// only the runs its Owner gives it, that the replica owning the others
// ends them, and that the orphan pass reads no workflow the run index
// records and leaves an orphan to the owner of its workflow id.
func TestWatcher_ReplicasDivideTheRuns(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	c, err := NewClient(ClientOptions{BaseURL: u, Timeout: time.Second, Logger: zaptest.NewLogger(t), Metrics: NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	js := env.connect(t)
	r, err := OpenRuns(ctx, js, c, env.emitter, RunsOptions{TaskDomain: env.domain, LeaseTTL: 2 * time.Second, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	p := testPlan(t)
	if err := r.RegisterPlan(ctx, "tenant-a", p); err != nil {
		t.Fatal(err)
	}
	const n = 6
	var runs []StartResult
	groups := [3]owns{{}, {}, {}} // run i belongs to groups[i%3]
	for i := range n {
		res, err := r.StartRun(ctx, request(p, fmt.Sprintf("req-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, res)
		t.Cleanup(func() { _ = c.Terminate(context.Background(), res.Run.WorkflowID, "cleanup") })
		groups[i%3][res.Run.RunID] = true
	}
	reads := func() float64 { return testutil.ToFloat64(c.metrics.requests[[2]string{opGetWorkflow, resultOK}]) }

	t.Run("Orphans", func(t *testing.T) {
		// A watcher that owns every workflow id but none of the runs:
		// its scans read nothing, so it knows no workflow itself; the
		// orphan pass still reads none of the six (the index records
		// them).
		allWorkflows := owns{}
		for _, res := range runs {
			allWorkflows[res.Run.WorkflowID] = true
		}
		w := NewWatcher(r, env.store, WatcherOptions{Owner: allWorkflows, Interval: time.Hour, ReconcileInterval: time.Hour, Logger: zaptest.NewLogger(t)})
		if err := w.Open(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close(context.Background()) })
		waitCache(t, w, n)
		before := reads()
		if err := w.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		if got := reads() - before; got != 0 {
			t.Fatalf("the orphan pass read %v workflows that the run index records, want 0", got)
		}

		// An orphan: a second workflow of a run. Its workflow id's owner
		// terminates it, another replica leaves it alone.
		crashed := crashedStart(t, r, request(p, "orphan"), true)
		time.Sleep(time.Until(crashed.LeaseExpiresAt) + 50*time.Millisecond)
		res, err := r.StartRun(ctx, request(p, "orphan"))
		if err != nil || res.Run.WorkflowID == crashed.WorkflowID {
			t.Fatalf("retry: %+v, %v; want a second workflow", res, err)
		}
		t.Cleanup(func() { _ = c.Terminate(context.Background(), res.Run.WorkflowID, "cleanup") })
		other := NewWatcher(r, env.store, WatcherOptions{Owner: owns{}})
		if err := other.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		wf, err := c.Workflow(ctx, crashed.WorkflowID, false)
		if err != nil {
			t.Fatal(err)
		}
		if wf.Status != model.RunningWorkflow {
			t.Fatalf("orphan after the pass of a replica that does not own it: %v; want RUNNING", wf.Status)
		}
		owner := NewWatcher(r, env.store, WatcherOptions{Owner: owns{crashed.WorkflowID: true}})
		if err := owner.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		if wf, err = c.Workflow(ctx, crashed.WorkflowID, false); err != nil {
			t.Fatal(err)
		}
		if wf.Status != model.TerminatedWorkflow {
			t.Fatalf("orphan after its owner's pass: %v; want TERMINATED", wf.Status)
		}
	})

	t.Run("ReadsInTurn", func(t *testing.T) {
		// FullReadRate is the deployment's: a replica owning a third of
		// the runs reads a third of it in turn.
		w := NewWatcher(r, env.store, WatcherOptions{Owner: groups[0], Interval: time.Hour, ReconcileInterval: time.Hour, FullReadRate: 3, Logger: zaptest.NewLogger(t)})
		w.opts.Interval = time.Second // 3 reads a scan between the replicas, 1 for this one
		if err := w.Open(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close(context.Background()) })
		waitCache(t, w, n)
		time.Sleep(200 * time.Millisecond) // the watcher's own first scan
		before := reads()
		const scans = 4
		for range scans {
			if err := w.Scan(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got := reads() - before; got != scans {
			t.Fatalf("%d scans read %v workflows in turn, want %d (a third of 3 a scan)", scans, got, scans)
		}

		// The drain monitor's list of open runs comes from the cache:
		// every run, and no request to NATS (the least of five calls, as
		// the cache's watch may send a flow-control reply meanwhile).
		fewest := uint64(1 << 62)
		for range 5 {
			sent := js.Conn().Stats().OutMsgs
			ids, err := w.OpenRunIDs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			fewest = min(fewest, js.Conn().Stats().OutMsgs-sent)
			for _, res := range runs {
				if !slices.Contains(ids, res.Run.RunID) {
					t.Fatalf("OpenRunIDs has no run %s: %v", res.Run.RunID, ids)
				}
			}
		}
		if fewest != 0 {
			t.Fatalf("OpenRunIDs sent at least %d messages to NATS each time, want none (the run cache)", fewest)
		}
	})

	t.Run("Scans", func(t *testing.T) {
		for _, res := range runs {
			if err := c.Terminate(ctx, res.Run.WorkflowID, "ended outside the sidecar"); err != nil {
				t.Fatal(err)
			}
		}
		state := func(i int) string {
			got, err := r.Run(ctx, runs[i].Run.RunID)
			if err != nil {
				t.Fatal(err)
			}
			return got.State
		}
		// requireStarted checks that the runs of groups[g:] are untouched.
		requireStarted := func(g int) {
			t.Helper()
			for i := range n {
				if i%3 >= g {
					if got := state(i); got != RunStateStarted {
						t.Fatalf("run %d of group %d, owned by none of the replicas that scanned: %s, want STARTED", i, i%3, got)
					}
				}
			}
		}
		// Group 0's replica scans from the run index.
		before := reads()
		if err := NewWatcher(r, env.store, WatcherOptions{Owner: groups[0]}).Scan(ctx); err != nil {
			t.Fatal(err)
		}
		if got := reads() - before; got != n/3 {
			t.Fatalf("a replica owning %d of %d ended runs read %v workflows, want %d", n/3, n, got, n/3)
		}
		requireStarted(1)
		// Group 1's replica scans from its run cache (Open scans at once).
		before = reads()
		b := NewWatcher(r, env.store, WatcherOptions{Owner: groups[1], Interval: time.Hour, ReconcileInterval: time.Hour, Logger: zaptest.NewLogger(t)})
		if err := b.Open(ctx); err != nil {
			t.Fatal(err)
		}
		for i := 1; i < n; i += 3 {
			waitFinal(t, env, r, runs[i].Run.RunID)
		}
		if err := b.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if got := reads() - before; got != n/3 {
			t.Fatalf("a replica owning %d of %d ended runs read %v workflows, want %d", n/3, n, got, n/3)
		}
		requireStarted(2)
		// Group 2's owner ends the rest.
		if err := NewWatcher(r, env.store, WatcherOptions{Owner: groups[2]}).Scan(ctx); err != nil {
			t.Fatal(err)
		}
		for _, res := range runs {
			if ev := lastEvent(t, waitFinal(t, env, r, res.Run.RunID)); ev.EventType != statestore.RunFailed {
				t.Fatalf("run %s: last event %s, want RunFailed", res.Run.RunID, ev.EventType)
			}
		}
	})
}

func waitCache(t *testing.T, w *Watcher, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !w.cache.ready() || len(w.cache.open()) < n {
		if time.Now().After(deadline) {
			t.Fatal("the run cache never held the runs")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWatcher_FinishChecksTheWorkflowIsStillTheRuns: the end of a workflow
// the run's entry no longer names (a start abandoned and retried with
// another workflow; the watcher's own read was a moment behind) records
// nothing: the run goes on with its workflow (soak finding).
func TestWatcher_FinishChecksTheWorkflowIsStillTheRuns(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, u, RunsOptions{})
	p := testPlan(t)
	res, err := r.StartRun(ctx, request(p, "req"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Client().Terminate(context.Background(), res.Run.WorkflowID, "cleanup") })
	w := NewWatcher(r, env.store, WatcherOptions{})
	if err := w.finish(ctx, res.Run.RunID, "00000000-0000-4000-8000-0000000000ab", "TERMINATED", "an abandoned start's workflow", nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Run(ctx, res.Run.RunID); got.State != RunStateStarted {
		t.Fatalf("state %s after another workflow ended, want STARTED", got.State)
	}
	if ev := lastEvent(t, env.events(t, res.Run.RunID)); ev.EventType != statestore.RunStarted {
		t.Fatalf("last event %s, want RunStarted (nothing recorded)", ev.EventType)
	}
}
