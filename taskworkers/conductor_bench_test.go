package taskworkers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
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
	return e.startPlan(b, n, p)
}

// startPlan starts n runs of p and returns their workflow ids.
func (e *benchEnv) startPlan(b testing.TB, n int, p *plan.Plan) []string {
	b.Helper()
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

// waitCompleted waits until every workflow is COMPLETED and returns them,
// read with their tasks.
func (e *benchEnv) waitCompleted(b testing.TB, ids []string) []*model.Workflow {
	b.Helper()
	e.waitEnded(b, ids)
	return e.completed(b, ids)
}

// waitEnded waits until no workflow of ids is RUNNING any more (a minute at
// most). It reads the running lists of the workflows' definitions (one call
// per definition, as the run watcher does), so that the harness costs
// Conductor and this process as little as it can.
func (e *benchEnv) waitEnded(b testing.TB, ids []string) {
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
}

// completed reads every workflow with its tasks and fails b unless all of
// them are COMPLETED.
func (e *benchEnv) completed(b testing.TB, ids []string) []*model.Workflow {
	b.Helper()
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

const benchSteps = 10

// benchConcurrency is the tasks in hand at once in every phase of
// BenchmarkNoopSteps: BENCH_CONCURRENCY, default 16 (serve's default for
// noop steps).
func benchConcurrency() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_CONCURRENCY")); err == nil && n > 0 {
		return n
	}
	return 16
}

// benchPollers is the sidecar's poll loops per task type in
// BenchmarkNoopSteps: BENCH_POLLERS_PER_TYPE, default 1 (serve's default;
// more only on a Conductor whose queue takes concurrent polls).
func benchPollers() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_POLLERS_PER_TYPE")); err == nil && n > 0 {
		return n
	}
	return 1
}

// BenchmarkNoopSteps runs b.N noop steps (chains of 10 in parallel runs)
// through Conductor three times, with the same number of tasks in hand
// (benchConcurrency): a raw loop (plain net/http batch polls for as many
// tasks as it has free slots, 32 at most, decoding two fields, each update
// in a goroutine of its own: the limit of this Conductor on this machine);
// the Go SDK's own TaskRunner (one batch poller per task type, poll,
// execute nothing, update: the loop a team would write without the
// sidecar); and the sidecar's workers (state check, StepStarted, execute,
// StepCompleted, update) with the same poll interval and poll timeout. It
// reports steps/s of each and the ratios, CPU per step of this process
// (the embedded NATS server included in the sidecar phase), polls per step,
// and the sidecar's step start latency (task scheduled -> StepStarted
// persisted) p50/p99.
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

	// BENCH_SIDECAR_ONLY=1 skips the raw loop and the SDK (for a CPU
	// profile of the sidecar alone).
	only := os.Getenv("BENCH_SIDECAR_ONLY") == "1"
	var raw, rawCPU, sdk, sdkCPU time.Duration
	var rawPolls float64
	if !only {
		raw, rawCPU, rawPolls = e.rawLoop(b, runsN, taskType)
		sdk, sdkCPU = e.sdkRunner(b, runsN, taskType)
	}

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
		WorkerID: "sidecar-bench", Concurrency: map[string]int{taskType: benchConcurrency()}, PollersPerType: benchPollers(),
		OnTaskDone: func(runID string, mayEndRun, mayEndDrain bool) { // as serve does
			if mayEndRun {
				watcher.Nudge(runID)
			}
			if mayEndDrain {
				monitor.Nudge(runID)
			}
		},
	})
	monitor = drain.New(e.store, e.emit, e.client, drain.Options{Interrupt: w.Interrupt, ActiveRuns: e.runs.ActiveRunIDs})
	b.StartTimer()
	cpu0 := processCPU(b)
	began := time.Now()
	if err := watcher.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	if err := monitor.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	if err := w.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	e.waitEnded(b, sideIDs)
	side := time.Since(began)
	b.StopTimer()
	sideCPU := processCPU(b) - cpu0
	wfs := e.completed(b, sideIDs)
	_ = w.Close(context.Background())
	_ = watcher.Close(context.Background())
	_ = monitor.Close(context.Background())

	if !only {
		b.ReportMetric(float64(steps)/raw.Seconds(), "raw-steps/s")
		b.ReportMetric(raw.Seconds()/side.Seconds(), "sidecar/raw")
		b.ReportMetric(float64(rawCPU.Microseconds())/1000/float64(steps), "raw-cpu-ms/step")
		b.ReportMetric(rawPolls/float64(steps), "raw-polls/step")
		b.ReportMetric(float64(steps)/sdk.Seconds(), "sdk-steps/s")
		b.ReportMetric(sdk.Seconds()/side.Seconds(), "sidecar/sdk")
		b.ReportMetric(float64(sdkCPU.Microseconds())/1000/float64(steps), "sdk-cpu-ms/step")
	}
	b.ReportMetric(float64(steps)/side.Seconds(), "sidecar-steps/s")
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
		case "sidecar_worker_polls_total":
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			b.ReportMetric(sum/float64(steps), "sidecar-polls/step")
		}
	}
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "start-p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "start-p99-ms")
	}
}

