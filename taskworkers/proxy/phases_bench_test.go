package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"

	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// phases collects the durations of the parts of a gated task's path.
type phases struct {
	mu sync.Mutex
	d  map[string][]time.Duration
}

func (p *phases) add(name string, began time.Time) {
	took := time.Since(began)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.d == nil {
		p.d = map[string][]time.Duration{}
	}
	p.d[name] = append(p.d[name], took)
}

// take returns and forgets what was collected.
func (p *phases) take() map[string][]time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.d
	p.d = nil
	return d
}

type phaseSteps struct {
	proxy.Steps
	ph *phases
}

func (s phaseSteps) Admit(t *model.Task, a *taskworkers.Assignment) bool {
	defer s.ph.add("gate: Admit (whole)", time.Now())
	return s.Steps.Admit(t, a)
}

func (s phaseSteps) Record(t *model.Task, a *taskworkers.Assignment, r *model.TaskResult) (bool, error) {
	defer s.ph.add("update: Record (whole)", time.Now())
	return s.Steps.Record(t, a, r)
}

func (s phaseSteps) Reported(t *model.Task, a *taskworkers.Assignment, r *model.TaskResult) {
	defer s.ph.add("update: Reported", time.Now())
	s.Steps.Reported(t, a, r)
}

type phaseReads struct {
	taskworkers.SnapshotReader
	ph *phases
}

func (r phaseReads) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	defer r.ph.add("read of the run", time.Now())
	return r.SnapshotReader.ProjectSnapshot(ctx, runID)
}

type phaseEvents struct {
	*registry.Emitter
	ph *phases
}

func (e phaseEvents) Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	defer e.ph.add("append "+w.EventType, time.Now())
	return e.Emitter.Emit(ctx, w)
}

func (e phaseEvents) EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	defer e.ph.add("append "+w.EventType+" (fenced)", time.Now())
	return e.Emitter.EmitIf(ctx, w, lastSeq)
}

type phaseTransport struct {
	http.RoundTripper
	ph *phases
}

func (tr phaseTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	name := "Conductor: " + r.Method + " " + r.URL.Path
	switch {
	case strings.Contains(r.URL.Path, "/tasks/poll/batch/"):
		name = "Conductor: batch poll"
	case strings.HasSuffix(r.URL.Path, "/tasks/update-v2"):
		name = "Conductor: update-v2 (the update and the next task's poll)"
	case strings.HasSuffix(r.URL.Path, "/tasks"):
		name = "Conductor: update"
	}
	defer tr.ph.add(name, time.Now())
	return tr.RoundTripper.RoundTrip(r)
}

