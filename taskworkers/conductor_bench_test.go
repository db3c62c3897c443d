package taskworkers_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/client"
	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/conductor-sdk/conductor-go/sdk/settings"
	"github.com/conductor-sdk/conductor-go/sdk/worker"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

type benchEnv struct {
	client *adapter.Client
	runs   *adapter.Runs
	store  *natsstore.Store
	emit   *registry.Emitter
	domain string

	mu   sync.Mutex
	defs map[string]defKey // workflowId -> its definition
}

func newBenchEnv(b testing.TB) *benchEnv {
	b.Helper()
	url := conductortest.URL(b)
	ctx := context.Background()
	sync := time.Duration(0)
	if v := os.Getenv("BENCH_SYNC_INTERVAL"); v != "" {
		sync, _ = time.ParseDuration(v)
	}
	js, _ := natstest.StartIn(b, b.TempDir(), natsstore.EmbeddedConfig{SyncInterval: sync})
	store, err := natsstore.Open(ctx, js, natsstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ids, err := registry.Open(ctx, js, registry.Options{})
	if err != nil {
		b.Fatal(err)
	}
	client, err := adapter.NewClient(adapter.ClientOptions{BaseURL: url})
	if err != nil {
		b.Fatal(err)
	}
	emit := registry.NewEmitter(ids, store)
	domain := "bench" + uuid.NewString()[:8]
	runs, err := adapter.OpenRuns(ctx, js, client, emit, adapter.RunsOptions{TaskDomain: domain})
	if err != nil {
		b.Fatal(err)
	}
	return &benchEnv{client: client, runs: runs, store: store, emit: emit, domain: domain, defs: map[string]defKey{}}
}

// startRuns starts n runs of a chain of steps noop steps and returns their
// workflow ids.
func (e *benchEnv) startRuns(b testing.TB, n, steps int) []string {
	return e.start(b, n, steps, plan.ExecutorSpec{Type: plan.ExecutorNoop}, plan.RetryPolicy{})
}

// startRunsWith starts n runs of one step with the executor and retry policy.
func (e *benchEnv) startRunsWith(b testing.TB, n int, x plan.ExecutorSpec, retries plan.RetryPolicy) []string {
	return e.start(b, n, 1, x, retries)
}

func (e *benchEnv) start(b testing.TB, n, steps int, x plan.ExecutorSpec, retries plan.RetryPolicy) []string {
	b.Helper()
	p := &plan.Plan{PlanID: "bench-" + uuid.NewString()[:8], PlanVersion: "1"}
	for i := 0; i < steps; i++ {
		s := plan.Step{StepID: fmt.Sprintf("s%02d", i), Executor: x, Retries: retries}
		if i > 0 {
			s.DependsOn = []string{fmt.Sprintf("s%02d", i-1)}
		}
		p.Steps = append(p.Steps, s)
	}
	compiled, err := plan.Compile(p)
	if err != nil {
		b.Fatal(err)
	}
	var ids []string
	for i := 0; i < n; i++ {
		res, err := e.runs.StartRun(context.Background(), adapter.StartRequest{TenantID: "t", ProjectID: "p", EnvironmentID: "bench",
			RunRequestID: uuid.NewString(), Plan: compiled})
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, res.Run.WorkflowID)
		e.mu.Lock()
		e.defs[res.Run.WorkflowID] = defKey{res.Run.WorkflowName, res.Run.WorkflowVersion}
		e.mu.Unlock()
	}
	return ids
}

// waitCompleted waits until every workflow is COMPLETED and returns them.
// While waiting it reads the running lists of the workflows' definitions
// (one call per definition, as the run watcher does), so that the harness
// costs Conductor and this process as little as it can; each workflow is
// read once, with its tasks, at the end.
func (e *benchEnv) waitCompleted(b testing.TB, ids []string) []*model.Workflow {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		left := 0
		for def, want := range e.defsOf(ids) {
			running, err := e.client.RunningWorkflows(context.Background(), def.name, def.version)
			if err != nil {
				left++ // unknown: ask again
				continue
			}
			for _, id := range running {
				if want[id] {
					left++
				}
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			break // the reads below say which workflow is late
		}
		time.Sleep(20 * time.Millisecond)
	}
	out := make([]*model.Workflow, len(ids))
	for i, id := range ids {
		wf, err := e.client.Workflow(context.Background(), id, true)
		if err != nil {
			b.Fatal(err)
		}
		if wf.Status != "COMPLETED" {
			var tasks []string
			for _, t := range wf.Tasks {
				tasks = append(tasks, fmt.Sprintf("%s:%s:%s:r%d:polls%d:worker=%s", t.ReferenceTaskName, t.TaskType, t.Status, t.RetryCount, t.PollCount, t.WorkerId))
			}
			b.Fatalf("workflow %s is %s, want COMPLETED: %v", id, wf.Status, tasks)
		}
		out[i] = wf
	}
	return out
}

