package proxy_test

import (
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"

	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// timedRecords times the task workers' Record, the update's gate.
type timedRecords struct {
	proxy.Steps
	mu   sync.Mutex
	took []time.Duration
}

func (r *timedRecords) Record(t *model.Task, a *taskworkers.Assignment, res *model.TaskResult) (bool, error) {
	began := time.Now()
	forward, err := r.Steps.Record(t, a, res)
	r.mu.Lock()
	r.took = append(r.took, time.Since(began))
	r.mu.Unlock()
	return forward, err
}

// TestBench_ProxyUpdateGate measures the update's gate (Record: the run
// read, the outcome checked and appended) of external steps' tasks
// through the proxy: a run of BENCH_TASKS (default 40) external steps,
// all handed out first, then their updates with BENCH_WORKERS (default
// 1) at a time. It logs the gate's p50, p90 and mean
// (BENCHMARKS.md, "An update's one read of the run"). BENCH_PROFILE_DIR,
// when set, writes the block and mutex profiles of the run there.
//
//	SIDECAR_BENCH_PROXY=1 SIDECAR_TEST_CONDUCTOR_URL=http://127.0.0.1:8080/api \
//	  go test -count=1 -run TestBench_ProxyUpdateGate -v ./taskworkers/proxy
func TestBench_ProxyUpdateGate(t *testing.T) {
	if os.Getenv("SIDECAR_BENCH_PROXY") == "" {
		t.Skip("a benchmark: SIDECAR_BENCH_PROXY=1 runs it")
	}
	n, workers := 40, 1
	if v, err := strconv.Atoi(os.Getenv("BENCH_TASKS")); err == nil {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("BENCH_WORKERS")); err == nil {
		workers = v
	}
	if dir := os.Getenv("BENCH_PROFILE_DIR"); dir != "" {
		runtime.SetBlockProfileRate(1)
		runtime.SetMutexProfileFraction(1)
		t.Cleanup(func() {
			for _, name := range []string{"block", "mutex"} {
				f, err := os.Create(filepath.Join(dir, name+".pprof"))
				if err != nil {
					t.Errorf("profile: %v", err)
					continue
				}
				_ = pprof.Lookup(name).WriteTo(f, 0)
				_ = f.Close()
			}
			runtime.SetBlockProfileRate(0)
			runtime.SetMutexProfileFraction(0)
		})
	}
	rec := &timedRecords{}
	e := newEnvWith(t, func(s proxy.Steps) proxy.Steps { rec.Steps = s; return rec })
	_, wfID := e.start(t, n, 600)
	var got []task
	waitFor(t, "every task handed out", 5*time.Minute, func() bool {
		got = append(got, e.pollBatch(t, n-len(got))...)
		return len(got) == n
	})
	next := make(chan task, n)
	for _, tk := range got {
		next <- tk
	}
	close(next)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tk := range next {
				resp, body := call(t, http.MethodPost, e.url+"/tasks", map[string]any{"taskId": tk.TaskID, "workflowInstanceId": wfID,
					"status": "COMPLETED", "workerId": "bench"})
				if resp.StatusCode != http.StatusOK {
					t.Errorf("update: %d %s", resp.StatusCode, body)
				}
			}
		}()
	}
	wg.Wait()
	d := slices.Clone(rec.took)
	slices.Sort(d)
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("update gate over %d updates, %d at a time: p50 %.2f ms, p90 %.2f ms, mean %.2f ms (load %s)", len(d), workers,
		ms(d[len(d)/2]), ms(d[len(d)*9/10]), ms(sum/time.Duration(len(d))), string(load[:14]))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