// sdkRunner runs n chains with the SDK's TaskRunner: poll up to the free
// workers, run nothing, update. It returns the time and this process's CPU.
func (e *benchEnv) sdkRunner(b *testing.B, n int, taskType string) (time.Duration, time.Duration) {
	sdkIDs := e.startRuns(b, n, benchSteps)
	runner := worker.NewTaskRunnerWithApiClient(client.NewAPIClient(nil, settings.NewHttpSettings(conductortest.URL(b))))
	_ = runner.SetPollTimeout(0) // the sidecar's default: no server-side wait
	b.StartTimer()
	cpu0 := processCPU(b)
	began := time.Now()
	if err := runner.StartWorkerWithDomain(taskType, func(*model.Task) (any, error) { return map[string]any{}, nil },
		benchConcurrency(), 100*time.Millisecond, e.domain); err != nil {
		b.Fatal(err)
	}
	e.waitEnded(b, sdkIDs)
	sdk := time.Since(began)
	b.StopTimer()
	sdkCPU := processCPU(b) - cpu0
	e.completed(b, sdkIDs)
	runner.Shutdown(taskType)
	runner.WaitWorkers()

	return sdk, sdkCPU
}

// rawLoop runs n chains with the least a client can do: plain net/http,
// one loop that batch-polls (no server-side wait, 100 ms pause when
// empty) for as many tasks as it has free slots (32 at most), decodes only
// taskId and workflowInstanceId, and completes each task in a goroutine of
// its own. It returns the time, this process's CPU and the polls sent.
func (e *benchEnv) rawLoop(b *testing.B, n int, taskType string) (time.Duration, time.Duration, float64) {
	ids := e.startRuns(b, n, benchSteps)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: 100, MaxIdleConnsPerHost: 100}, Timeout: 10 * time.Second}
	base := e.client.BaseURL()
	conc := benchConcurrency()
	slots := make(chan struct{}, conc)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	polls := 0
	b.StartTimer()
	cpu0 := processCPU(b)
	began := time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			slots <- struct{}{}
			free := conc - len(slots) + 1
			url := fmt.Sprintf("%s/tasks/poll/batch/%s?workerid=raw&count=%d&timeout=0&domain=%s", base, taskType, min(free, 32), e.domain)
			polls++
			var tasks []struct {
				TaskID     string `json:"taskId"`
				WorkflowID string `json:"workflowInstanceId"`
			}
			if err := rawCall(ctx, hc, http.MethodGet, url, nil, &tasks); err != nil || len(tasks) == 0 {
				<-slots
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for i := 1; i < len(tasks); i++ {
				slots <- struct{}{}
			}
			for _, t := range tasks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-slots }()
					body, _ := json.Marshal(map[string]any{"taskId": t.TaskID, "workflowInstanceId": t.WorkflowID, "workerId": "raw", "status": "COMPLETED"})
					_ = rawCall(context.Background(), hc, http.MethodPost, base+"/tasks", body, nil)
				}()
			}
		}
	}()
	e.waitEnded(b, ids)
	took := time.Since(began)
	b.StopTimer()
	cpu := processCPU(b) - cpu0
	cancel()
	wg.Wait()
	e.completed(b, ids)
	return took, cpu, float64(polls)
}

// rawCall sends one request and decodes a 2xx JSON answer into out (nil:
// the body is drained).
func rawCall(ctx context.Context, hc *http.Client, method, url string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		_, _ = io.Copy(io.Discard, resp.Body)
		return fmt.Errorf("%s %s: %s", method, url, resp.Status)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// independentPollers runs n chains with 8 goroutines that each poll one
// task (no server-side wait, 100ms pause on an empty poll) and complete it.
func (e *benchEnv) independentPollers(b *testing.B, n int, dc adapter.DomainPoller, taskType string) time.Duration {
	ids := e.startRuns(b, n, benchSteps)
	b.StartTimer()
	began := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for g := 0; g < benchConcurrency(); g++ {
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
	e.waitEnded(b, ids)
	took := time.Since(began)
	b.StopTimer()
	cancel()
	wg.Wait()
	e.completed(b, ids)
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
		WorkerID: "sidecar-bench-idle", Concurrency: map[string]int{taskType: benchConcurrency()},
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
