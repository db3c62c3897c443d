package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

func TestRequestKey(t *testing.T) {
	// printf 't|p|e|plan|1|req' | sha256sum
	const want = "3a741519e92a96826bbe8282046e0d7f7f03ec574f4a02977c267d5c6fb815f2"
	if got := RequestKey("t", "p", "e", "plan", "1", "req"); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if RequestKey("t", "p", "e", "plan", "1", "req2") == want {
		t.Fatal("different runRequestIds give the same key")
	}
}

func TestRuns_RegisterPlan(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)

	t.Run("Idempotent", func(t *testing.T) {
		p := testPlan(t)
		a := env.newRuns(t, u, RunsOptions{})
		for range 2 {
			if err := a.RegisterPlan(ctx, "tenant-a", p); err != nil {
				t.Fatal(err)
			}
		}
		// Another replica (empty cache) registers the same plan again.
		if err := env.newRuns(t, u, RunsOptions{}).RegisterPlan(ctx, "tenant-a", p); err != nil {
			t.Fatal(err)
		}
		def, err := a.Client().WorkflowDef(ctx, plan.WorkflowName("tenant-a", p.Plan.PlanID, p.Plan.PlanVersion), p.Workflow.Version)
		if err != nil {
			t.Fatal(err)
		}
		if got := EmbeddedPlanHash(def); got != p.ContentHash {
			t.Fatalf("embedded hash %q, want %s", got, p.ContentHash)
		}
		// Registered from the exact JSON: the zero values the SDK's
		// omitempty would drop reached the server.
		if def.Restartable || len(def.Tasks) != 1 || def.Tasks[0].TaskDefinition == nil ||
			def.Tasks[0].TaskDefinition.RetryDelaySeconds != 0 {
			t.Fatalf("registered def: restartable %v, tasks %+v", def.Restartable, def.Tasks)
		}
	})
	t.Run("ErrPlanConflict", func(t *testing.T) {
		p := testPlan(t)
		a := env.newRuns(t, u, RunsOptions{})
		if err := a.RegisterPlan(ctx, "tenant-a", p); err != nil {
			t.Fatal(err)
		}
		changed := changedPlan(t, p)
		// Same process (cache), another replica (KV record).
		for name, r := range map[string]*Runs{"cache": a, "registry": env.newRuns(t, u, RunsOptions{})} {
			err := r.RegisterPlan(ctx, "tenant-a", changed)
			if !errors.Is(err, ErrPlanConflict) || errcode.CodeOf(err) != CodePlanVersionConflict {
				t.Errorf("%s: got %v, want PLAN_VERSION_CONFLICT", name, err)
			}
			// The registered plan may be another tenant's (planIds are
			// one namespace, Conductor's): nothing of it is told, its
			// content hash included, which would confirm a guess of it.
			if err != nil && strings.Contains(err.Error(), p.ContentHash) {
				t.Errorf("%s: the conflict names the registered plan's hash: %v", name, err)
			}
		}
		def, err := a.Client().WorkflowDef(ctx, plan.WorkflowName("tenant-a", p.Plan.PlanID, p.Plan.PlanVersion), p.Workflow.Version)
		if err != nil {
			t.Fatal(err)
		}
		if EmbeddedPlanHash(def) != p.ContentHash {
			t.Fatalf("conflicting plan changed the registered definition: %q", def.Description)
		}
	})
	t.Run("ErrPlanConflict/Conductor", func(t *testing.T) {
		// Another deployment (its own NATS) registered the same workflow
		// name and version with another hash.
		p := testPlan(t)
		if err := newNATS(t).newRuns(t, u, RunsOptions{}).RegisterPlan(ctx, "tenant-a", p); err != nil {
			t.Fatal(err)
		}
		other := changedPlan(t, p)
		if err := env.newRuns(t, u, RunsOptions{}).RegisterPlan(ctx, "tenant-a", other); !errors.Is(err, ErrPlanConflict) {
			t.Fatalf("got %v, want PLAN_VERSION_CONFLICT", err)
		}
	})
	t.Run("EachTenantsOwn", func(t *testing.T) {
		// A plan id and version are each tenant's: another tenant's plan
		// under the same ones starts (neither refused nor confirmed: no
		// oracle of the content), runs under its own workflow definition
		// and reads back its own steps; within a tenant a version stays
		// immutable.
		p := testPlan(t)
		two := p.Plan.Clone()
		two.Steps = append(two.Steps, plan.Step{StepID: "step-2", DependsOn: []string{"step-1"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}})
		other := compilePlan(t, two)
		r := env.newRuns(t, u, RunsOptions{})
		a, err := r.StartRun(ctx, request(p, "req-a"))
		if err != nil {
			t.Fatal(err)
		}
		reqB := request(other, "req-b")
		reqB.TenantID = "tenant-b"
		b, err := r.StartRun(ctx, reqB)
		if err != nil {
			t.Fatalf("tenant-b's plan under tenant-a's plan id and version: %v, want started", err)
		}
		if a.Run.WorkflowName == b.Run.WorkflowName {
			t.Fatalf("both tenants' runs use workflow %s", a.Run.WorkflowName)
		}
		for _, r := range []*Runs{r, env.newRuns(t, u, RunsOptions{})} { // cache, registry
			again := request(p, "req-b2")
			again.TenantID = "tenant-b"
			if _, err := r.StartRun(ctx, again); !errors.Is(err, ErrPlanConflict) {
				t.Fatalf("tenant-b's other content under its own version: %v, want PLAN_VERSION_CONFLICT", err)
			}
		}
		for tenant, want := range map[string]int{"tenant-a": 1, "tenant-b": 2} {
			steps, err := r.PlanSteps(ctx, tenant, p.Plan.PlanID, p.Plan.PlanVersion)
			if err != nil || len(steps) != want {
				t.Errorf("%s: %d steps (%v), want %d", tenant, len(steps), err, want)
			}
		}
	})
	t.Run("SharedNameOfEarlierRuns", func(t *testing.T) {
		// A plan version registered before plan ids were each tenant's
		// (under the shared name, as Compile names it) is read back for
		// a tenant that has no definition of its own: its earlier runs.
		p := testPlan(t)
		r := env.newRuns(t, u, RunsOptions{})
		wf, err := p.WorkflowDefJSON()
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Client().RegisterWorkflowDefJSON(ctx, wf); err != nil {
			t.Fatal(err)
		}
		steps, err := r.PlanSteps(ctx, "tenant-a", p.Plan.PlanID, p.Plan.PlanVersion)
		if err != nil || len(steps) != 1 {
			t.Fatalf("%d steps (%v), want the shared definition's 1", len(steps), err)
		}
		if _, err := r.PlanSteps(ctx, "tenant-a", "plan-"+suffix(t), "1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a plan nobody registered: %v, want NOT_FOUND", err)
		}
	})
	t.Run("ErrInvalidInput", func(t *testing.T) {
		r := env.newRuns(t, u, RunsOptions{})
		for name, p := range map[string]*plan.Compiled{
			"nil":     nil,
			"no plan": {ContentHash: "h", Workflow: model.WorkflowDef{Name: "w"}},
			"pipe":    {Plan: &plan.Plan{PlanID: "a|b", PlanVersion: "1"}, ContentHash: "h", Workflow: model.WorkflowDef{Name: "w"}},
			"no hash": {Plan: &plan.Plan{PlanID: "a", PlanVersion: "1"}, Workflow: model.WorkflowDef{Name: "w"}},
			"no name": {Plan: &plan.Plan{PlanID: "a", PlanVersion: "1"}, ContentHash: "h"},
		} {
			if err := r.RegisterPlan(ctx, "tenant-a", p); !errors.Is(err, ErrInvalidInput) {
				t.Errorf("%s: got %v, want INVALID_INPUT", name, err)
			}
		}
		for _, tenant := range []string{"", "t|x"} {
			if err := r.RegisterPlan(ctx, tenant, testPlan(t)); !errors.Is(err, ErrInvalidInput) {
				t.Errorf("tenant %q: got %v, want INVALID_INPUT", tenant, err)
			}
		}
	})
}

