package admission_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/membership"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// env is a sidecar's admission path on the real Conductor: the log, the
// run index, the run list and a controller. Nothing polls the runs' tasks,
// so a started run stays RUNNING until the test ends it in the log.
type env struct {
	t      testing.TB
	js     jetstream.JetStream
	store  *natsstore.Store
	emit   *registry.Emitter
	runs   *adapter.Runs
	list   *runlist.List
	plan   *plan.Plan
	domain string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvOn(t, conductortest.URL(t))
}

// newEnvOn is newEnv with Conductor's API at conductorURL.
func newEnvOn(t testing.TB, conductorURL string) *env {
	t.Helper()
	ctx := context.Background()
	domain := "adm" + uuid.NewString()[:8]
	js, store, emit, runs := deploymentOn(t, domain, conductorURL)
	list, err := runlist.Open(ctx, js, runlist.Options{Log: store, Poll: 20 * time.Millisecond, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = list.Close(context.Background()) })
	p := &plan.Plan{PlanID: "adm-" + uuid.NewString()[:8], PlanVersion: "1", Steps: []plan.Step{{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}}}
	return &env{t: t, js: js, store: store, emit: emit, runs: runs, list: list, plan: p, domain: domain}
}

// deployment is a sidecar's log, registry and adapter on the real
// Conductor, its tasks in domain.
func deployment(t testing.TB, domain string) (jetstream.JetStream, *natsstore.Store, *registry.Emitter, *adapter.Runs) {
	t.Helper()
	return deploymentOn(t, domain, conductortest.URL(t))
}