type defKey struct {
	name    string
	version int32
}

// defsOf groups workflow ids by the definition they were started from.
func (e *benchEnv) defsOf(ids []string) map[defKey]map[string]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[defKey]map[string]bool{}
	for _, id := range ids {
		d := e.defs[id]
		if out[d] == nil {
			out[d] = map[string]bool{}
		}
		out[d][id] = true
	}
	return out
}

// startLatencies returns, for every step of the workflows, the time from
// Conductor's scheduledTime to StepStarted's persistedAt.
func (e *benchEnv) startLatencies(b testing.TB, wfs []*model.Workflow) []time.Duration {
	b.Helper()
	var lat []time.Duration
	for _, wf := range wfs {
		runID, _ := wf.Input["runId"].(string)
		recs, err := e.store.Fetch(context.Background(), runID, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		started := map[string]time.Time{}
		for _, r := range recs {
			if r.EventType == statestore.StepStarted {
				started[plan.StepRef(r.StepID)], _ = time.Parse(time.RFC3339Nano, r.PersistedAt)
			}
		}
		for _, t := range wf.Tasks {
			if at, ok := started[t.ReferenceTaskName]; ok && t.ScheduledTime > 0 {
				lat = append(lat, at.Sub(time.UnixMilli(t.ScheduledTime)))
			}
		}
	}
	return lat
}

const (
	benchSteps       = 10
	benchConcurrency = 8
)

// BenchmarkNoopSteps runs b.N noop steps (chains of 10 in parallel runs)
// through Conductor twice: with the Go SDK's own TaskRunner (one batch
// poller per task type, 8 workers, poll, execute nothing, update: the loop
// a team would write without the sidecar), and with the sidecar's workers
// (state check, StepStarted, execute, StepCompleted, update) at the same
// concurrency, poll interval and poll timeout. It reports steps/s of both
// and their ratio, and the sidecar's step start latency (task scheduled ->
// StepStarted persisted) p50/p99.
//
// BENCH_BARE_POLLERS=1 adds a third phase: 8 goroutines that each poll one
// task and update it, 8 polls in flight at once. That is not how the SDK
// polls, and on the memory store of Conductor 3.21 concurrent polls of one
// queue can strand a task for good (docs/conductor.md), so it is opt-in.
func BenchmarkNoopSteps(b *testing.B) {
	e := newBenchEnv(b)
	runsN := max(1, (b.N+benchSteps-1)/benchSteps)
	steps := runsN * benchSteps
	taskType := plan.TaskType(plan.ExecutorNoop)
	dc := adapter.DomainPoller{Client: e.client, Domain: e.domain}
	b.ResetTimer()
	b.StopTimer()

	// The SDK's TaskRunner: poll up to the free workers, run, update.
	sdkIDs := e.startRuns(b, runsN, benchSteps)
	runner := worker.NewTaskRunnerWithApiClient(client.NewAPIClient(nil, settings.NewHttpSettings(conductortest.URL(b))))
	_ = runner.SetPollTimeout(0) // the sidecar's default: no server-side wait
	b.StartTimer()
	cpu0 := processCPU(b)
	began := time.Now()
	if err := runner.StartWorkerWithDomain(taskType, func(*model.Task) (any, error) { return map[string]any{}, nil },
		benchConcurrency, 100*time.Millisecond, e.domain); err != nil {
		b.Fatal(err)
	}
	e.waitCompleted(b, sdkIDs)
	sdk := time.Since(began)
	b.StopTimer()
	sdkCPU := processCPU(b) - cpu0
	runner.Shutdown(taskType)
	runner.WaitWorkers()

	var pollers time.Duration
	if os.Getenv("BENCH_BARE_POLLERS") == "1" {
		pollers = e.independentPollers(b, runsN, dc, taskType)
	}

	// The sidecar's workers, with the run watcher and the drain monitor
	// that serve runs beside them and nudges after every reported step.
	sideIDs := e.startRuns(b, runsN, benchSteps)
	reg := prometheus.NewRegistry()
	watcher := adapter.NewWatcher(e.runs, e.store, adapter.WatcherOptions{})
	var monitor *drain.Controller
	w := taskworkers.New(dc, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		Metrics:  taskworkers.NewMetrics(reg),
		WorkerID: "sidecar-bench", Concurrency: map[string]int{taskType: benchConcurrency},
		OnTaskDone: func(runID string, mayEndRun bool) { // as serve does
			if mayEndRun {
				watcher.Nudge(runID)
			}
			monitor.Nudge(runID)
		},
	})
	monitor = drain.New(e.store, e.emit, e.client, drain.Options{Interrupt: w.Interrupt, ActiveRuns: e.runs.ActiveRunIDs})
	b.StartTimer()
	cpu0 = processCPU(b)
	began = time.Now()
	if err := watcher.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	if err := monitor.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	if err := w.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	wfs := e.waitCompleted(b, sideIDs)
	side := time.Since(began)
	b.StopTimer()
	sideCPU := processCPU(b) - cpu0
	_ = w.Close(context.Background())
	_ = watcher.Close(context.Background())
	_ = monitor.Close(context.Background())

	b.ReportMetric(float64(steps)/sdk.Seconds(), "sdk-steps/s")
	b.ReportMetric(float64(steps)/side.Seconds(), "sidecar-steps/s")
	b.ReportMetric(sdk.Seconds()/side.Seconds(), "sidecar/sdk")
	b.ReportMetric(float64(sdkCPU.Microseconds())/1000/float64(steps), "sdk-cpu-ms/step")
	b.ReportMetric(float64(sideCPU.Microseconds())/1000/float64(steps), "sidecar-cpu-ms/step")
	if pollers > 0 {
		b.ReportMetric(float64(steps)/pollers.Seconds(), "pollers-steps/s")
		b.ReportMetric(pollers.Seconds()/side.Seconds(), "sidecar/pollers")
	}
	lat := e.startLatencies(b, wfs)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		var sum float64
		var n uint64
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				sum += h.GetSampleSum()
				n += h.GetSampleCount()
			}
		}
		switch mf.GetName() {
		case "sidecar_worker_event_write_seconds":
			b.ReportMetric(sum/float64(max(n, 1))*1000, "append-mean-ms")
		case "sidecar_worker_step_duration_seconds":
			b.ReportMetric(sum/float64(max(n, 1))*1000, "handle-mean-ms")
		}
	}
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "start-p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "start-p99-ms")
	}
}

