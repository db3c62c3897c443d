package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestBench_ProxyPythonWorker measures the task proxy with the official
// Python SDK's worker running noop tasks (BENCHMARKS.md, "Task proxy"):
//
//   - plan: a run of the sidecar, a fan-out of N external steps; the worker
//     polls through the proxy (gated and recorded) or straight from
//     Conductor (the same workflow, nothing recorded);
//   - plain: a workflow started in Conductor, not a run of the sidecar, a
//     FORK_JOIN of N SIMPLE tasks; through the proxy (forwarded untouched)
//     or straight.
//
// Rounds alternate proxy and direct (A B A B) in one process, on one
// Conductor. Per round: tasks/s (N over first scheduled to last ended, from
// Conductor's task times), the p50 of a task's time from its start (polled)
// to its end (update taken) in Conductor, and the CPU time per task of the
// sidecar process (which serves the proxy) and of Conductor's.
//
//	SIDECAR_BENCH_PROXY=1 SIDECAR_TEST_CONDUCTOR_URL=http://127.0.0.1:8196/api \
//	  BENCH_CONDUCTOR_PID=$(cat /tmp/cond-proxybench/conductor.pid) \
//	  go test -count=1 -p 1 -v -run TestBench_ProxyPythonWorker -timeout 30m ./e2e
//
// BENCH_TASKS (default 200) and BENCH_ROUNDS (default 3) size it;
// BENCH_MODES (comma-separated, default all four) picks the modes. Each
// plan/proxy round also prints where a gated task's time went, as the mean
// per task of the sidecar's own latency metrics over the round: the proxy's
// gate of a poll's answer and of an update (sidecar_proxy_gate_seconds),
// the StepStarted and StepCompleted writes within them
// (sidecar_worker_event_write_seconds), and within those the registry's
// eventId and the log's append. BENCH_PPROF_DIR=DIR also writes a CPU
// profile of the sidecar over each plan round's first BENCH_PPROF_SECONDS
// (default 10) there (sidecar-plan-proxy-roundN.pprof,
// sidecar-plan-direct-roundN.pprof); a round ends after its profile, so a
// profile longer than the round holds the idle time after it too.
// BENCH_TIME_CONDUCTOR=1 puts a pass-through in front of Conductor, for
// the worker in the direct modes and for the sidecar (its proxy and its
// own client) in all, that times Conductor's answers to the worker's polls
// and updates (condTimer): the same instrument in both modes, one more hop
// in each.
func TestBench_ProxyPythonWorker(t *testing.T) {
	if os.Getenv("SIDECAR_BENCH_PROXY") == "" {
		t.Skip("a benchmark: SIDECAR_BENCH_PROXY=1 runs it")
	}
	w := sdkWorkerFor(t, "python")
	n := envInt("BENCH_TASKS", 200)
	rounds := envInt("BENCH_ROUNDS", 3)
	condPid := envInt("BENCH_CONDUCTOR_PID", 0)
	var pprofAddr string
	var extra []string
	profDir := os.Getenv("BENCH_PPROF_DIR")
	if profDir != "" {
		pprofAddr = sidecartest.FreeAddr(t)
		extra = []string{"--pprof-listen", pprofAddr}
	}
	addr, proxyAddr, domain := sidecartest.FreeAddr(t), sidecartest.FreeAddr(t), uniq("bench-proxy")
	condURL := strings.TrimSuffix(os.Getenv("SIDECAR_TEST_CONDUCTOR_URL"), "/")
	var timer *condTimer
	serveCond := condURL
	if os.Getenv("BENCH_TIME_CONDUCTOR") != "" {
		timer = startCondTimer(t, condURL)
		serveCond = timer.URL
	}
	p := &proxied{proc: newProc(sidecartest.Start(t, sidecartest.Options{DataDir: t.TempDir(), Addr: addr, ConductorURL: serveCond,
		Args: append([]string{"--conductor-proxy-listen", proxyAddr, "--task-domain", domain}, extra...)})),
		addr: addr, proxyAddr: proxyAddr, domain: domain}
	plain := uniq("bench_plain")

	modes := []string{"plan/proxy", "plan/direct", "plain/proxy", "plain/direct"}
	if m := os.Getenv("BENCH_MODES"); m != "" {
		modes = strings.Split(m, ",")
		for _, mode := range modes {
			if !slices.Contains([]string{"plan/proxy", "plan/direct", "plain/proxy", "plain/direct"}, mode) {
				t.Fatalf("BENCH_MODES: unknown mode %q (plan/proxy, plan/direct, plain/proxy, plain/direct)", mode)
			}
		}
	}
	type sample struct{ tps, p50ms, sideCPUms, condCPUms float64 }
	results := map[string][]sample{}
	for r := 0; r < rounds; r++ {
		for _, mode := range modes {
			taskType := uniq("bench_" + strings.ReplaceAll(mode, "/", "_"))
			server := p.api()
			if strings.HasSuffix(mode, "/direct") {
				server = serveCond
			}
			if timer != nil {
				timer.round(taskType)
			}
			wp := w.start(t, server, taskType, p.domain, 8)
			side0, cond0 := cpuOf(t, p.serve.Cmd.Process.Pid), cpuOf(t, condPid)
			m0 := scrape(t, p.addr)
			profiled := make(chan struct{})
			if profDir != "" && strings.HasPrefix(mode, "plan/") {
				go func() {
					defer close(profiled)
					cpuProfile(t, pprofAddr, filepath.Join(profDir, fmt.Sprintf("sidecar-%s-round%d.pprof", strings.ReplaceAll(mode, "/", "-"), r+1)), envInt("BENCH_PPROF_SECONDS", 10))
				}()
			} else {
				close(profiled)
			}
			var wfID string
			if strings.HasPrefix(mode, "plan/") {
				started := submit(t, p.proc, fanOutPlan(uniq("bench"), taskType, n, 0, 0, 60), "req-1")
				if v := waitTerminal(t, p.proc, started.RunID, 10*time.Minute); v.Status != statestore.RunStatusCompleted {
					t.Fatalf("%s: run %s", mode, v.Status)
				}
				wfID = conductorWorkflowOf(t, p.proc, started.RunID)
			} else {
				wfID = startPlain(t, condURL, plain, taskType, p.domain, n)
				waitWorkflow(t, condURL, wfID, 10*time.Minute)
			}
			side1, cond1 := cpuOf(t, p.serve.Cmd.Process.Pid), cpuOf(t, condPid)
			wp.kill()
			tps, p50 := taskTimes(t, condURL, wfID, taskType)
			s := sample{tps, p50, float64(side1-side0) / float64(n), float64(cond1-cond0) / float64(n)}
			results[mode] = append(results[mode], s)
			t.Logf("round %d %-12s %7.1f tasks/s  p50 start->end %6.2f ms  sidecar CPU %.2f ms/task  Conductor CPU %.2f ms/task",
				r+1, mode, s.tps, s.p50ms, s.sideCPUms, s.condCPUms)
			m1 := scrape(t, p.addr)
			t.Logf("round %d %-12s the sidecar's own Conductor requests per task: %s", r+1, mode, m1.perOp(m0, "sidecar_conductor_requests_total", n))
			if timer != nil {
				t.Logf("round %d %-12s Conductor's answers at the pass-through: %s", r+1, mode, timer.summary(n))
			}
			if mode == "plan/proxy" {
				var parts []string
				for _, q := range gateBreakdown {
					c := m1.count(m0, q.metric, q.labels)
					parts = append(parts, fmt.Sprintf("%s %.2f (%.0f x %.2f)", q.name, m1.sum(m0, q.metric, "_sum", q.labels)*1000/float64(n), c, m1.mean(m0, q.metric, q.labels)*1000))
				}
				t.Logf("round %d plan/proxy, ms per task (observations x mean ms): %s", r+1, strings.Join(parts, ", "))
				parts = parts[:0]
				for _, stage := range []string{"poll", "update"} {
					labels := `stage="` + stage + `"`
					c := m1.count(m0, "sidecar_proxy_gate_seconds", labels)
					parts = append(parts, fmt.Sprintf("%s gate <= 1 ms %.0f%%, <= 2 ms %.0f%%, <= 5 ms %.0f%%", stage,
						100*m1.sum(m0, "sidecar_proxy_gate_seconds", "_bucket", labels+`,le="0.001"`)/c,
						100*m1.sum(m0, "sidecar_proxy_gate_seconds", "_bucket", labels+`,le="0.002"`)/c,
						100*m1.sum(m0, "sidecar_proxy_gate_seconds", "_bucket", labels+`,le="0.005"`)/c))
				}
				t.Logf("round %d plan/proxy, share of the gate's observations: %s", r+1, strings.Join(parts, "; "))
			}
			<-profiled // after the round's counts; the next round's profile cannot start before it ends
		}
	}
	med := func(mode string, f func(sample) float64) float64 {
		var v []float64
		for _, s := range results[mode] {
			v = append(v, f(s))
		}
		slices.Sort(v)
		return (v[(len(v)-1)/2] + v[len(v)/2]) / 2
	}
	tps := func(s sample) float64 { return s.tps }
	p50 := func(s sample) float64 { return s.p50ms }
	t.Logf("median of %d rounds, %d tasks each:", rounds, n)
	for _, mode := range modes {
		t.Logf("  %-12s %7.1f tasks/s  p50 %6.2f ms  sidecar CPU %.2f ms/task  Conductor CPU %.2f ms/task", mode,
			med(mode, tps), med(mode, p50), med(mode, func(s sample) float64 { return s.sideCPUms }), med(mode, func(s sample) float64 { return s.condCPUms }))
	}
	ratio := func(what, a, b string) {
		if len(results[a]) > 0 && len(results[b]) > 0 {
			t.Logf("%s: proxy/direct throughput %.2fx, added p50 %.2f ms", what, med(a, tps)/med(b, tps), med(a, p50)-med(b, p50))
		}
	}
	ratio("plan", "plan/proxy", "plan/direct")
	ratio("plain", "plain/proxy", "plain/direct")
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// cpuOf is the user+system CPU time of pid in milliseconds (0 for pid 0).
func cpuOf(t *testing.T, pid int) int64 {
	t.Helper()
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return (ut + st) * 10 // USER_HZ 100
}

func conductorJSON(t *testing.T, method, url string, body, out any) {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		t.Fatalf("%s %s: %s %s", method, url, res.Status, b.String())
	}
	if out != nil {
		if err := json.NewDecoder(res.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
	}
}

// startPlain registers a workflow (not a run of the sidecar's) of n SIMPLE
// tasks of taskType in a FORK_JOIN and starts it with taskType in domain;
// it returns the workflow id.
func startPlain(t *testing.T, condURL, name, taskType, domain string, n int) string {
	t.Helper()
	var branches [][]map[string]any
	var joinOn []string
	for i := 0; i < n; i++ {
		ref := fmt.Sprintf("x%d", i)
		joinOn = append(joinOn, ref)
		branches = append(branches, []map[string]any{{"name": taskType, "taskReferenceName": ref, "type": "SIMPLE",
			"inputParameters": map[string]any{"sleepMs": "0"},
			"taskDefinition":  map[string]any{"name": taskType, "retryCount": 0, "timeoutSeconds": 0, "responseTimeoutSeconds": 60}}})
	}
	def := map[string]any{"name": name + "_" + taskType, "version": 1, "schemaVersion": 2, "ownerEmail": "bench@example.com",
		"tasks": []map[string]any{
			{"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN", "forkTasks": branches},
			{"name": "join", "taskReferenceName": "join", "type": "JOIN", "joinOn": joinOn},
		}}
	conductorJSON(t, http.MethodPost, condURL+"/metadata/workflow", def, nil)
	req, _ := http.NewRequest(http.MethodPost, condURL+"/workflow", bytes.NewReader(mustJSON(map[string]any{
		"name": def["name"], "version": 1, "input": map[string]any{}, "taskToDomain": map[string]string{taskType: domain}})))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("start %s: %s %s", def["name"], res.Status, b.String())
	}
	return strings.TrimSpace(b.String())
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

type condTask struct {
	TaskType      string `json:"taskType"`
	Status        string `json:"status"`
	ScheduledTime int64  `json:"scheduledTime"`
	StartTime     int64  `json:"startTime"`
	EndTime       int64  `json:"endTime"`
}

type condWorkflow struct {
	Status string     `json:"status"`
	Tasks  []condTask `json:"tasks"`
}

func waitWorkflow(t *testing.T, condURL, id string, within time.Duration) {
	t.Helper()
	sidecartest.WaitFor(t, "workflow "+id+" to complete", within, func() bool {
		var wf condWorkflow
		conductorJSON(t, http.MethodGet, condURL+"/workflow/"+id+"?includeTasks=false", nil, &wf)
		if wf.Status != "RUNNING" && wf.Status != "COMPLETED" {
			t.Fatalf("workflow %s %s", id, wf.Status)
		}
		return wf.Status == "COMPLETED"
	})
}

// conductorWorkflowOf is the Conductor workflow id of a run.
func conductorWorkflowOf(t *testing.T, p *proc, runID string) string {
	t.Helper()
	v, err := p.client.Run(t.Context(), runID)
	if err != nil {
		t.Fatal(err)
	}
	id := statestore.ConductorWorkflowID(v.EngineRunRef)
	if id == "" {
		t.Fatalf("run %s has no workflow id", runID)
	}
	return id
}

// taskTimes: the workflow's tasks of taskType per second (first scheduled
// to last ended) and the p50 of start->end in milliseconds.
func taskTimes(t *testing.T, condURL, id, taskType string) (float64, float64) {
	t.Helper()
	var wf condWorkflow
	conductorJSON(t, http.MethodGet, condURL+"/workflow/"+id+"?includeTasks=true", nil, &wf)
	var first, last int64
	var d []float64
	for _, k := range wf.Tasks {
		if k.TaskType != taskType || k.Status != "COMPLETED" {
			continue
		}
		if first == 0 || k.ScheduledTime < first {
			first = k.ScheduledTime
		}
		last = max(last, k.EndTime)
		d = append(d, float64(k.EndTime-k.StartTime))
	}
	if len(d) == 0 {
		t.Fatalf("workflow %s has no completed task of type %s", id, taskType)
	}
	slices.Sort(d)
	return float64(len(d)) / (float64(last-first) / 1000), d[len(d)/2]
}

// gateBreakdown names the sidecar's latency histograms a gated task's time
// is read from.
var gateBreakdown = []struct{ name, metric, labels string }{
	{"poll gate", "sidecar_proxy_gate_seconds", `stage="poll"`},
	{"update gate", "sidecar_proxy_gate_seconds", `stage="update"`},
	{"StepStarted write", "sidecar_worker_event_write_seconds", `event_type="StepStarted"`},
	{"StepCompleted write", "sidecar_worker_event_write_seconds", `event_type="StepCompleted"`},
	{"registry eventId", "sidecar_registry_operation_duration_seconds", `op="get_or_create"`},
	{"log append", "sidecar_store_append_duration_seconds", ``},
}

// metricsText is a scrape of the sidecar's /metrics: sample line -> value.
type metricsText map[string]float64

func scrape(t *testing.T, addr string) metricsText {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	m := metricsText{}
	for _, line := range strings.Split(b.String(), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

// sum is the sum over the series of name+suffix whose labels contain
// labels, since the scrape before.
func (m metricsText) sum(before metricsText, name, suffix, labels string) float64 {
	var v float64
	for k, x := range m {
		if strings.HasPrefix(k, name+suffix) && (len(k) == len(name+suffix) || k[len(name+suffix)] == '{') && strings.Contains(k, labels) {
			v += x - before[k]
		}
	}
	return v
}

func (m metricsText) count(before metricsText, name, labels string) float64 {
	return m.sum(before, name, "_count", labels)
}

// mean is the mean observation in seconds since the scrape before.
func (m metricsText) mean(before metricsText, name, labels string) float64 {
	c := m.count(before, name, labels)
	if c == 0 {
		return 0
	}
	return m.sum(before, name, "_sum", labels) / c
}

// perOp lists the increase of counter name by its op label since the
// scrape before, divided by n, largest first.
func (m metricsText) perOp(before metricsText, name string, n int) string {
	by := map[string]float64{}
	for k, x := range m {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		_, rest, ok := strings.Cut(k, `op="`)
		if !ok {
			continue
		}
		op, _, _ := strings.Cut(rest, `"`)
		by[op] += x - before[k]
	}
	ops := make([]string, 0, len(by))
	for op, v := range by {
		if v > 0 {
			ops = append(ops, op)
		}
	}
	slices.SortFunc(ops, func(a, b string) int { return int(by[b] - by[a]) })
	parts := make([]string, 0, len(ops))
	for _, op := range ops {
		parts = append(parts, fmt.Sprintf("%s %.2f", op, by[op]/float64(n)))
	}
	return strings.Join(parts, ", ")
}

// cpuProfile writes a CPU profile of seconds from the pprof listener at
// addr to path (logged, not fatal, when it fails).
func cpuProfile(t *testing.T, addr, path string, seconds int) {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, seconds))
	if err != nil {
		t.Logf("cpu profile: %v", err)
		return
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Logf("cpu profile: %v", err)
	}
}