// deploymentOn is deployment with Conductor's API at conductorURL.
func deploymentOn(t testing.TB, domain, conductorURL string) (jetstream.JetStream, *natsstore.Store, *registry.Emitter, *adapter.Runs) {
	t.Helper()
	ctx := context.Background()
	js, _ := natstest.Start(t)
	store, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ids, err := registry.Open(ctx, js, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	emit := registry.NewEmitter(ids, store)
	client, err := adapter.NewClient(adapter.ClientOptions{BaseURL: conductorURL})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := adapter.OpenRuns(ctx, js, client, emit, adapter.RunsOptions{TaskDomain: domain, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return js, store, emit, runs
}

func (e *env) open(opts admission.Options) *admission.Controller {
	e.t.Helper()
	if opts.Runs == nil {
		opts.Runs = e.runs
	}
	opts.Log, opts.Snapshots = e.emit, e.store
	if opts.Active == nil {
		opts.Active = e.list
	}
	opts.Logger = zaptest.NewLogger(e.t)
	c, err := admission.Open(context.Background(), e.js, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) request(tenant, id string) adapter.StartRequest {
	e.t.Helper()
	compiled, err := plan.Compile(e.plan)
	if err != nil {
		e.t.Fatal(err)
	}
	return adapter.StartRequest{TenantID: tenant, ProjectID: "p", EnvironmentID: "test", RunRequestID: id, Plan: compiled}
}

func (e *env) submit(c *admission.Controller, tenant, id string) (*admission.Decision, error) {
	return c.Submit(context.Background(), e.request(tenant, id), e.plan, "test")
}

func (e *env) events(runID string) []statestore.RunEventRecord {
	e.t.Helper()
	recs, err := e.store.Fetch(context.Background(), runID, 0, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return recs
}

func types(recs []statestore.RunEventRecord) string {
	var s []string
	for _, r := range recs {
		s = append(s, r.EventType)
	}
	return strings.Join(s, " ")
}

// end records the run's end in the log (as the watcher would when its
// workflow completes): it no longer counts as active.
func (e *env) end(runID string) {
	e.t.Helper()
	snap, err := e.store.ProjectSnapshot(context.Background(), runID)
	if err != nil {
		e.t.Fatal(err)
	}
	ev, err := statestore.NewEvent(snap.Ref(), statestore.RunCompleted, "", 1, 1, map[string]any{"engineStatus": "COMPLETED"})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.emit.Emit(context.Background(), ev); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) waitStarted(runID string) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if strings.Contains(types(e.events(runID)), statestore.RunStarted) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("run %s never started: %s", runID, types(e.events(runID)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) started(runID string) bool {
	return strings.Contains(types(e.events(runID)), statestore.RunStarted)
}

// TestAdmission_QueueInOrder: under a global limit of 2, the first two
// runs start, the next three are QUEUED (RunQueued recorded, positions 1
// to 3) and start one by one, in submission order, as running runs end;
// each starts once.
func TestAdmission_QueueInOrder(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{Global: 2}, Policy: admission.Queue})
	defer c.Close(context.Background())
	var ids []string
	for i := range 5 {
		d, err := e.submit(c, "t1", fmt.Sprintf("q-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, d.RunID)
		switch {
		case i < 2 && d.Started == nil:
			t.Fatalf("run %d: %+v, want started", i, d)
		case i >= 2 && (d.State != statestore.RunStatusQueued || d.Position != i-1):
			t.Fatalf("run %d: %+v, want QUEUED at position %d", i, d, i-1)
		}
	}
	for _, id := range ids[2:] {
		if got := types(e.events(id)); got != statestore.RunQueued {
			t.Fatalf("queued run's log: %s, want RunQueued", got)
		}
	}
	// A repeat of a queued request is the same run, still queued.
	if d, err := e.submit(c, "t1", "q-3"); err != nil || d.RunID != ids[3] || d.State != statestore.RunStatusQueued {
		t.Fatalf("repeat: %+v %v", d, err)
	}
	e.end(ids[0])
	e.waitStarted(ids[2])
	time.Sleep(300 * time.Millisecond)
	if e.started(ids[3]) || e.started(ids[4]) {
		t.Fatal("more than one queued run started for one run that ended")
	}
	if p := c.Position(ids[4]); p != 2 {
		t.Fatalf("position of the last: %d, want 2", p)
	}
	e.end(ids[1])
	e.waitStarted(ids[3])
	e.end(ids[2])
	e.waitStarted(ids[4])
	for _, id := range ids {
		recs := e.events(id)
		if n := strings.Count(types(recs), statestore.RunStarted); n != 1 {
			t.Fatalf("run %s: %d RunStarted (%s)", id, n, types(recs))
		}
	}
}

// TestAdmission_Reject: over a tenant's limit, a start is refused with
// ADMISSION_REJECTED and nothing recorded; another tenant's starts.
func TestAdmission_Reject(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{PerTenant: 1}, Policy: admission.Reject})
	defer c.Close(context.Background())
	if d, err := e.submit(c, "t1", "r-1"); err != nil || d.Started == nil {
		t.Fatalf("first: %+v %v", d, err)
	}
	_, err := e.submit(c, "t1", "r-2")
	var ae *admission.Error
	if !errors.As(err, &ae) || ae.Code != admission.CodeRejected || ae.RetryAfter <= 0 || !strings.Contains(ae.Message, "tenant t1") {
		t.Fatalf("over the tenant's limit: %v, want ADMISSION_REJECTED naming the limit, with a retry time", err)
	}
	runID, _ := e.runs.RunIDFor(context.Background(), e.request("t1", "r-2"))
	if recs := e.events(runID); len(recs) != 0 {
		t.Fatalf("a rejected run has events: %s", types(recs))
	}
	if d, err := e.submit(c, "t2", "r-3"); err != nil || d.Started == nil {
		t.Fatalf("another tenant: %+v %v", d, err)
	}
}

// TestAdmission_PlanLimitIsEachTenants: --max-active-runs-per-plan counts
// a tenant's own runs of a planId: plan ids are one namespace, and
// another tenant starting runs of the same id (any version) neither takes
// a tenant's capacity of its plan nor learns how many of its runs are
// active from its own 429s.
func TestAdmission_PlanLimitIsEachTenants(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{PerPlan: 1}, Policy: admission.Reject})
	defer c.Close(context.Background())
	if d, err := e.submit(c, "hog", "p-1"); err != nil || d.Started == nil {
		t.Fatalf("another tenant's run of the plan: %+v %v", d, err)
	}
	if d, err := e.submit(c, "owner", "p-2"); err != nil || d.Started == nil {
		t.Fatalf("the owner's first run of the plan, another tenant's active: %+v %v", d, err)
	}
	_, err := e.submit(c, "owner", "p-3")
	var ae *admission.Error
	if !errors.As(err, &ae) || ae.Code != admission.CodeRejected || !strings.Contains(ae.Message, "plan ") {
		t.Fatalf("the owner's second run, over its plan limit: %v, want ADMISSION_REJECTED naming the plan limit", err)
	}
}

// TestAdmission_Delay: over the limit, a start is accepted and put off by
// Delay per run it is over by; it starts then, whatever the load.
func TestAdmission_Delay(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{Global: 1}, Policy: admission.Delay, Delay: 1500 * time.Millisecond})
	defer c.Close(context.Background())
	if _, err := e.submit(c, "t1", "d-1"); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	d, err := e.submit(c, "t1", "d-2")
	if err != nil || d.State != statestore.RunStatusQueued || d.NotBefore.Sub(before) < time.Second {
		t.Fatalf("second: %+v %v, want QUEUED until about 1.5s from now", d, err)
	}
	e.waitStarted(d.RunID)
	if time.Now().Before(d.NotBefore) {
		t.Fatalf("started before its time %s", d.NotBefore)
	}
}