// independentPollers runs n chains with 8 goroutines that each poll one
// task (no server-side wait, 100ms pause on an empty poll) and complete it.
func (e *benchEnv) independentPollers(b *testing.B, n int, dc adapter.DomainPoller, taskType string) time.Duration {
	ids := e.startRuns(b, n, benchSteps)
	b.StartTimer()
	began := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for g := 0; g < benchConcurrency; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				tasks, err := dc.BatchPoll(ctx, taskType, "bare", 1, 0)
				if err != nil || len(tasks) == 0 {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				for _, t := range tasks {
					_ = e.client.UpdateTask(context.Background(), &model.TaskResult{TaskId: t.TaskId, WorkflowInstanceId: t.WorkflowInstanceId, WorkerId: "bare", Status: model.CompletedTask})
				}
			}
		}()
	}
	e.waitCompleted(b, ids)
	took := time.Since(began)
	b.StopTimer()
	cancel()
	wg.Wait()
	return took
}

// BenchmarkStepStartIdle measures step start latency (task scheduled in
// Conductor -> StepStarted persisted) when the sidecar is not busy: one
// run of a 10-step noop chain at a time, with serve's default poll timeout
// (1s). Here the latency is the poll strategy's, not queueing behind busy
// slots.
func BenchmarkStepStartIdle(b *testing.B) {
	e := newBenchEnv(b)
	taskType := plan.TaskType(plan.ExecutorNoop)
	w := taskworkers.New(adapter.DomainPoller{Client: e.client, Domain: e.domain}, e.store, e.emit, nil, exec.New(exec.Options{}).Executors(), taskworkers.Options{
		WorkerID: "sidecar-bench-idle", Concurrency: map[string]int{taskType: benchConcurrency},
	})
	if err := w.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer w.Close(context.Background())
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < max(1, b.N/benchSteps); i++ {
		wfs := e.waitCompleted(b, e.startRuns(b, 1, benchSteps))
		lat = append(lat, e.startLatencies(b, wfs)...)
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "start-p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "start-p99-ms")
	}
}

// processCPU returns the CPU time (user + system) this process has used.
// It includes the harness (starting runs, waiting for them) and, in the
// sidecar phase, the embedded NATS server.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