// checkStarted checks that the run has exactly one RunStarted with the
// expected payload and that Conductor runs exactly its workflow.
func checkStarted(t *testing.T, env *natsEnv, r *Runs, p *plan.Compiled, run Run) {
	t.Helper()
	ctx := context.Background()
	recs := env.events(t, run.RunID)
	if n := countType(recs, statestore.RunStarted); n != 1 || len(recs) != 1 {
		t.Fatalf("run %s has %d events (%d RunStarted), want exactly one RunStarted", run.RunID, len(recs), n)
	}
	var payload struct {
		EngineRunRef, EngineType, StartedAt string
	}
	if err := json.Unmarshal(recs[0].Payload, &payload); err != nil {
		t.Fatal(err)
	}
	name := plan.WorkflowName(run.TenantID, p.Plan.PlanID, p.Plan.PlanVersion)
	wantRef := "conductor://" + name + "/" + run.WorkflowID
	if payload.EngineRunRef != wantRef || payload.EngineType != "conductor" || payload.StartedAt == "" {
		t.Fatalf("RunStarted payload %+v, want engineRunRef %s, engineType conductor, startedAt", payload, wantRef)
	}
	ids, err := r.Client().RunningWorkflows(ctx, name, p.Workflow.Version)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != run.WorkflowID {
		t.Fatalf("running workflows %v, want exactly [%s]", ids, run.WorkflowID)
	}
	got, err := r.Run(ctx, run.RunID)
	if err != nil {
		t.Fatal(err)
	}
	wf, err := r.Client().Workflow(ctx, run.WorkflowID, false)
	if err != nil {
		t.Fatal(err)
	}
	if wf.CorrelationId != run.RunID || wf.Input[plan.InputRunID] != run.RunID || wf.Input[plan.InputTenantID] != run.TenantID ||
		wf.Input[plan.InputPlanVersion] != run.PlanVersion || wf.Input[InputStartAttemptID] != got.AttemptID {
		t.Fatalf("workflow correlationId %q input %v, want runId %s", wf.CorrelationId, wf.Input, run.RunID)
	}
	if got.WorkflowID != run.WorkflowID || got.State != RunStateStarted || !got.RunStartedEmitted {
		t.Fatalf("registry entry %+v, want STARTED with workflow %s and RunStarted recorded", got, run.WorkflowID)
	}
}

