package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_AKillDuringAStartLeavesNoTaskBehind: a serve is killed while
// it starts a run, after Conductor started the workflow and gave its
// first task to the serve's poll, before the serve recorded the workflow
// or reported the task. Conductor shows the task in progress under the
// serve's worker id, and the run's workflow is not in the run index, so
// the restarted serve cannot tell the task is its own until the watcher
// adopts the workflow (once the start's lease expires). Then the task is
// handed back and the run completes, instead of standing still for the
// task's response timeout (an hour and two minutes).
func TestE2E_AKillDuringAStartLeavesNoTaskBehind(t *testing.T) {
	t.Parallel() // its own serve, data dir and Conductor pass-through
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	cut := startStartCutter(t, conductortest.URL(t))
	p := newProc(sidecartest.Start(t, sidecartest.Options{DataDir: dataDir, Addr: addr, ConductorURL: cut.URL}))
	pl := &plan.Plan{PlanID: uniq("e2e-startkill"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "work", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 1}},
	}}
	go func() { _, _ = trySubmit(t, p, pl, "kill-during-start") }() // its answer never comes
	select {
	case <-cut.taskTaken:
	case <-time.After(2 * time.Minute):
		t.Fatal("the serve's poll was not given the run's task within 2 minutes")
	}
	// The poll's answer may pass the start's on the way back; the serve
	// gets neither answer to its start, whatever the order.
	sidecartest.WaitFor(t, "Conductor's answer to the start", 30*time.Second, func() bool { return cut.workflowID() != "" })
	p.stop(syscall.SIGKILL)

	// Straight to Conductor. The request is not repeated: a repeat after
	// the lease would start a second workflow and leave the first to the
	// orphan pass, which is not the path under test.
	p = startServe(t, dataDir, addr)
	runID := cut.runID()
	v := waitTerminal(t, p, runID, 2*time.Minute)
	if v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run ended %s, want COMPLETED", v.Status)
	}
	evs := allEvents(t, p, runID)
	if n := count(evs, statestore.RunStarted, ""); n != 1 {
		t.Fatalf("%d RunStarted: %v", n, types(evs))
	}
	if wf := cut.workflowID(); wf == "" || !strings.HasSuffix(v.EngineRunRef, "/"+wf) {
		t.Fatalf("the run went on as workflow %s, want the one its first start made, %s", v.EngineRunRef, cut.workflowID())
	}
}

// TestE2E_AKillDuringStartsOnAReplicaLeavesNoTaskBehind: the same kill,
// of one of two replicas on a NATS cluster, with four starts under way.
// The killed replica restarts before the starts' leases expire, so it
// cannot list the tasks it took; the workflows are adopted by whichever
// replica owns each run, and a replica's watcher asks only its own
// workers to look. The restarted replica also looks once the starts it
// found under way are decided: every run completes. Either look hands
// back all four tasks when the restarted replica adopts one of the runs
// (seen with each taken out); the second alone covers the runs the other
// replica adopts.
func TestE2E_AKillDuringStartsOnAReplicaLeavesNoTaskBehind(t *testing.T) {
	t.Parallel() // its own serves, data dirs, NATS cluster and pass-through
	cl := startNATSCluster(t)
	nurl := cl.url(t)
	domain := "--task-domain=" + uniq("e2e-startkill-rep")
	cut := startStartCutter(t, conductortest.URL(t))
	dataA, addrA := t.TempDir(), sidecartest.FreeAddr(t)
	argsA := []string{"--nats-url", nurl, "--nats-replicas", "3", domain, "--concurrency", "sleep=4"}
	a := newProc(sidecartest.Start(t, sidecartest.Options{DataDir: dataA, Addr: addrA, ConductorURL: cut.URL, Args: argsA}))
	// b never takes these tasks: the ones a took stay a's.
	b := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--nats-url", nurl, "--nats-replicas", "3", domain, "--concurrency", "sleep=0")
	sidecartest.WaitFor(t, "both replicas to count two live replicas", 30*time.Second, func() bool {
		return metricValue(t, a.addr, "sidecar_members_live") == 2 && metricValue(t, b.addr, "sidecar_members_live") == 2
	})
	pl := &plan.Plan{PlanID: uniq("e2e-startkill-rep"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "work", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 1}},
	}}
	const n = 4
	for i := range n {
		go func() { _, _ = trySubmit(t, a, pl, fmt.Sprintf("kill-during-start-%d", i)) }() // no answer comes
	}
	sidecartest.WaitFor(t, "a's polls to take every run's task", 2*time.Minute, func() bool { return cut.tasksTaken() >= n })
	a.stop(syscall.SIGKILL)
	a = startServe(t, dataA, addrA, argsA...) // straight to Conductor, the same worker id, within the leases
	runs := cut.startedRuns()
	if len(runs) != n {
		t.Fatalf("%d starts reached Conductor, want %d", len(runs), n)
	}
	for _, id := range runs {
		if v := waitTerminal(t, b, id, 2*time.Minute); v.Status != statestore.RunStatusCompleted {
			t.Fatalf("run %s ended %s, want COMPLETED", id, v.Status)
		}
	}
}

