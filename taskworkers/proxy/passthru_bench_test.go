package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// BenchmarkProxy_PassThrough measures what the proxy costs a task that
// passes through it untouched: a SIMPLE task of a workflow that is no run
// of the log (a FORK_JOIN of passThroughFork tasks, started in Conductor
// with the timer stopped), taken by one worker in the loop
// conductor-python 2.0.0 runs: a batch poll of one task when it holds
// none, then update-v2 (COMPLETED), whose answer is its next task. One
// op is one task. "proxy" runs the loop through the proxy, "direct"
// straight to Conductor, in the same process. The proxy's Steps are the
// task workers (taskworkers.Worker, not opened: a task that passes through
// never reaches its gate), without an adopter, with the proxy's metrics
// registered, so that the process runs nothing in the background that
// would bill the slower mode for its longer wall time.
//
// Besides ns/op (the worker's wall time per task, mostly Conductor's),
// it reports cpu-ns/op: the CPU time (user + system, getrusage) of the
// whole test process per task. The worker loop's own CPU is in both, so
// proxy minus direct is the proxy's CPU per task; B/op and allocs/op, of
// the whole process too, subtract the same way.
//
//	SIDECAR_TEST_CONDUCTOR_URL=http://127.0.0.1:8080/api go test -run '^$' \
//	  -bench BenchmarkProxy_PassThrough -benchtime 400x -count 5 ./taskworkers/proxy
func BenchmarkProxy_PassThrough(b *testing.B) {
	base, proxyURL, client, _ := newPassProxy(b)
	tt := "pass_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	name := "passthru_" + tt
	if err := registerForkJoin(base, name, tt, passThroughFork); err != nil {
		b.Fatal(err)
	}
	// The workflows are terminated at the end, done or not: Conductor
	// may take minutes to evaluate the JOINs of hundreds of them, and
	// a queue of JOINs slows every other workflow's on a shared server.
	var started []string
	b.Cleanup(func() {
		for _, id := range started {
			_ = client.Terminate(context.Background(), id, "benchmark ended")
		}
	})
	for _, mode := range []struct{ name, url string }{{"proxy", proxyURL}, {"direct", base}} {
		b.Run(mode.name, func(b *testing.B) {
			b.StopTimer()
			for range (b.N + passThroughFork - 1) / passThroughFork {
				id, err := client.StartWorkflow(context.Background(), model.StartWorkflowRequest{Name: name, Version: 1,
					Input: map[string]any{"source": "benchmark"}})
				if err != nil {
					b.Fatal(err)
				}
				started = append(started, id)
			}
			w := &passWorker{base: mode.url, tt: tt, client: &http.Client{}}
			b.ReportAllocs()
			cpu := cpuTime()
			b.StartTimer()
			if err := w.run(b.N, 5*time.Minute); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(w.polls)/float64(b.N), "polls/op")
			w.client.CloseIdleConnections()
			// The queue is left empty for the next run: its workflows'
			// remaining tasks, if any, taken and completed.
			_ = w.run(passThroughFork, 0)
		})
	}
}