func TestRuns_StartRun(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)

	t.Run("Idempotent", func(t *testing.T) {
		p := testPlan(t)
		r := env.newRuns(t, u, RunsOptions{})
		first, err := r.StartRun(ctx, request(p, "req-1"))
		if err != nil {
			t.Fatal(err)
		}
		if !first.Created || uuid.Validate(first.Run.RunID) != nil || first.Run.WorkflowID == "" {
			t.Fatalf("first start: %+v", first)
		}
		for _, rr := range []*Runs{r, env.newRuns(t, u, RunsOptions{})} {
			again, err := rr.StartRun(ctx, request(p, "req-1"))
			if err != nil {
				t.Fatal(err)
			}
			if again.Created || again.Run.RunID != first.Run.RunID || again.Run.WorkflowID != first.Run.WorkflowID {
				t.Fatalf("repeat: got %+v, want run %s workflow %s not created", again, first.Run.RunID, first.Run.WorkflowID)
			}
		}
		checkStarted(t, env, r, p, first.Run)
		byReq, err := r.RunForRequest(ctx, "tenant-a", "proj-a", "dev", p.Plan.PlanID, p.Plan.PlanVersion, "req-1")
		if err != nil || byReq.RunID != first.Run.RunID {
			t.Fatalf("RunForRequest: %v %v", byReq, err)
		}
		// Another runRequestId is another run.
		other, err := r.StartRun(ctx, request(p, "req-2"))
		if err != nil {
			t.Fatal(err)
		}
		if !other.Created || other.Run.RunID == first.Run.RunID {
			t.Fatalf("req-2: %+v", other)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		p := testPlan(t)
		const n = 8
		replicas := make([]*Runs, n)
		for i := range replicas {
			replicas[i] = env.newRuns(t, u, RunsOptions{})
		}
		results := make([]StartResult, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		startGate := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-startGate
				results[i], errs[i] = replicas[i].StartRun(ctx, request(p, "req-concurrent"))
			})
		}
		close(startGate)
		wg.Wait()
		created := 0
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("replica %d: %v", i, errs[i])
			}
			if results[i].Created {
				created++
			}
			if results[i].Run.RunID != results[0].Run.RunID || results[i].Run.WorkflowID != results[0].Run.WorkflowID {
				t.Fatalf("replica %d got run %s/%s, replica 0 %s/%s", i, results[i].Run.RunID, results[i].Run.WorkflowID,
					results[0].Run.RunID, results[0].Run.WorkflowID)
			}
		}
		if created != 1 {
			t.Fatalf("%d replicas report created, want 1", created)
		}
		checkStarted(t, env, replicas[0], p, results[0].Run)
	})

	t.Run("ErrEngineUnavailable", func(t *testing.T) {
		p := testPlan(t)
		good := env.newRuns(t, u, RunsOptions{})
		if err := good.RegisterPlan(ctx, "tenant-a", p); err != nil {
			t.Fatal(err)
		}
		down := env.newRuns(t, unusedURL(t), RunsOptions{})
		// The plan is registered in the run index but this replica has
		// not registered it in (its) Conductor: the first call fails there.
		_, err := down.StartRun(ctx, request(p, "req-down"))
		if !errors.Is(err, ErrEngineUnavailable) || errcode.CodeOf(err) != CodeEngineUnavailable {
			t.Fatalf("got %v, want ENGINE_UNAVAILABLE", err)
		}
		// Same with the plan cached, so that StartWorkflow is what fails.
		down.mu.Lock()
		down.plans[planKey("tenant-a", p.Plan.PlanID, p.Plan.PlanVersion)] = registeredPlan{hash: p.ContentHash, checked: time.Now()}
		down.mu.Unlock()
		_, err = down.StartRun(ctx, request(p, "req-down"))
		if !errors.Is(err, ErrEngineUnavailable) {
			t.Fatalf("got %v, want ENGINE_UNAVAILABLE", err)
		}
		var rr reqRecord
		if _, err := down.getJSON(ctx, keyReq+RequestKey("tenant-a", "proj-a", "dev", p.Plan.PlanID, p.Plan.PlanVersion, "req-down"), &rr); err != nil {
			t.Fatal(err)
		}
		if _, err := down.Run(ctx, rr.RunID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("run entry after a failed start: %v, want NOT_FOUND", err)
		}
		if keys, _ := down.listKeys(ctx, keyActive+rr.RunID); len(keys) != 0 {
			t.Fatalf("active index after a failed start: %v", keys)
		}
		if recs := env.events(t, rr.RunID); len(recs) != 0 {
			t.Fatalf("%d events after a failed start, want none", len(recs))
		}
		// The retry, once Conductor answers, starts cleanly.
		res, err := good.StartRun(ctx, request(p, "req-down"))
		if err != nil {
			t.Fatal(err)
		}
		if !res.Created || res.Run.RunID != rr.RunID {
			t.Fatalf("retry: %+v, want created with runId %s", res, rr.RunID)
		}
		checkStarted(t, env, good, p, res.Run)
		// A repeat is answered from the run index even while Conductor
		// is down.
		again, err := down.StartRun(ctx, request(p, "req-down"))
		if err != nil || again.Created || again.Run.WorkflowID != res.Run.WorkflowID {
			t.Fatalf("repeat while down: %+v %v, want the existing run", again, err)
		}
		// The same request with another plan under the same version.
		if _, err := down.StartRun(ctx, request(changedPlan(t, p), "req-down")); !errors.Is(err, ErrPlanConflict) {
			t.Fatalf("repeat with another plan: got %v, want PLAN_VERSION_CONFLICT", err)
		}
	})

	t.Run("ErrInvalidInput", func(t *testing.T) {
		r := env.newRuns(t, u, RunsOptions{})
		p := testPlan(t)
		for name, req := range map[string]StartRequest{
			"no tenant":  {ProjectID: "p", EnvironmentID: "e", RunRequestID: "r", Plan: p},
			"pipe":       {TenantID: "t|x", ProjectID: "p", EnvironmentID: "e", RunRequestID: "r", Plan: p},
			"no plan":    {TenantID: "t", ProjectID: "p", EnvironmentID: "e", RunRequestID: "r"},
			"no request": {TenantID: "t", ProjectID: "p", EnvironmentID: "e", Plan: p},
		} {
			if _, err := r.StartRun(ctx, req); !errors.Is(err, ErrInvalidInput) {
				t.Errorf("%s: got %v, want INVALID_INPUT", name, err)
			}
		}
	})

	t.Run("LeaseHeld", func(t *testing.T) {
		// A start attempt holds the lease and never finishes: a second
		// request waits StartWait and gets RUN_START_IN_PROGRESS.
		p := testPlan(t)
		r := env.newRuns(t, u, RunsOptions{StartWait: 200 * time.Millisecond})
		if err := r.RegisterPlan(ctx, "tenant-a", p); err != nil {
			t.Fatal(err)
		}
		req := request(p, "req-held")
		holder := crashedStart(t, r, req, false)
		_, err := r.StartRun(ctx, req)
		if !errors.Is(err, ErrRunStartInProgress) {
			t.Fatalf("got %v, want RUN_START_IN_PROGRESS", err)
		}
		if _, err := r.Run(ctx, holder.RunID); err != nil {
			t.Fatal(err)
		}
	})
}