// startCutter is a pass-through in front of Conductor that cuts a
// serve off in the middle of a run's start: once a workflow start has
// reached Conductor, its answer and every task update are held until the
// caller goes away, and taskTaken is closed when a poll answer carrying a
// task has been passed on.
type startCutter struct {
	URL       string
	taskTaken chan struct{}

	mu        sync.Mutex
	started   bool
	taken     int      // tasks in the poll answers passed on since a start
	runs      []string // the started runs' ids (their workflow input's runId)
	workflows []string // their workflow ids (Conductor's answers)
}

// runID is the first started run's id.
func (sc *startCutter) runID() string { return sc.startedRuns()[0] }

// workflowID is the first started run's workflow id ("" if none came).
func (sc *startCutter) workflowID() string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if len(sc.workflows) == 0 {
		return ""
	}
	return sc.workflows[0]
}

func (sc *startCutter) startedRuns() []string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return slices.Clone(sc.runs)
}

// tasksTaken is how many tasks poll answers carried since a start.
func (sc *startCutter) tasksTaken() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.taken
}

func startStartCutter(t *testing.T, target string) *startCutter {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	sc := &startCutter{taskTaken: make(chan struct{})}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(&url.URL{Scheme: u.Scheme, Host: u.Host})
			r.Out.Body = conductortest.EndedBody(r.Out.Body)
		},
		ModifyResponse: func(resp *http.Response) error {
			if !strings.Contains(resp.Request.URL.Path, "/tasks/poll/") {
				return nil
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(body))
			if n := bytes.Count(body, []byte(`"taskId"`)); err == nil && resp.StatusCode == http.StatusOK && n > 0 {
				sc.noteTaken(n)
			}
			return err
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/api/workflow"):
			body, _ := io.ReadAll(r.Body)
			var start struct {
				Input struct {
					RunID string `json:"runId"`
				} `json:"input"`
			}
			_ = json.Unmarshal(body, &start)
			r.Body = io.NopCloser(bytes.NewReader(body))
			sc.mu.Lock()
			sc.started = true // before: the task may be polled before the start's answer is back
			sc.runs = append(sc.runs, start.Input.RunID)
			sc.mu.Unlock()
			answer := &discardWriter{header: http.Header{}}
			// Conductor's answer is read whatever becomes of the caller
			// (the test kills it): workflowID names what the start made.
			rp.ServeHTTP(answer, r.WithContext(context.WithoutCancel(r.Context())))
			sc.mu.Lock()
			sc.workflows = append(sc.workflows, strings.TrimSpace(answer.body.String()))
			sc.mu.Unlock()
			<-r.Context().Done()
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/api/tasks") && sc.hasStarted():
			<-r.Context().Done()
		default:
			rp.ServeHTTP(w, r)
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	sc.URL = "http://" + ln.Addr().String() + "/api"
	return sc
}

func (sc *startCutter) hasStarted() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.started
}

// noteTaken counts n tasks polled; taskTaken is closed at the first after
// a start.
func (sc *startCutter) noteTaken(n int) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if !sc.started {
		return
	}
	if sc.taken == 0 {
		close(sc.taskTaken)
	}
	sc.taken += n
}

// discardWriter keeps an answer its caller will not see.
type discardWriter struct {
	header http.Header
	body   bytes.Buffer
}

func (d *discardWriter) Header() http.Header         { return d.header }
func (d *discardWriter) Write(p []byte) (int, error) { return d.body.Write(p) }
func (d *discardWriter) WriteHeader(int)             {}