// TestBench_ProxyPhases measures where a gated task's time goes on the
// proxy's path, with a real Conductor and an embedded JetStream log
// (fsync on every write): the parts of a poll (Conductor's answer, the
// gate: the run's read and StepStarted's fenced append, the rest of Admit
// being the wait for the run's other starts) and of an update (the run's
// read and StepCompleted's append, Conductor's answer), each as seen by
// the worker too. Three passes over a run of BENCH_TASKS (default 200)
// external steps: every task polled (BENCH_WORKERS, default 8, at a time,
// one per poll), every task updated (/tasks), then a second run's tasks
// in the loop conductor-python 2.0.0 runs (poll one, then update-v2 and
// take the next task from its answer). It logs count, p50 and mean of
// each part (BENCHMARKS.md, "Where a gated task's time goes").
// BENCH_SYNC_INTERVAL (a duration) has the log's server fsync at that
// interval instead of on every write, to see what the fsyncs cost the
// appends and Conductor's answers on a shared disk.
//
//	SIDECAR_BENCH_PROXY=1 SIDECAR_TEST_CONDUCTOR_URL=http://127.0.0.1:8196/api \
//	  go test -count=1 -run TestBench_ProxyPhases -v ./taskworkers/proxy
func TestBench_ProxyPhases(t *testing.T) {
	if os.Getenv("SIDECAR_BENCH_PROXY") == "" {
		t.Skip("a benchmark: SIDECAR_BENCH_PROXY=1 runs it")
	}
	n, workers := 200, 8
	if v, err := strconv.Atoi(os.Getenv("BENCH_TASKS")); err == nil {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("BENCH_WORKERS")); err == nil {
		workers = v
	}
	var embedded natsstore.EmbeddedConfig
	if v := os.Getenv("BENCH_SYNC_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("BENCH_SYNC_INTERVAL: %v", err)
		}
		embedded.SyncInterval = d
	}
	ph := &phases{}
	e := newEnvOpts(t, envOpts{
		wrap: func(s proxy.Steps) proxy.Steps { return phaseSteps{Steps: s, ph: ph} },
		reads: func(r taskworkers.SnapshotReader) taskworkers.SnapshotReader {
			return phaseReads{SnapshotReader: r, ph: ph}
		},
		events:    func(em *registry.Emitter) taskworkers.Emitter { return phaseEvents{Emitter: em, ph: ph} },
		transport: phaseTransport{RoundTripper: http.DefaultTransport, ph: ph},
		embedded:  embedded,
	})
	report := func(pass string) {
		load, _ := os.ReadFile("/proc/loadavg")
		d := ph.take()
		names := make([]string, 0, len(d))
		for k := range d {
			names = append(names, k)
		}
		slices.Sort(names)
		t.Logf("%s (load %s):", pass, strings.Join(strings.Fields(string(load))[:3], " "))
		for _, k := range names {
			v := slices.Clone(d[k])
			slices.Sort(v)
			var sum time.Duration
			for _, x := range v {
				sum += x
			}
			t.Logf("  %-62s %5d x  p50 %6.2f ms  mean %6.2f ms", k, len(v), ms(v[len(v)/2]), ms(sum/time.Duration(len(v))))
		}
	}

	// Pass 1 and 2: every task polled, then every task updated.
	_, wfID := e.start(t, n, 600)
	var mu sync.Mutex
	var got []task
	var wg sync.WaitGroup
	deadline := time.Now().Add(5 * time.Minute)
	for range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				mu.Lock()
				done := len(got) >= n
				mu.Unlock()
				if done {
					return
				}
				began := time.Now()
				tasks := e.pollBatch(t, 1)
				if len(tasks) > 0 {
					ph.add("worker: poll answered with a task", began)
				}
				mu.Lock()
				got = append(got, tasks...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(got) != n {
		t.Fatalf("%d of %d tasks handed out within 5 minutes", len(got), n)
	}
	report(fmt.Sprintf("polls: %d tasks, %d workers polling one task at a time", n, workers))
	next := make(chan task, n)
	for _, tk := range got {
		next <- tk
	}
	close(next)
	for range workers {
		wg.Go(func() {
			for tk := range next {
				began := time.Now()
				resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": tk.TaskID, "workflowInstanceId": wfID,
					"status": "COMPLETED", "workerId": "bench"})
				ph.add("worker: update answered", began)
				if resp.StatusCode != http.StatusOK {
					t.Errorf("update: %d %s", resp.StatusCode, body)
				}
			}
		})
	}
	wg.Wait()
	report(fmt.Sprintf("updates: %d tasks, %d workers", n, workers))

	// Pass 3: conductor-python's loop.
	_, wfID = e.start(t, n, 600)
	var updated atomic.Int64
	deadline = time.Now().Add(5 * time.Minute)
	for range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				tasks := e.pollBatch(t, 1)
				if len(tasks) == 0 {
					if updated.Load() >= int64(n) {
						return
					}
					time.Sleep(10 * time.Millisecond)
					continue
				}
				tk := &tasks[0]
				for tk != nil {
					began := time.Now()
					resp, body := call(t, http.MethodPost, e.url+"/tasks/update-v2", map[string]any{"taskId": tk.TaskID, "workflowInstanceId": wfID,
						"status": "COMPLETED", "workerId": "bench"})
					ph.add("worker: update-v2 answered", began)
					updated.Add(1)
					tk = nil
					if resp.StatusCode == http.StatusOK && len(strings.TrimSpace(string(body))) > 0 {
						var nt task
						if err := json.Unmarshal(body, &nt); err == nil && nt.TaskID != "" {
							tk = &nt
						}
					}
				}
			}
		})
	}
	wg.Wait()
	if updated.Load() != int64(n) {
		t.Fatalf("%d of %d tasks updated within 5 minutes", updated.Load(), n)
	}
	report(fmt.Sprintf("update-v2 loop: %d tasks, %d workers", n, workers))
}