// crashedStart plays a start attempt that crashed after taking the lease
// (and, with startWorkflow, after starting the workflow, before recording
// it). It returns the registry entry as the crashed attempt left it.
func crashedStart(t *testing.T, r *Runs, req StartRequest, startWorkflow bool) *Run {
	t.Helper()
	ctx := context.Background()
	defs, err := defsOf("test", req.TenantID, req.Plan)
	if err != nil {
		t.Fatal(err)
	}
	reqKey := RequestKey(req.TenantID, req.ProjectID, req.EnvironmentID, defs.PlanID, defs.PlanVersion, req.RunRequestID)
	runID, err := r.runIDFor(ctx, reqKey)
	if err != nil {
		t.Fatal(err)
	}
	rec := r.newRun(runID, reqKey, req, defs)
	if _, err := r.createRun(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := r.kv.Put(ctx, keyActive+runID, []byte(reqKey)); err != nil {
		t.Fatal(err)
	}
	if startWorkflow {
		rec.WorkflowID, err = r.conductor.StartWorkflow(ctx, startRequest(rec, nil))
		if err != nil {
			t.Fatal(err)
		}
	}
	return rec
}

func TestRuns_CrashRecovery(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	// Subtests run in parallel, each on its own NATS server (Reconcile
	// looks at every plan of its registry). The shortest lease the client timeout (1s) allows.
	opts := RunsOptions{LeaseTTL: 2 * time.Second}

	t.Run("BeforeStartWorkflow", func(t *testing.T) {
		// The crashed attempt never reached Conductor: once the lease
		// expires, the retry takes over and starts the run.
		t.Parallel()
		env, p, r := registeredRuns(t, u, opts)
		crashed := crashedStart(t, r, request(p, "req"), false)
		res, err := r.StartRun(ctx, request(p, "req")) // waits out the lease
		if err != nil {
			t.Fatal(err)
		}
		if !res.Created || res.Run.RunID != crashed.RunID || res.Run.AttemptID == crashed.AttemptID {
			t.Fatalf("got %+v, want a new attempt of run %s", res, crashed.RunID)
		}
		checkStarted(t, env, r, p, res.Run)
	})

	t.Run("AfterStartWorkflow/Adopted", func(t *testing.T) {
		// The crashed attempt started the workflow but did not record it:
		// the watcher adopts that workflow once the lease expires, and the
		// retry returns it without starting another.
		t.Parallel()
		env, p, r := registeredRuns(t, u, opts)
		crashed := crashedStart(t, r, request(p, "req"), true)
		// The workers are asked to look for a task the dead process took
		// (e2e: TestE2E_AKillDuringAStartLeavesNoTaskBehind).
		var asked atomic.Int32
		w := NewWatcher(r, env.store, WatcherOptions{StartAdopted: func() { asked.Add(1) }})
		if err := w.Check(ctx, crashed.RunID); err != nil { // lease still live: nothing to do
			t.Fatal(err)
		}
		if got, _ := r.Run(ctx, crashed.RunID); got.State != RunStateStarting || asked.Load() != 0 {
			t.Fatalf("state %s, %d looks for strays before the lease expired, want STARTING and none", got.State, asked.Load())
		}
		time.Sleep(time.Until(crashed.LeaseExpiresAt) + 50*time.Millisecond)
		if err := w.Check(ctx, crashed.RunID); err != nil {
			t.Fatal(err)
		}
		if n := asked.Load(); n != 1 {
			t.Fatalf("%d looks for strays asked after the adoption, want 1", n)
		}
		res, err := r.StartRun(ctx, request(p, "req"))
		if err != nil {
			t.Fatal(err)
		}
		if res.Created || res.Run.WorkflowID != crashed.WorkflowID {
			t.Fatalf("got %+v, want the adopted workflow %s", res, crashed.WorkflowID)
		}
		checkStarted(t, env, r, p, res.Run)
	})

	t.Run("AfterStartWorkflow/Orphan", func(t *testing.T) {
		// The retry takes over before the watcher adopts: it starts a
		// second workflow, and Reconcile terminates the first (an orphan).
		t.Parallel()
		env, p, r := registeredRuns(t, u, opts)
		crashed := crashedStart(t, r, request(p, "req"), true)
		res, err := r.StartRun(ctx, request(p, "req"))
		if err != nil {
			t.Fatal(err)
		}
		if !res.Created || res.Run.RunID != crashed.RunID || res.Run.WorkflowID == crashed.WorkflowID {
			t.Fatalf("got %+v, want a new workflow for run %s", res, crashed.RunID)
		}
		w := NewWatcher(r, env.store, WatcherOptions{})
		if err := w.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		orphan, err := r.Client().Workflow(ctx, crashed.WorkflowID, false)
		if err != nil {
			t.Fatal(err)
		}
		if orphan.Status != model.TerminatedWorkflow {
			t.Fatalf("orphan workflow is %s, want TERMINATED", orphan.Status)
		}
		checkStarted(t, env, r, p, res.Run)
	})

	t.Run("AfterStartWorkflow/Released", func(t *testing.T) {
		// A start that failed with an unknown outcome released its lease,
		// but its workflow exists: Reconcile terminates it once it is older
		// than the lease, since no run entry claims it.
		t.Parallel()
		env, p, r := registeredRuns(t, u, opts)
		crashed := crashedStart(t, r, request(p, "req"), true)
		_, rev, err := r.get(ctx, crashed.RunID)
		if err != nil {
			t.Fatal(err)
		}
		r.release(ctx, crashed, rev)
		w := NewWatcher(r, env.store, WatcherOptions{})
		if err := w.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		if wf, _ := r.Client().Workflow(ctx, crashed.WorkflowID, false); wf.Status != model.RunningWorkflow {
			t.Fatalf("a young unclaimed workflow was %s, want left RUNNING", wf.Status)
		}
		time.Sleep(opts.LeaseTTL)
		if err := w.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, r.Client(), crashed.WorkflowID, model.TerminatedWorkflow)
	})

	t.Run("OtherDeployment", func(t *testing.T) {
		// Another deployment (its own NATS, its own task domain) runs the
		// same plan on the same Conductor: Reconcile leaves its workflows
		// alone although no run entry here claims them.
		t.Parallel()
		env, p, r := registeredRuns(t, u, opts)
		other, err := newNATS(t).newRuns(t, u, opts).StartRun(ctx, request(p, "req"))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(opts.LeaseTTL + 100*time.Millisecond)
		if err := NewWatcher(r, env.store, WatcherOptions{}).Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		if wf, err := r.Client().Workflow(ctx, other.Run.WorkflowID, false); err != nil || wf.Status != model.RunningWorkflow {
			t.Fatalf("the other deployment's workflow: %v %v, want RUNNING", wf, err)
		}
		if err := r.Client().Terminate(ctx, other.Run.WorkflowID, "cleanup"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ExpiredNothingStarted", func(t *testing.T) {
		// Nobody retries a start that crashed before reaching Conductor:
		// the watcher releases the lease and drops the index entry.
		t.Parallel()
		env, p, r := registeredRuns(t, u, opts)
		crashed := crashedStart(t, r, request(p, "req"), false)
		time.Sleep(time.Until(crashed.LeaseExpiresAt) + 50*time.Millisecond)
		w := NewWatcher(r, env.store, WatcherOptions{})
		if err := w.Scan(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Run(ctx, crashed.RunID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("run entry: %v, want NOT_FOUND", err)
		}
		if keys, _ := r.listKeys(ctx, keyActive+crashed.RunID); len(keys) != 0 {
			t.Fatalf("active index: %v", keys)
		}
	})
}

func TestRuns_EnsureStarted(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env, p, r := registeredRuns(t, u, RunsOptions{})

	t.Run("AppendsRunStarted", func(t *testing.T) {
		// The workflow is recorded, RunStarted not yet appended (the
		// window a fast worker can hit).
		rec := crashedStart(t, r, request(p, "req-1"), true)
		_, rev, err := r.get(ctx, rec.RunID)
		if err != nil {
			t.Fatal(err)
		}
		rec.State, rec.StartedAt, rec.LeaseExpiresAt = RunStateStarted, time.Now().UTC(), time.Time{}
		if _, err := r.updateRun(ctx, rec, rev); err != nil {
			t.Fatal(err)
		}
		got, err := r.EnsureStarted(ctx, rec.RunID, rec.WorkflowID)
		if err != nil || got.WorkflowID != rec.WorkflowID {
			t.Fatalf("got %+v %v", got, err)
		}
		checkStarted(t, env, r, p, *rec)
		if err := r.Client().Terminate(ctx, rec.WorkflowID, "cleanup"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("WaitsForStart", func(t *testing.T) {
		// The workflow exists but the start has not recorded it yet (the
		// holder is between StartWorkflow and its compare-and-set):
		// EnsureStarted waits, then appends RunStarted.
		rec := crashedStart(t, r, request(p, "req-2"), true)
		_, rev, err := r.get(ctx, rec.RunID)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			run *Run
			err error
		}
		done := make(chan result, 1)
		go func() {
			got, err := r.EnsureStarted(ctx, rec.RunID, rec.WorkflowID)
			done <- result{got, err}
		}()
		time.Sleep(150 * time.Millisecond)
		select {
		case res := <-done:
			t.Fatalf("returned before the start was recorded: %+v %v", res.run, res.err)
		default:
		}
		rec.State, rec.StartedAt, rec.LeaseExpiresAt = RunStateStarted, time.Now().UTC(), time.Time{}
		if _, err := r.updateRun(ctx, rec, rev); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res.err != nil || res.run.WorkflowID != rec.WorkflowID {
			t.Fatalf("got %+v %v", res.run, res.err)
		}
		checkStarted(t, env, r, p, *rec)
		if err := r.Client().Terminate(ctx, rec.WorkflowID, "cleanup"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ErrConflict", func(t *testing.T) {
		res, err := r.StartRun(ctx, request(p, "req-3"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.EnsureStarted(ctx, res.Run.RunID, "00000000-0000-4000-8000-000000000001"); !errors.Is(err, ErrConflict) {
			t.Fatalf("another workflow: got %v, want CONFLICT", err)
		}
		if err := r.Client().Terminate(ctx, res.Run.WorkflowID, "cleanup"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		if _, err := r.EnsureStarted(ctx, "6f1c2b8e-0d5c-4f3e-9a59-2f4b1c0e7d11", "w"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("got %v, want NOT_FOUND", err)
		}
	})
	t.Run("ErrRunStartInProgress", func(t *testing.T) {
		crashed := crashedStart(t, r, request(p, "req-4"), false)
		start := time.Now()
		if _, err := r.EnsureStarted(ctx, crashed.RunID, "w"); !errors.Is(err, ErrRunStartInProgress) {
			t.Fatalf("got %v, want RUN_START_IN_PROGRESS", err)
		}
		if d := time.Since(start); d < maxEnsureWait || d > maxEnsureWait+time.Second {
			t.Fatalf("waited %s, want about %s", d, maxEnsureWait)
		}
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if _, err := r.EnsureStarted(short, crashed.RunID, "w"); !errors.Is(err, ErrRunStartInProgress) {
			t.Fatalf("short deadline: got %v, want RUN_START_IN_PROGRESS", err)
		}
	})
}

// TestRuns_LeaderRun: the leader read that confirms a conflict before a
// task is failed as foreign returns what the run index holds (entry and
// revision), and "not found" for a deleted entry and a run never recorded.
func TestRuns_LeaderRun(t *testing.T) {
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, unusedURL(t), RunsOptions{})
	rec := &Run{RunID: "run-leader", State: RunStateStarted, WorkflowID: "wf-1", TenantID: "t"}
	rev, err := r.createRun(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	got, gotRev, err := r.leaderRun(ctx, "run-leader")
	if err != nil || got.WorkflowID != "wf-1" || gotRev != rev {
		t.Fatalf("leader read: %+v rev %d (want %d), %v", got, gotRev, rev, err)
	}
	r.release(ctx, rec, rev)
	if _, _, err := r.leaderRun(ctx, "run-leader"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted entry: %v, want not found", err)
	}
	if _, _, err := r.leaderRun(ctx, "never"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown run: %v, want not found", err)
	}
}

// TestRuns_RegisterPlanRejectedKeepsNoClaim: a plan whose workflow
// definition Conductor refuses as invalid (ENGINE_REJECTED) leaves no claim
// of its version behind: the fixed plan is published under the same
// planId and planVersion, by this replica or another.
func TestRuns_RegisterPlanRejectedKeepsNoClaim(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	good := testPlan(t)
	bad := compilePlan(t, good.Plan.Clone())
	// An input naming a task the workflow does not have: Conductor
	// refuses the definition.
	bad.Workflow.Tasks[0].InputParameters = map[string]any{"bogus": "${nosuchtask.output.result}"}
	bad.ContentHash = "sha256:rejected-" + suffix(t)
	r := env.newRuns(t, u, RunsOptions{})
	if err := r.RegisterPlan(ctx, "tenant-a", bad); !errors.Is(err, ErrEngineRejected) {
		t.Fatalf("the refused plan: %v, want ENGINE_REJECTED", err)
	}
	for name, rr := range map[string]*Runs{"same replica": r, "another replica": env.newRuns(t, u, RunsOptions{})} {
		if err := rr.RegisterPlan(ctx, "tenant-a", good); err != nil {
			t.Fatalf("%s: the fixed plan under the same version: %v, want registered", name, err)
		}
	}
}
