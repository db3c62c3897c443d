package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// TestE2E_Chaos runs the production topology (Conductor on PostgreSQL, a
// 3-node NATS cluster, three sidecar replicas sharing it) through a
// workload of 68 runs of nine kinds (two of them external steps, worked by
// the Python SDK's worker through each replica's task proxy) while it kills
// -9 a NATS node, kills -9 a sidecar replica twice at random points (each
// restarted with its worker id), kills -9 an SDK worker (restarted) and
// restarts Conductor. Then an invariant checker reads every run's
// log and Conductor's view of it. It prints a summary table.
//
// SIDECAR_TEST_CHAOS=1 runs it (.ci/run: one wave). SIDECAR_CHAOS_SOAK=30m
// repeats waves, each with its own faults, for that long (docs/operations.md,
// "Chaos test"). SIDECAR_CHAOS_SEED replays a wave's random choices.
func TestE2E_Chaos(t *testing.T) {
	if os.Getenv("SIDECAR_TEST_CHAOS") != "1" {
		t.Skip("SIDECAR_TEST_CHAOS=1 runs the chaos test (Conductor on PostgreSQL, a NATS cluster, three sidecars)")
	}
	soak := time.Duration(0)
	if s := os.Getenv("SIDECAR_CHAOS_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SIDECAR_CHAOS_SOAK=%q: %v", s, err)
		}
		soak = d
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SIDECAR_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SIDECAR_CHAOS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (SIDECAR_CHAOS_SEED replays it)", seed)

	worker := sdkWorkerFor(t, "python")
	cond := startPostgresConductor(t)
	cl := startNATSCluster(t)
	ch := &chaos{t: t, cond: cond, cluster: cl, natsURL: cl.url(t), domain: uniq("chaos"), marks: t.TempDir(),
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), worker: worker, taskType: uniq("chaos_ext")}
	for range 3 {
		r := &replica{dataDir: t.TempDir(), addr: sidecartest.FreeAddr(t), proxyAddr: sidecartest.FreeAddr(t),
			pprofAddr: sidecartest.FreeAddr(t)}
		ch.replicas = append(ch.replicas, r)
		ch.start(r)
		ch.startWorker(r)
	}
	began := time.Now()
	var total summary
	for wave := 1; ; wave++ {
		s := ch.wave(wave)
		total.add(s)
		if t.Failed() || soak == 0 || time.Since(began) > soak {
			break
		}
	}
	total.print(t, time.Since(began))
	ch.checkNoAlert(&total)
	if t.Failed() {
		ch.dumpGoroutines()
	}
	if total.violations > 0 {
		t.Fatalf("%d invariant violations (above)", total.violations)
	}
}

// chaos is the topology under test.
type chaos struct {
	t        *testing.T
	cond     *postgresConductor
	cluster  *natsCluster
	natsURL  string
	domain   string
	marks    string // marker files of the steps that fail once
	rng      *rand.Rand
	worker   sdkWorker // the Python SDK worker of the external steps
	taskType string    // the external steps' task type
	mu       sync.Mutex
	replicas []*replica
}

// replica is one sidecar, with its task proxy and the SDK worker polling
// through that proxy; p is nil while the sidecar is down.
type replica struct {
	dataDir, addr, proxyAddr string
	pprofAddr                string // --pprof-listen: a failed wave shows each live replica's goroutines
	p                        *proc
	w                        *workerProc
	kills                    int
}

func (ch *chaos) start(r *replica) {
	p := startServe(ch.t, r.dataDir, r.addr, "--conductor-url", ch.cond.url(), "--nats-url", ch.natsURL,
		"--nats-replicas", "3", "--task-domain", ch.domain, "--drain-timeout", "60s",
		"--conductor-proxy-listen", r.proxyAddr, "--pprof-listen", r.pprofAddr)
	ch.mu.Lock()
	r.p = p
	ch.mu.Unlock()
}

// startWorker starts the SDK worker of r's proxy: it polls and reports
// through that replica only, so it sees the replica's kills as a worker
// beside a real pod would.
func (ch *chaos) startWorker(r *replica) {
	r.w = ch.worker.start(ch.t, "http://"+r.proxyAddr+"/api", ch.taskType, ch.domain, 4)
}