// blockingRuns blocks StartRun until its context ends: a decider that
// dies mid-start.
type blockingRuns struct {
	admission.Runs
	calls chan string
}

func (b blockingRuns) StartRun(ctx context.Context, req adapter.StartRequest) (adapter.StartResult, error) {
	b.calls <- req.RunRequestID
	<-ctx.Done()
	return adapter.StartResult{}, ctx.Err()
}

// TestAdmission_InterruptedStartIsStartedAgain: a decider that stops in
// the middle of a start leaves the entry starting; the next decider
// (another replica, or this one restarted) starts it, once.
func TestAdmission_InterruptedStartIsStartedAgain(t *testing.T) {
	e := newEnv(t)
	calls := make(chan string, 4)
	dying := e.open(admission.Options{Limits: admission.Limits{Global: 5}, Runs: blockingRuns{e.runs, calls}, Wait: 200 * time.Millisecond})
	d, err := e.submit(dying, "t1", "i-1")
	if err != nil || d.State != statestore.RunStatusPending {
		t.Fatalf("submit: %+v %v, want PENDING (the start hangs)", d, err)
	}
	<-calls
	_ = dying.Close(context.Background())
	if e.started(d.RunID) {
		t.Fatal("started by the dying decider")
	}
	c := e.open(admission.Options{Limits: admission.Limits{Global: 5}})
	defer c.Close(context.Background())
	e.waitStarted(d.RunID)
	var wg sync.WaitGroup
	for range 3 { // repeats meanwhile: the same run
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got, err := e.submit(c, "t1", "i-1"); err != nil || got.RunID != d.RunID || got.Started == nil {
				t.Errorf("repeat: %+v %v", got, err)
			}
		}()
	}
	wg.Wait()
	if n := strings.Count(types(e.events(d.RunID)), statestore.RunStarted); n != 1 {
		t.Fatalf("%d RunStarted", n)
	}
}

// TestAdmission_CancelWhileQueued: a queued run that is cancelled is not
// started when capacity frees up: RunCancelled is recorded.
func TestAdmission_CancelWhileQueued(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{Global: 1}})
	defer c.Close(context.Background())
	first, err := e.submit(c, "t1", "c-1")
	if err != nil {
		t.Fatal(err)
	}
	q, err := e.submit(c, "t1", "c-2")
	if err != nil || q.State != statestore.RunStatusQueued {
		t.Fatalf("%+v %v", q, err)
	}
	snap, _ := e.store.ProjectSnapshot(context.Background(), q.RunID)
	ev, _ := statestore.NewEvent(snap.Ref(), statestore.RunCancelRequested, "", 1, 1, map[string]any{"reason": "no longer needed", "requestedBy": "test"})
	if _, err := e.emit.Emit(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	e.end(first.RunID)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(types(e.events(q.RunID)), statestore.RunCancelled) {
		if time.Now().After(deadline) {
			t.Fatalf("log %s, want RunCancelled", types(e.events(q.RunID)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if e.started(q.RunID) {
		t.Fatal("a run cancelled while queued was started")
	}
}

// TestAdmission_TwoReplicas: two sidecars on one NATS, each with its own
// membership and controller, take starts at once under a global limit of
// 3: exactly three runs start, the other seven wait, both replicas give
// each the same position (distinct, 1 to 7), and no run starts twice.
// (The single decider is not what holds the limit here alone: with the
// ownership check removed the entries' compare-and-set and the list's
// counts still held it in three runs.)
func TestAdmission_TwoReplicas(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	var cs []*admission.Controller
	var ms []*membership.Members
	for i := range 2 {
		// A member counts as dead only after 10 s without a beat: a loaded
		// machine must not drop one mid-test (the rule here is the limit).
		m, err := membership.Open(ctx, e.js, membership.Options{Name: fmt.Sprintf("replica-%d", i), Heartbeat: 200 * time.Millisecond, DeadAfter: 10 * time.Second, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close(ctx) })
		ms = append(ms, m)
		cs = append(cs, e.open(admission.Options{Limits: admission.Limits{Global: 3}, Owner: m}))
	}
	defer func() {
		for _, c := range cs {
			c.Close(context.Background())
		}
	}()
	// Both replicas see both members before the starts.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		k0, _ := ms[0].Live()
		k1, _ := ms[1].Live()
		if len(k0) == 2 && len(k1) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replicas do not see each other: %v, %v", k0, k1)
		}
	}
	var mu sync.Mutex
	var started, queued []*admission.Decision
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := e.submit(cs[i%2], "t1", fmt.Sprintf("two-%d", i))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if d.Started != nil {
				started = append(started, d)
			} else {
				queued = append(queued, d)
			}
		}()
	}
	wg.Wait()
	if len(started) != 3 || len(queued) != 7 {
		t.Fatalf("%d started, %d queued; want 3 and 7", len(started), len(queued))
	}
	seen := map[int]bool{}
	for _, d := range queued {
		p := cs[0].Position(d.RunID)
		if p < 1 || p > 7 || seen[p] || cs[1].Position(d.RunID) != p {
			t.Fatalf("run %s at position %d (other replica %d); want distinct 1..7 on both", d.RunID, p, cs[1].Position(d.RunID))
		}
		seen[p] = true
	}
	for _, d := range append(started, queued...) {
		if n := strings.Count(types(e.events(d.RunID)), statestore.RunStarted); n > 1 {
			t.Fatalf("run %s started %d times", d.RunID, n)
		}
	}
}