// BenchmarkProxy_EmptyPoll measures what the proxy costs a poll that
// finds no task, which an SDK worker sends several times a second per
// thread while its queue is empty: a batch poll of a task type nothing
// is queued for (timeout 0: Conductor answers at once; an SDK waits
// up to 100 ms, wall time, not CPU), through the proxy and direct, as in
// BenchmarkProxy_PassThrough (proxy minus direct is the proxy's own).
//
//	SIDECAR_TEST_CONDUCTOR_URL=http://127.0.0.1:8080/api go test -run '^$' \
//	  -bench BenchmarkProxy_EmptyPoll -benchtime 300x -count 5 ./taskworkers/proxy
func BenchmarkProxy_EmptyPoll(b *testing.B) {
	base, proxyURL, _, _ := newPassProxy(b)
	tt := "empty_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	q := url.Values{"workerid": {"bench"}, "count": {"8"}, "timeout": {"0"}}.Encode()
	for _, mode := range []struct{ name, url string }{{"proxy", proxyURL}, {"direct", base}} {
		b.Run(mode.name, func(b *testing.B) {
			w := &passWorker{base: mode.url, tt: tt, client: &http.Client{}}
			b.ReportAllocs()
			cpu := cpuTime()
			for range b.N {
				var tasks []passTask
				if err := w.do(http.MethodGet, mode.url+"/tasks/poll/batch/"+tt+"?"+q, nil, &tasks); err != nil {
					b.Fatal(err)
				}
				if len(tasks) != 0 {
					b.Fatalf("a task of %s was queued", tt)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
			w.client.CloseIdleConnections()
		})
	}
}

// newPassProxy serves a proxy in front of the test's Conductor whose
// Steps are the task workers (not opened), without an adopter, and
// returns Conductor's base URL, the proxy's, a client of Conductor and
// the proxy.
func newPassProxy(tb testing.TB) (base, proxyURL string, client *adapter.Client, p *proxy.Proxy) {
	tb.Helper()
	base = conductortest.URL(tb)
	client, err := adapter.NewClient(adapter.ClientOptions{BaseURL: base})
	if err != nil {
		tb.Fatal(err)
	}
	p, err = proxy.New(taskworkers.New(nil, nil, nil, nil, nil, taskworkers.Options{}),
		proxy.Options{Conductor: base, Metrics: proxy.NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p.Open(ln)
	tb.Cleanup(func() { _ = p.Close(context.Background()) })
	return base, "http://" + ln.Addr().String() + "/api", client, p
}

// TestProxy_ForgetsAPassedTaskAtItsFinalUpdate: the proxy holds a task it
// passed through (so that its update costs no read from Conductor) while
// the worker has it, through an IN_PROGRESS update, and lets it go once
// Conductor took its final update.
func TestProxy_ForgetsAPassedTaskAtItsFinalUpdate(t *testing.T) {
	_, proxyURL, client, p := newPassProxy(t)
	ctx := context.Background()
	tt := "forget_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	def := fmt.Sprintf(`{"name":%q,"version":1,"ownerEmail":"x@y","schemaVersion":2,"tasks":[{"name":%q,"taskReferenceName":"a","type":"SIMPLE",
		"taskDefinition":{"name":%q,"ownerEmail":"x@y","responseTimeoutSeconds":60,"retryCount":0}}]}`, tt, tt, tt)
	if err := client.RegisterWorkflowDefJSON(ctx, []byte(def)); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StartWorkflow(ctx, model.StartWorkflowRequest{Name: tt, Version: 1}); err != nil {
		t.Fatal(err)
	}
	w := &passWorker{base: proxyURL, tt: tt, client: &http.Client{}}
	var tasks []passTask
	q := url.Values{"workerid": {"w"}, "count": {"1"}, "timeout": {"100"}}.Encode()
	deadline := time.Now().Add(2 * time.Minute)
	for len(tasks) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no task polled within 2 minutes")
		}
		if err := w.do(http.MethodGet, proxyURL+"/tasks/poll/batch/"+tt+"?"+q, nil, &tasks); err != nil {
			t.Fatal(err)
		}
	}
	tk := tasks[0]
	if !proxy.Remembers(p, tk.TaskID) {
		t.Fatal("the proxy does not hold the task it passed through")
	}
	for _, status := range []string{"IN_PROGRESS", "COMPLETED"} {
		var next passTask
		if err := w.do(http.MethodPost, proxyURL+"/tasks/update-v2", map[string]any{"taskId": tk.TaskID,
			"workflowInstanceId": tk.WorkflowInstanceID, "status": status, "workerId": "w"}, &next); err != nil {
			t.Fatal(err)
		}
		if held := proxy.Remembers(p, tk.TaskID); held != (status == "IN_PROGRESS") {
			t.Fatalf("after its %s update, the proxy holds the task: %v", status, held)
		}
	}
}

// TestProxy_PassThroughDoesNotDecodeTheTask: a task of a workflow that is
// not adopted passes through the proxy without being decoded, nor is
// the worker's update of it: the process's allocations for a poll of it
// through the proxy do not grow with the number of keys in its input,
// nor those for its update with the keys of its output (2,000 here; a
// decode allocates for each). The worker reads the task's id only, and
// its update's body is encoded beforehand.
func TestProxy_PassThroughDoesNotDecodeTheTask(t *testing.T) {
	_, proxyURL, client, _ := newPassProxy(t)
	ctx := context.Background()
	big := map[string]any{}
	for i := range 2000 {
		big[fmt.Sprintf("k%d", i)] = i
	}
	mallocs := map[string]uint64{}
	quietest := func(what string, m uint64) {
		if v, ok := mallocs[what]; !ok || m < v {
			mallocs[what] = m
		}
	}
	for _, size := range []string{"small", "big"} {
		tt := size + "_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
		def := fmt.Sprintf(`{"name":%q,"version":1,"ownerEmail":"x@y","schemaVersion":2,"tasks":[{"name":%q,"taskReferenceName":"a","type":"SIMPLE",
			"inputParameters":{"data":"${workflow.input.data}"},
			"taskDefinition":{"name":%q,"ownerEmail":"x@y","responseTimeoutSeconds":60,"retryCount":0}}]}`, tt, tt, tt)
		if err := client.RegisterWorkflowDefJSON(ctx, []byte(def)); err != nil {
			t.Fatal(err)
		}
		input := map[string]any{"data": map[string]any{"k": 1}}
		if size == "big" {
			input["data"] = big
		}
		const rounds = 3
		for range rounds {
			if _, err := client.StartWorkflow(ctx, model.StartWorkflowRequest{Name: tt, Version: 1, Input: input}); err != nil {
				t.Fatal(err)
			}
		}
		hc := &http.Client{}
		u := proxyURL + "/tasks/poll/batch/" + tt + "?" + url.Values{"workerid": {"w"}, "count": {"1"}, "timeout": {"100"}}.Encode()
		deadline := time.Now().Add(2 * time.Minute)
		for got := 0; got < rounds; {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			resp, err := hc.Get(u)
			if err != nil {
				t.Fatal(err)
			}
			var tasks []struct {
				TaskID     string `json:"taskId"`
				WorkflowID string `json:"workflowInstanceId"`
			}
			err = json.NewDecoder(resp.Body).Decode(&tasks)
			resp.Body.Close()
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatalf("poll: %d %v", resp.StatusCode, err)
			}
			if len(tasks) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d %s tasks polled in 2 minutes", got, rounds, size)
				}
				continue
			}
			got++
			quietest("poll "+size, after.Mallocs-before.Mallocs)
			body, err := json.Marshal(map[string]any{"taskId": tasks[0].TaskID, "workflowInstanceId": tasks[0].WorkflowID, "status": "COMPLETED", "outputData": input["data"]})
			if err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&before)
			resp, err = hc.Post(proxyURL+"/tasks", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			runtime.ReadMemStats(&after)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("update: %d %s", resp.StatusCode, answer)
			}
			quietest("update "+size, after.Mallocs-before.Mallocs)
		}
	}
	for _, what := range []string{"poll", "update"} {
		if grew := int64(mallocs[what+" big"]) - int64(mallocs[what+" small"]); grew > 500 {
			t.Errorf("the %s of a task with 2,000 keys took %d allocations, one with 1 key %d: the proxy decoded it",
				what, mallocs[what+" big"], mallocs[what+" small"])
		}
	}
}

// passThroughFork is the number of tasks a benchmark workflow forks.
const passThroughFork = 50

// registerForkJoin registers task type tt and workflow name, a FORK_JOIN
// of n SIMPLE tasks of tt, each with a small input.
func registerForkJoin(base, name, tt string, n int) error {
	taskDefs := []map[string]any{{"name": tt, "ownerEmail": "bench@example.com", "retryCount": 0, "responseTimeoutSeconds": 120, "timeoutSeconds": 0}}
	if err := post(base+"/metadata/taskdefs", taskDefs); err != nil {
		return err
	}
	var branches [][]map[string]any
	var refs []string
	for i := range n {
		ref := fmt.Sprintf("t%d", i)
		refs = append(refs, ref)
		branches = append(branches, []map[string]any{{"name": tt, "taskReferenceName": ref, "type": "SIMPLE",
			"inputParameters": map[string]any{"n": i, "source": "${workflow.input.source}", "item": map[string]any{"id": ref, "size": 3}}}})
	}
	def := map[string]any{"name": name, "version": 1, "ownerEmail": "bench@example.com", "schemaVersion": 2, "tasks": []map[string]any{
		{"name": "fork", "taskReferenceName": "fork", "type": "FORK_JOIN", "forkTasks": branches},
		{"name": "join", "taskReferenceName": "join", "type": "JOIN", "joinOn": refs},
	}}
	return post(base+"/metadata/workflow", def)
}

func post(u string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	resp, err := http.Post(u, "application/json", bytes.NewReader(b))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %d %s", u, resp.StatusCode, out)
	}
	return nil
}

// passWorker is one worker thread of conductor-python 2.0.0: batch poll
// of one task when it holds none, update-v2, the answer its next task.
type passWorker struct {
	base, tt string
	client   *http.Client
	polls    int // batch polls sent
}

// run takes and completes n tasks, or what is queued when within is 0
// (an empty poll ends it); it fails past within.
func (w *passWorker) run(n int, within time.Duration) error {
	deadline := time.Now().Add(within)
	q := url.Values{"workerid": {"bench"}, "count": {"1"}, "timeout": {"100"}}.Encode()
	var next *passTask
	for done := 0; done < n; {
		if next == nil {
			var tasks []passTask
			w.polls++
			if err := w.do(http.MethodGet, w.base+"/tasks/poll/batch/"+w.tt+"?"+q, nil, &tasks); err != nil {
				return err
			}
			if len(tasks) == 0 {
				if within == 0 {
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("%d of %d tasks done within %s", done, n, within)
				}
				continue
			}
			next = &tasks[0]
		}
		res := map[string]any{"taskId": next.TaskID, "workflowInstanceId": next.WorkflowInstanceID, "status": "COMPLETED",
			"workerId": "bench", "outputData": map[string]any{"ok": true, "n": next.InputData["n"]}}
		var answer passTask
		if err := w.do(http.MethodPost, w.base+"/tasks/update-v2", res, &answer); err != nil {
			return err
		}
		done++
		next = nil
		if answer.TaskID != "" {
			next = &answer
		}
	}
	return nil
}

// passTask is what the worker reads of a task.
type passTask struct {
	TaskID             string         `json:"taskId"`
	WorkflowInstanceID string         `json:"workflowInstanceId"`
	InputData          map[string]any `json:"inputData"`
}

func (w *passWorker) do(method, u string, body, into any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u, r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, u, resp.StatusCode, out)
	}
	if len(bytes.TrimSpace(out)) == 0 {
		return nil
	}
	return json.Unmarshal(out, into)
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