func (ch *chaos) kill(r *replica) {
	ch.mu.Lock()
	p := r.p
	r.p = nil
	r.kills++
	ch.mu.Unlock()
	p.stop(syscall.SIGKILL)
}

// dumpGoroutines logs the goroutines of every live replica, grouped by
// stack (pprof's debug=1), so that a run left unended by a wedged replica
// shows where that replica waits.
func (ch *chaos) dumpGoroutines() {
	ch.mu.Lock()
	var live []*replica
	for _, r := range ch.replicas {
		if r.p != nil {
			live = append(live, r)
		}
	}
	ch.mu.Unlock()
	for _, r := range live {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.pprofAddr+"/debug/pprof/goroutine?debug=1", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			ch.t.Logf("goroutines of sidecar %s: %v", r.addr, err)
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		cancel()
		ch.t.Logf("goroutines of sidecar %s (pid %d):\n%s", r.addr, r.p.cmd.Process.Pid, b)
	}
}

// client returns the API client of a live replica, in turn.
func (ch *chaos) client(i int) *httpapi.Client {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for k := range len(ch.replicas) {
		if r := ch.replicas[(i+k)%len(ch.replicas)]; r.p != nil {
			return r.p.client
		}
	}
	return nil
}

// transient reports whether a control call may succeed if repeated: a
// replica down or restarting, NATS electing a leader, Conductor away, or a
// start whose lease another attempt holds (RUN_START_IN_PROGRESS: its answer
// was lost with a killed replica; docs/conductor.md says retry later).
func transient(err error) bool {
	var apiErr *httpapi.Error
	if errors.As(err, &apiErr) {
		return apiErr.Status >= 500 || apiErr.Status == http.StatusTooManyRequests || apiErr.Code == adapter.CodeRunStartInProgress
	}
	return err != nil
}