// TestAdmission_DelayedRunsAreSpacedOut: the k-th run over a limit at its
// submission is put off k delays, whether the earlier ones were submitted
// in the same decision or before it (a delayed run still waiting counts).
func TestAdmission_DelayedRunsAreSpacedOut(t *testing.T) {
	e := newEnv(t)
	const delay = time.Hour // none of them starts during the test
	c := e.open(admission.Options{Limits: admission.Limits{Global: 1}, Policy: admission.Delay, Delay: delay})
	defer c.Close(context.Background())
	if _, err := e.submit(c, "t1", "s-0"); err != nil {
		t.Fatal(err)
	}
	for k := 1; k <= 3; k++ {
		before := time.Now()
		d, err := e.submit(c, "t1", fmt.Sprintf("s-%d", k))
		if err != nil || d.State != statestore.RunStatusQueued {
			t.Fatalf("run %d over the limit: %+v %v, want QUEUED", k, d, err)
		}
		if wait := d.NotBefore.Sub(before); wait < time.Duration(k)*delay-time.Minute || wait > time.Duration(k)*delay+time.Minute {
			t.Fatalf("run %d over the limit is put off %s, want %d delays (%s)", k, wait.Round(time.Second), k, time.Duration(k)*delay)
		}
	}
}

// TestAdmission_ARejectedRequestRepeatedIsDecidedAgain: a start refused
// over a limit and repeated with the same runRequestId (as the 429's
// Retry-After invites) is decided again on the limits and load of then,
// not answered with the first refusal.
func TestAdmission_ARejectedRequestRepeatedIsDecidedAgain(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{PerTenant: 1}, Policy: admission.Reject})
	if d, err := e.submit(c, "t1", "again-1"); err != nil || d.Started == nil {
		t.Fatalf("first: %+v %v", d, err)
	}
	if _, err := e.submit(c, "t1", "again-2"); !errors.Is(err, admission.ErrRejected) {
		t.Fatalf("over the limit: %v, want ADMISSION_REJECTED", err)
	}
	_ = c.Close(context.Background())
	c = e.open(admission.Options{Limits: admission.Limits{PerTenant: 5}, Policy: admission.Reject}) // the limit raised
	defer c.Close(context.Background())
	if d, err := e.submit(c, "t1", "again-2"); err != nil || d.Started == nil {
		t.Fatalf("the same request repeated under the raised limit: %+v %v, want it started", d, err)
	}
}

// switchOwner owns the decider's key while owns is set.
type switchOwner struct{ owns atomic.Bool }

func (s *switchOwner) Owns(string) bool { return s.owns.Load() }

// TestAdmission_OnlyTheDeciderReportsTheQueue: a replica that stops
// deciding (another replica owns the decider now) reports an empty queue,
// not the runs it saw queued last: dashboards take the max over replicas.
func TestAdmission_OnlyTheDeciderReportsTheQueue(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	owner := &switchOwner{}
	owner.owns.Store(true)
	c := e.open(admission.Options{Limits: admission.Limits{Global: 1}, Owner: owner, Metrics: admission.NewMetrics(reg)})
	defer c.Close(context.Background())
	if _, err := e.submit(c, "t1", "q-1"); err != nil {
		t.Fatal(err)
	}
	if d, err := e.submit(c, "t1", "q-2"); err != nil || d.State != statestore.RunStatusQueued {
		t.Fatalf("second: %+v %v, want QUEUED", d, err)
	}
	queued := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "sidecar_admission_queue_depth" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "state" && l.GetValue() == "queued" {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		return -1
	}
	for deadline := time.Now().Add(10 * time.Second); queued() != 1; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the decider reports %v queued, want 1", queued())
		}
	}
	owner.owns.Store(false)
	for deadline := time.Now().Add(10 * time.Second); queued() != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a replica that stopped deciding still reports %v queued", queued())
		}
	}
}