// do calls f on live replicas, in turn, until it succeeds or fails for
// good, for up to five minutes (a safety net: Conductor restarting on a
// machine loaded 8-36 on 2 cores took longer than three); it counts the
// answers it retried.
func (ch *chaos) do(s *summary, f func(context.Context, *httpapi.Client) error) error {
	deadline := time.Now().Add(5 * time.Minute)
	for i := 0; ; i++ {
		c := ch.client(i)
		var err error
		if c == nil {
			err = errors.New("no replica is up")
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err = f(ctx, c)
			cancel()
		}
		if !transient(err) {
			return err
		}
		s.count(&s.retried)
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// run reads a run's view from a live replica.
func (ch *chaos) run(s *summary, runID string) (*httpapi.RunView, error) {
	var v *httpapi.RunView
	err := ch.do(s, func(ctx context.Context, c *httpapi.Client) error {
		var err error
		v, err = c.Run(ctx, runID)
		return err
	})
	return v, err
}

// until polls the run until ok says so, for up to within.
func (ch *chaos) until(s *summary, runID, what string, within time.Duration, ok func(*httpapi.RunView) bool) (*httpapi.RunView, error) {
	deadline := time.Now().Add(within)
	for {
		v, err := ch.run(s, runID)
		if err != nil {
			return nil, err
		}
		if ok(v) {
			return v, nil
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("run %s: no %s after %s (status %s/%s)", runID, what, within, v.Status, v.Substatus)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// kind is a shape of run, with what the test does to it and the state it
// must end in.
type kind struct {
	name    string
	runs    int
	ownPlan bool
	plan    func(ch *chaos, i int) string // plan JSON; %s is the planId
	drive   func(ch *chaos, s *summary, runID string) error
	want    string
}

const flaky = `{"type":"command","argv":["sh","-c","test -e \"$MARK\" || { touch \"$MARK\"; exit 1; }"],"env":{"MARK":%q}}`

func running(step string) func(*httpapi.RunView) bool {
	return func(v *httpapi.RunView) bool {
		for _, st := range v.Steps {
			if st.StepID == step && st.Status == statestore.StepStatusRunning {
				return true
			}
		}
		return statestore.IsTerminalRunStatus(v.Status)
	}
}

func drainEnded(v *httpapi.RunView) bool {
	return v.Pause != nil && (v.Pause.DrainEndedAt != "" || v.Pause.DrainTimedOut)
}

// waitEnd waits for the run's terminal state: up to 6 minutes, as an SDK
// worker that could not poll while Conductor restarted backs off for up
// to 2 minutes before it polls again (conductor-python: 4 s doubling to
// 120 s), on top of the 4 the sidecar's own steps may need.
func (ch *chaos) waitEnd(s *summary, runID string) error {
	_, err := ch.until(s, runID, "terminal state", 6*time.Minute, func(v *httpapi.RunView) bool {
		return statestore.IsTerminalRunStatus(v.Status)
	})
	return err
}

// pauseThenResume pauses a run whose step is in flight with a drain timeout,
// waits for the drain's end, and resumes it.
func (ch *chaos) pauseThenResume(s *summary, runID, step string, timeout int64) error {
	if paused, err := ch.pauseWhile(s, runID, step, httpapi.PauseOptions{TimeoutSeconds: timeout, Reason: "chaos"}); err != nil || !paused {
		return err
	}
	if _, err := ch.until(s, runID, "end of drain", 3*time.Minute, drainEnded); err != nil {
		return err
	}
	return ch.resume(s, runID)
}

// pauseWhile pauses a run once step is running; paused is false when the
// run ended first: faults delayed the pause past the step, and a pause of
// an ended run is refused, rightly.
func (ch *chaos) pauseWhile(s *summary, runID, step string, o httpapi.PauseOptions) (paused bool, err error) {
	// Up to 4 minutes: an external step waits for an SDK worker that may
	// be backing off after Conductor's restart (see waitEnd).
	if v, err := ch.until(s, runID, "step "+step+" running", 4*time.Minute, running(step)); err != nil || statestore.IsTerminalRunStatus(v.Status) {
		return false, err
	}
	if err := ch.do(s, func(ctx context.Context, c *httpapi.Client) error {
		_, err := c.PauseWith(ctx, runID, o)
		return err
	}); err != nil {
		var apiErr *httpapi.Error
		if v, verr := ch.run(s, runID); errors.As(err, &apiErr) && apiErr.Code == statestore.CodeInvalidTransition &&
			verr == nil && statestore.IsTerminalRunStatus(v.Status) {
			s.count(&s.pausesLate)
			return false, nil
		}
		return false, fmt.Errorf("pause %s: %w", runID, err)
	}
	s.count(&s.pauses)
	return true, nil
}

// resume resumes a run; a resume repeated after a lost answer is refused
// (the run is no longer paused), which is its success.
func (ch *chaos) resume(s *summary, runID string) error {
	err := ch.do(s, func(ctx context.Context, c *httpapi.Client) error {
		_, err := c.Resume(ctx, runID)
		return err
	})
	var apiErr *httpapi.Error
	if errors.As(err, &apiErr) && apiErr.Code == statestore.CodeInvalidTransition {
		if v, verr := ch.run(s, runID); verr == nil && v.Status != statestore.RunStatusPaused {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("resume %s: %w", runID, err)
	}
	s.count(&s.resumes)
	return ch.waitEnd(s, runID)
}

var kinds = []kind{
	{name: "fan-out", runs: 14, want: statestore.RunStatusCompleted,
		plan: func(*chaos, int) string {
			return `{"planId":"%s","planVersion":"1","steps":[
				{"stepId":"a","executor":{"type":"noop"}},
				{"stepId":"b1","executor":{"type":"sleep","seconds":0.5},"dependsOn":["a"]},
				{"stepId":"b2","executor":{"type":"sleep","seconds":1},"dependsOn":["a"]},
				{"stepId":"b3","executor":{"type":"sleep","seconds":1.5},"dependsOn":["a"]},
				{"stepId":"b4","executor":{"type":"noop"},"dependsOn":["a"]},
				{"stepId":"c","executor":{"type":"noop"},"dependsOn":["b1","b2","b3","b4"]}]}`
		},
		drive: func(ch *chaos, s *summary, runID string) error { return ch.waitEnd(s, runID) }},
	{name: "retry", runs: 8, ownPlan: true, want: statestore.RunStatusCompleted,
		plan: func(ch *chaos, i int) string {
			return `{"planId":"%s","planVersion":"1","steps":[
				{"stepId":"flaky","executor":` + fmt.Sprintf(flaky, filepath.Join(ch.marks, fmt.Sprintf("retry-%d", i))) + `,"retries":{"engineTries":3}},
				{"stepId":"after","executor":{"type":"noop"},"dependsOn":["flaky"]}]}`
		},
		drive: func(ch *chaos, s *summary, runID string) error { return ch.waitEnd(s, runID) }},
	{name: "pause-on-failure", runs: 8, ownPlan: true, want: statestore.RunStatusCompleted,
		plan: func(ch *chaos, i int) string {
			return `{"planId":"%s","planVersion":"1","onStepFailure":"pause","steps":[
				{"stepId":"flaky","executor":` + fmt.Sprintf(flaky, filepath.Join(ch.marks, fmt.Sprintf("hold-%d", i))) + `},
				{"stepId":"after","executor":{"type":"noop"},"dependsOn":["flaky"]}]}`
		},
		drive: func(ch *chaos, s *summary, runID string) error {
			held := func(v *httpapi.RunView) bool {
				for _, st := range v.Steps {
					if st.StepID == "flaky" && st.Held {
						return true
					}
				}
				return statestore.IsTerminalRunStatus(v.Status)
			}
			if v, err := ch.until(s, runID, "held failure", 2*time.Minute, held); err != nil || statestore.IsTerminalRunStatus(v.Status) {
				return err
			}
			if _, err := ch.until(s, runID, "end of drain", 2*time.Minute, drainEnded); err != nil {
				return err
			}
			err := ch.do(s, func(ctx context.Context, c *httpapi.Client) error {
				_, err := c.RetryStep(ctx, runID, "flaky", "chaos")
				return err
			})
			if err != nil {
				// A retry repeated after a lost answer: already requested.
				v, verr := ch.run(s, runID)
				if verr != nil || !slicesAny(v.Steps, func(st statestore.StepSnapshot) bool { return st.StepID == "flaky" && st.RetryRequested }) {
					return fmt.Errorf("retry %s: %w", runID, err)
				}
			}
			s.count(&s.retries)
			return ch.resume(s, runID)
		}},
	{name: "pause, drained", runs: 8, want: statestore.RunStatusCompleted,
		plan: func(*chaos, int) string {
			return `{"planId":"%s","planVersion":"1","steps":[
				{"stepId":"slow","executor":{"type":"sleep","seconds":3}},
				{"stepId":"after","executor":{"type":"noop"},"dependsOn":["slow"]}]}`
		},
		drive: func(ch *chaos, s *summary, runID string) error { return ch.pauseThenResume(s, runID, "slow", 60) }},
	{name: "pause, drain timeout", runs: 6, want: statestore.RunStatusCompleted,
		plan: func(*chaos, int) string {
			return `{"planId":"%s","planVersion":"1","steps":[
				{"stepId":"slow","executor":{"type":"sleep","seconds":6}},
				{"stepId":"after","executor":{"type":"noop"},"dependsOn":["slow"]}]}`
		},
		drive: func(ch *chaos, s *summary, runID string) error { return ch.pauseThenResume(s, runID, "slow", 1) }},
	{name: "pause, scheduled resume", runs: 6, want: statestore.RunStatusCompleted,
		plan: func(*chaos, int) string {
			return `{"planId":"%s","planVersion":"1","steps":[
				{"stepId":"slow","executor":{"type":"sleep","seconds":3}},
				{"stepId":"after","executor":{"type":"noop"},"dependsOn":["slow"]}]}`
		},
		drive: func(ch *chaos, s *summary, runID string) error {
			if paused, err := ch.pauseWhile(s, runID, "slow", httpapi.PauseOptions{Reason: "chaos", ResumeAfter: 2 * time.Second}); err != nil || !paused {
				return err
			}
			// Nobody resumes it: the schedule does, on whichever replica owns it.
			return ch.waitEnd(s, runID)
		}},
	{name: "cancel", runs: 6, want: statestore.RunStatusCancelled,
		plan: func(*chaos, int) string {
			return `{"planId":"%s","planVersion":"1","steps":[
				{"stepId":"slow","executor":{"type":"sleep","seconds":60}},
				{"stepId":"after","executor":{"type":"noop"},"dependsOn":["slow"]}]}`
		},
		drive: func(ch *chaos, s *summary, runID string) error {
			if _, err := ch.until(s, runID, "step slow running", 2*time.Minute, running("slow")); err != nil {
				return err
			}
			err := ch.do(s, func(ctx context.Context, c *httpapi.Client) error {
				_, err := c.Cancel(ctx, runID, "chaos")
				return err
			})
			var apiErr *httpapi.Error
			if err != nil && !(errors.As(err, &apiErr) && apiErr.Code == statestore.CodeInvalidTransition) {
				return fmt.Errorf("cancel %s: %w", runID, err)
			}
			s.count(&s.cancels)
			return ch.waitEnd(s, runID)
		}},
}

// externalTimeout is the external steps' timeoutSeconds: the response
// timeout after which Conductor retries the task of a killed worker.
const externalTimeout = 10

// externalStep is an external step worked by the Python SDK worker through
// a replica's task proxy, sleeping ms there.
func externalStep(ch *chaos, id string, ms int, dependsOn string) string {
	dep := ""
	if dependsOn != "" {
		dep = `,"dependsOn":["` + dependsOn + `"]`
	}
	return fmt.Sprintf(`{"stepId":%q,"executor":{"type":"external","taskType":%q,"input":{"sleepMs":"%d"}},"timeoutSeconds":%d,"retries":{"engineTries":4}%s}`,
		id, ch.taskType, ms, externalTimeout, dep)
}

// externalKinds are the runs of a wave whose steps outside workers run:
// the Python SDK worker, one beside each replica, through its task proxy.
var externalKinds = []kind{
	{name: "external fan-out", runs: 6, want: statestore.RunStatusCompleted,
		plan: func(ch *chaos, _ int) string {
			return `{"planId":"%s","planVersion":"1","steps":[
				{"stepId":"a","executor":{"type":"noop"}},` +
				externalStep(ch, "e1", 300, "a") + "," + externalStep(ch, "e2", 800, "a") + "," + externalStep(ch, "e3", 1500, "a") + `,
				{"stepId":"c","executor":{"type":"noop"},"dependsOn":["e1","e2","e3"]}]}`
		},
		drive: func(ch *chaos, s *summary, runID string) error { return ch.waitEnd(s, runID) }},
	{name: "external pause, drained", runs: 6, want: statestore.RunStatusCompleted,
		plan: func(ch *chaos, _ int) string {
			return `{"planId":"%s","planVersion":"1","steps":[` + externalStep(ch, "slow", 3000, "") + `,
				{"stepId":"after","executor":{"type":"noop"},"dependsOn":["slow"]}]}`
		},
		drive: func(ch *chaos, s *summary, runID string) error { return ch.pauseThenResume(s, runID, "slow", 60) }},
}

func slicesAny[T any](s []T, f func(T) bool) bool {
	for _, v := range s {
		if f(v) {
			return true
		}
	}
	return false
}

// chaosRun is one run of a wave.
type chaosRun struct {
	kind  *kind
	runID string
	wfID  string
	err   error
}

// wave submits the workload over about 20 s through the replicas in turn,
// drives every run in its own goroutine, injects the faults meanwhile
// (here, in the test's goroutine), then checks every run.
func (ch *chaos) wave(n int) *summary {
	s := &summary{waves: 1}
	var runs []*chaosRun
	for _, ks := range [][]kind{kinds, externalKinds} {
		for ki := range ks {
			k := &ks[ki]
			for range k.runs {
				runs = append(runs, &chaosRun{kind: k})
			}
		}
	}
	ch.rng.Shuffle(len(runs), func(i, j int) { runs[i], runs[j] = runs[j], runs[i] })
	var wg sync.WaitGroup
	submitted := make(chan struct{})
	go func() {
		defer close(submitted)
		perKind := map[*kind]int{}
		for i, r := range runs {
			k := r.kind
			idx := perKind[k]
			perKind[k]++
			// A step that fails once has a marker file, so a plan, of its own.
			planID := fmt.Sprintf("%s-w%d-%s", ch.domain, n, strings.NewReplacer(" ", "", ",", "-").Replace(k.name))
			if k.ownPlan {
				planID += fmt.Sprintf("-%d", idx)
			}
			pl, err := plan.Parse([]byte(fmt.Sprintf(k.plan(ch, n*1000+idx), planID)))
			if err != nil {
				r.err = err
				continue
			}
			req := httpapi.StartRequest{TenantID: "t-chaos", ProjectID: "p-chaos", EnvironmentID: "test",
				RunRequestID: fmt.Sprintf("%s-w%d-%d", ch.domain, n, i), Plan: pl}
			r.err = ch.do(s, func(ctx context.Context, c *httpapi.Client) error {
				started, err := c.Start(ctx, req)
				if err == nil {
					r.runID, r.wfID = started.RunID, started.WorkflowID
				}
				return err
			})
			if r.err == nil {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r.err = k.drive(ch, s, r.runID)
				}()
			}
			time.Sleep(400 * time.Millisecond)
		}
	}()
	ch.faults(s)
	<-submitted
	wg.Wait()
	for _, r := range runs {
		ch.check(s, r)
	}
	return s
}

// faults kills -9 a sidecar, a NATS node, another sidecar and an SDK
// worker, each brought back, then restarts Conductor: at random points of
// the wave's first ~40 s, one at a time (a replica restarts only while Conductor answers:
// its readiness needs it).
func (ch *chaos) faults(s *summary) {
	t := ch.t
	pause := func(lo, hi int) { time.Sleep(time.Duration(lo*1000+ch.rng.IntN((hi-lo)*1000+1)) * time.Millisecond) }
	killReplica := func() {
		r := ch.replicas[ch.rng.IntN(len(ch.replicas))]
		t.Logf("fault: kill -9 sidecar %s", r.addr)
		ch.kill(r)
		s.count(&s.faultsSidecar)
		pause(1, 4)
		ch.start(r)
	}
	pause(2, 6)
	killReplica()
	pause(2, 6)
	node := 1 + ch.rng.IntN(3)
	t.Logf("fault: kill -9 NATS node %d", node)
	ch.cluster.run(t, "kill", strconv.Itoa(node))
	s.count(&s.faultsNATS)
	pause(3, 8)
	ch.cluster.run(t, "start")
	pause(1, 5)
	killReplica()
	pause(1, 4)
	r := ch.replicas[ch.rng.IntN(len(ch.replicas))]
	t.Logf("fault: kill -9 the SDK worker of sidecar %s", r.addr)
	r.w.kill()
	s.count(&s.faultsWorker)
	pause(1, 4)
	ch.startWorker(r)
	pause(1, 5)
	t.Logf("fault: restart Conductor")
	ch.cond.run(t, "stop")
	ch.cond.run(t, "start")
	s.count(&s.faultsConductor)
}

// check reads a run's log and Conductor's view of it and counts what
// breaks an invariant.
func (ch *chaos) check(s *summary, r *chaosRun) {
	t := ch.t
	s.count(&s.runs)
	violate := func(format string, args ...any) {
		s.count(&s.violations)
		t.Errorf("run %s (%s): "+format, append([]any{r.runID, r.kind.name}, args...)...)
	}
	if r.err != nil {
		violate("driver: %v", r.err)
		if r.runID == "" {
			return
		}
	}
	v, err := ch.run(s, r.runID)
	if err != nil {
		violate("read: %v", err)
		return
	}
	if v.Status != r.kind.want {
		violate("status %s, want %s", v.Status, r.kind.want)
	}
	if v.Inconsistent || len(v.InvalidEvents) > 0 {
		violate("the projector flagged the log: inconsistent %v, invalid events %v", v.Inconsistent, v.InvalidEvents)
	}
	var evs []statestore.RunEventRecord
	if err := ch.do(s, func(ctx context.Context, c *httpapi.Client) error {
		page, err := c.Events(ctx, r.runID, 0, 1000)
		if err == nil {
			evs = page.Events
		}
		return err
	}); err != nil {
		violate("events: %v", err)
		return
	}
	s.events += len(evs)
	keys := map[string]bool{}
	drainEnds := map[int64]int{}
	pauses := map[int64]bool{}
	closedBySidecar := map[int64]bool{}
	resumedDraining := map[int64]bool{} // a RunResumed before any drain event of its cycle
	for i, e := range evs {
		if i > 0 && e.RunSeq <= evs[i-1].RunSeq {
			violate("runSeq %d after %d", e.RunSeq, evs[i-1].RunSeq)
		}
		if keys[e.IdempotencyKey] {
			violate("idempotencyKey %s twice", e.IdempotencyKey)
		}
		keys[e.IdempotencyKey] = true
		switch e.EventType {
		case statestore.RunPaused:
			pauses[e.LogicalAttemptID] = true
		case statestore.RunDrainCompleted, statestore.RunDrainTimedOut:
			drainEnds[e.LogicalAttemptID]++
		case statestore.RunResumed:
			var p struct {
				RequestedBy string `json:"requestedBy"`
			}
			_ = json.Unmarshal(e.Payload, &p)
			if p.RequestedBy == "sidecar" {
				closedBySidecar[e.LogicalAttemptID] = true
			}
			if drainEnds[e.LogicalAttemptID] == 0 {
				resumedDraining[e.LogicalAttemptID] = true
			}
		}
	}
	if r.kind.name == "pause, scheduled resume" {
		for _, e := range evs {
			if e.EventType != statestore.RunResumed {
				continue
			}
			var p struct {
				RequestedBy string `json:"requestedBy"`
			}
			_ = json.Unmarshal(e.Payload, &p)
			if p.RequestedBy != drain.RequestedBySchedule && p.RequestedBy != "sidecar" {
				violate("RunResumed by %q in a run only the schedule resumes", p.RequestedBy)
			}
		}
	}
	for cycle := range pauses {
		switch n := drainEnds[cycle]; {
		case n == 1:
		case n == 0 && closedBySidecar[cycle]:
			s.count(&s.pausesRaced) // the pause raced the run's end (docs/drain.md)
		case n == 0 && resumedDraining[cycle]:
			// RESUME while DRAINING ends the drain itself (docs/drain.md: RESUME
			// is allowed draining or not); no drain event is due.
			s.count(&s.resumedDraining)
		default:
			violate("pause cycle %d ended by %d drain events, want exactly one", cycle, n)
		}
	}

	// Conductor's view: the workflow's end matches, and each task it
	// completed has exactly one StepCompleted, at its attempt.
	wf, err := ch.workflow(r.wfID)
	if err != nil {
		violate("Conductor: %v", err)
		return
	}
	want := map[string]string{statestore.RunStatusCompleted: "COMPLETED", statestore.RunStatusCancelled: "TERMINATED"}[r.kind.want]
	if wf.Status != want {
		var tasks []string
		for _, task := range wf.Tasks {
			tasks = append(tasks, fmt.Sprintf("%s#%d %s (worker %s) %q", task.ReferenceTaskName, task.RetryCount, task.Status, task.WorkerID, task.ReasonForIncompletion))
		}
		var types []string
		for _, e := range evs {
			types = append(types, fmt.Sprintf("%s/%s/%d.%d", e.EventType, e.StepID, e.LogicalAttemptID, e.EngineAttemptID))
		}
		violate("Conductor's workflow is %s (%q), want %s; tasks: %s; log: %s", wf.Status, wf.ReasonForIncompletion, want, strings.Join(tasks, ", "), strings.Join(types, " "))
	}
	for _, task := range wf.Tasks {
		step, ok := plan.StepIDFromRef(task.ReferenceTaskName)
		if !ok || task.Status != "COMPLETED" {
			continue
		}
		var done []statestore.RunEventRecord
		lastLogical, operatorRetry := int64(0), false
		for _, e := range evs {
			if e.StepID != step {
				continue
			}
			switch e.EventType {
			case statestore.StepCompleted:
				done = append(done, e)
			case statestore.StepStarted:
				lastLogical = max(lastLogical, e.LogicalAttemptID)
			case statestore.RunStepRetryRequested:
				operatorRetry = true
			}
		}
		if len(done) != 1 {
			violate("step %s: Conductor completed its task (retryCount %d), the log has %d StepCompleted", step, task.RetryCount, len(done))
			continue
		}
		if done[0].LogicalAttemptID != lastLogical {
			violate("step %s: StepCompleted at logical attempt %d, the last started is %d", step, done[0].LogicalAttemptID, lastLogical)
		}
		if !operatorRetry && done[0].EngineAttemptID != int64(task.RetryCount)+1 {
			if e := done[0].EngineAttemptID; e < int64(task.RetryCount)+1 && ch.timedOut(wf, task.ReferenceTaskName, e-1) {
				// An outside worker's outcome, recorded before its update
				// was forwarded, of a try Conductor timed out before the
				// update reached it (Conductor away, or the update lost with
				// a killed replica): the later try was answered from the
				// log without running (docs/workers.md).
				s.count(&s.keptFromTimedOut)
				continue
			}
			violate("step %s: StepCompleted at engine attempt %d, Conductor completed retryCount %d", step, done[0].EngineAttemptID, task.RetryCount)
		}
	}
}

// timedOut reports whether Conductor timed out the try of ref with
// retryCount.
func (ch *chaos) timedOut(wf *conductorWorkflow, ref string, retryCount int64) bool {
	for _, task := range wf.Tasks {
		if task.ReferenceTaskName == ref && int64(task.RetryCount) == retryCount {
			return task.Status == "TIMED_OUT"
		}
	}
	return false
}

func (ch *chaos) workflow(id string) (*conductorWorkflow, error) {
	var lastErr error
	for range 30 {
		resp, err := http.Get(ch.cond.url() + "/workflow/" + id + "?includeTasks=true")
		if err == nil {
			var wf conductorWorkflow
			err = json.NewDecoder(resp.Body).Decode(&wf)
			resp.Body.Close()
			if err == nil && resp.StatusCode == http.StatusOK {
				return &wf, nil
			}
			if err == nil {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		lastErr = err
		time.Sleep(time.Second)
	}
	return nil, lastErr
}

// checkNoAlert asserts that no INVALID_TRANSITION alert was raised: the
// alert gate keeps a key per alert in SIDECAR_ALERTS.
func (ch *chaos) checkNoAlert(s *summary) {
	t := ch.t
	nc, err := nats.Connect(ch.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, natsstore.DefaultAlertBucket)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		s.count(&s.violations)
		t.Errorf("INVALID_TRANSITION alert raised: %s", k)
	}
}

// summary counts a wave's (or the whole test's) runs, faults and findings.
type summary struct {
	mu                                         sync.Mutex
	waves, runs, events                        int
	pauses, resumes, retries, cancels, retried int
	pausesRaced, pausesLate, resumedDraining   int
	keptFromTimedOut                           int
	faultsSidecar, faultsNATS, faultsConductor int
	faultsWorker                               int
	violations                                 int
}

func (s *summary) count(p *int) {
	s.mu.Lock()
	*p++
	s.mu.Unlock()
}

func (s *summary) add(o *summary) {
	s.waves += o.waves
	s.runs += o.runs
	s.events += o.events
	s.pauses += o.pauses
	s.resumes += o.resumes
	s.retries += o.retries
	s.cancels += o.cancels
	s.retried += o.retried
	s.pausesRaced += o.pausesRaced
	s.pausesLate += o.pausesLate
	s.resumedDraining += o.resumedDraining
	s.keptFromTimedOut += o.keptFromTimedOut
	s.faultsSidecar += o.faultsSidecar
	s.faultsNATS += o.faultsNATS
	s.faultsConductor += o.faultsConductor
	s.faultsWorker += o.faultsWorker
	s.violations += o.violations
}

func (s *summary) print(t *testing.T, took time.Duration) {
	rows := [][2]string{
		{"waves", strconv.Itoa(s.waves)},
		{"runs", strconv.Itoa(s.runs)},
		{"events", strconv.Itoa(s.events)},
		{"pauses / resumes / step retries / cancels", fmt.Sprintf("%d / %d / %d / %d", s.pauses, s.resumes, s.retries, s.cancels)},
		{"pauses that raced the run's end / came after it", fmt.Sprintf("%d / %d", s.pausesRaced, s.pausesLate)},
		{"pauses resumed while draining (no drain event due)", strconv.Itoa(s.resumedDraining)},
		{"outcomes of a try Conductor timed out, kept", strconv.Itoa(s.keptFromTimedOut)},
		{"faults: sidecar kill -9", strconv.Itoa(s.faultsSidecar)},
		{"faults: NATS node kill -9", strconv.Itoa(s.faultsNATS)},
		{"faults: Conductor restart", strconv.Itoa(s.faultsConductor)},
		{"faults: SDK worker kill -9", strconv.Itoa(s.faultsWorker)},
		{"API calls retried (replica down, 5xx)", strconv.Itoa(s.retried)},
		{"violations", strconv.Itoa(s.violations)},
		{"took", took.Round(time.Second).String()},
	}
	var b strings.Builder
	b.WriteString("chaos summary\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "  %-45s %s\n", r[0], r[1])
	}
	t.Log(b.String())
}