// TestAdmission_QueueIsBounded: with MaxQueued 2 under a global limit of
// 1, the first run starts, the next two are QUEUED, and a fourth is
// refused (ADMISSION_REJECTED naming the bound, nothing recorded) rather
// than queued: one principal's flood of starts cannot grow the queue, and
// the memory it takes, without end. Once a queued run started, a start is
// queued again. Before, 3,035 runs were queued in 20 s.
func TestAdmission_QueueIsBounded(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{Global: 1}, Policy: admission.Queue, MaxQueued: 2})
	defer c.Close(context.Background())
	var ids []string
	for i := range 3 {
		d, err := e.submit(c, "t1", fmt.Sprintf("b-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, d.RunID)
	}
	_, err := e.submit(c, "t1", "b-3")
	var ae *admission.Error
	if !errors.As(err, &ae) || ae.Code != admission.CodeRejected || !strings.Contains(ae.Message, "--admission-max-queued") {
		t.Fatalf("a start with the queue full: %v, want ADMISSION_REJECTED naming --admission-max-queued", err)
	}
	runID, _ := e.runs.RunIDFor(context.Background(), e.request("t1", "b-3"))
	if recs := e.events(runID); len(recs) != 0 {
		t.Fatalf("a refused run has events: %s", types(recs))
	}
	e.end(ids[0])
	e.waitStarted(ids[1])
	if d, err := e.submit(c, "t1", "b-4"); err != nil || d.State != statestore.RunStatusQueued {
		t.Fatalf("a start once the queue has room: %+v %v, want QUEUED", d, err)
	}
}

// TestAdmission_OneTenantCannotFillTheQueue: with a share of the queue
// per tenant, a tenant that has its share waiting gets its next start
// over a limit rejected, naming the flag, while another tenant's start
// still queues: one tenant cannot fill the queue the others wait in.
func TestAdmission_OneTenantCannotFillTheQueue(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{Global: 1}, Policy: admission.Queue, MaxQueued: 4, MaxQueuedPerTenant: 2})
	defer c.Close(context.Background())
	var ids []string
	for i := range 3 {
		d, err := e.submit(c, "t1", fmt.Sprintf("s-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, d.RunID)
	}
	_, err := e.submit(c, "t1", "s-3")
	var ae *admission.Error
	if !errors.As(err, &ae) || ae.Code != admission.CodeRejected || !strings.Contains(ae.Message, "--admission-max-queued-per-tenant") {
		t.Fatalf("t1's start with its share waiting: %v, want ADMISSION_REJECTED naming --admission-max-queued-per-tenant", err)
	}
	if d, err := e.submit(c, "t2", "s-4"); err != nil || d.State != statestore.RunStatusQueued {
		t.Fatalf("t2's start: %+v %v, want QUEUED", d, err)
	}
	e.end(ids[0])
	e.waitStarted(ids[1])
	if d, err := e.submit(c, "t1", "s-5"); err != nil || d.State != statestore.RunStatusQueued {
		t.Fatalf("t1's start once its share has room: %+v %v, want QUEUED", d, err)
	}
}

// TestAdmission_FairWhileOneTenantFloods: 20 starts of one tenant
// submitted at once, all queued behind a running run, then one start of
// another tenant: it waits behind one or two of the first tenant's runs,
// not behind all the runs submitted in the same moment. Before, starts
// submitted at once all took the same turn (each read the tenant's latest
// before the others' entries came back from the bucket), and the other
// tenant's run waited behind every one of them (positions 18, 58, 98 in a
// flood of 40 at once).
func TestAdmission_FairWhileOneTenantFloods(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{Global: 1}, Policy: admission.Queue})
	defer c.Close(context.Background())
	if d, err := e.submit(c, "t1", "f-run"); err != nil || d.Started == nil {
		t.Fatalf("first: %+v %v", d, err)
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.submit(c, "t1", fmt.Sprintf("f-%d", i)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	d, err := e.submit(c, "t2", "other")
	if err != nil || d.State != statestore.RunStatusQueued {
		t.Fatalf("the other tenant's start: %+v %v", d, err)
	}
	if d.Position > 3 {
		t.Fatalf("the other tenant's run queued at position %d behind 20 of the first tenant's, want behind one or two of them", d.Position)
	}
}
