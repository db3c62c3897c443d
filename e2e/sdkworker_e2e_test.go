package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/proctest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Workers written with Conductor's official SDKs (conductor-python, the
// JavaScript SDK, the Java client), installed by deploy/local/sdkworkers.sh
// into SIDECAR_TEST_SDKWORKERS (default ~/.cache/conductor-sidecar) and run
// as processes whose only sidecar setting is their server URL: the task
// proxy. The workers live in testdata/sdkworkers.

// sdkWorker is one SDK's worker, ready to start.
type sdkWorker struct {
	lang string
	argv []string
	env  []string // besides SERVER_URL/CONDUCTOR_SERVER_URL, TASK_TYPE, DOMAIN, THREADS
}

// sdkWorkerFor returns lang's worker, or skips the test when it is not
// installed (and fails it under CI=true, where .ci/run installs them all).
func sdkWorkerFor(t *testing.T, lang string) sdkWorker {
	t.Helper()
	cache := os.Getenv("SIDECAR_TEST_SDKWORKERS")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "conductor-sidecar")
	}
	src, err := filepath.Abs(filepath.Join("testdata", "sdkworkers"))
	if err != nil {
		t.Fatal(err)
	}
	var w sdkWorker
	var need, tool string
	switch lang {
	case "python":
		need, tool = filepath.Join(cache, "sdk-python", "bin", "python"), "python3"
		w = sdkWorker{lang: lang, argv: []string{need, filepath.Join(src, "python", "worker.py")}}
	case "js":
		need, tool = filepath.Join(cache, "sdk-js", "node_modules", "@io-orkes", "conductor-javascript"), "node"
		w = sdkWorker{lang: lang, argv: []string{"node", filepath.Join(src, "js", "worker.js")},
			env: []string{"NODE_PATH=" + filepath.Join(cache, "sdk-js", "node_modules")}}
	case "java":
		dir := filepath.Join(cache, "sdk-java")
		need, tool = filepath.Join(dir, "worker.jar"), "java"
		w = sdkWorker{lang: lang, argv: []string{"java", "-cp", filepath.Join(dir, "worker.jar") + string(os.PathListSeparator) + filepath.Join(dir, "lib", "*"), "sidecar.e2e.Worker"}}
	default:
		t.Fatalf("no SDK worker %q", lang)
	}
	_, errNeed := os.Stat(need)
	_, errTool := exec.LookPath(tool)
	if errNeed != nil || errTool != nil {
		msg := fmt.Sprintf("the %s SDK worker is not installed (%s, %s on PATH): run deploy/local/sdkworkers.sh (SIDECAR_TEST_SDKWORKERS names its directory)", lang, need, tool)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return w
}

// workerProc is a running SDK worker, in a process group of its own (the
// Python SDK runs each worker in a child process).
type workerProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// start runs the worker against serverURL (the proxy's .../api) for
// taskType in domain with threads concurrent tasks. It is killed (its
// whole process group) when the test ends, or when the test process dies
// (proctest.StartTiedGroup); a failed test shows its log.
func (w sdkWorker) start(t *testing.T, serverURL, taskType, domain string, threads int) *workerProc {
	t.Helper()
	cmd := exec.Command(w.argv[0], w.argv[1:]...)
	cmd.Env = append(os.Environ(), w.env...)
	cmd.Env = append(cmd.Env, "SERVER_URL="+serverURL, "CONDUCTOR_SERVER_URL="+serverURL,
		"TASK_TYPE="+taskType, "DOMAIN="+domain, "THREADS="+strconv.Itoa(threads))
	logf, err := os.Create(filepath.Join(t.TempDir(), w.lang+"-worker.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own that is SIGKILLed with the test process.
	if err := proctest.StartTiedGroup(cmd); err != nil {
		t.Fatalf("start the %s worker: %v", w.lang, err)
	}
	p := &workerProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("%s worker log:\n%s", w.lang, sidecartest.Tail(string(b), sidecartest.LogLines()))
		}
	})
	return p
}

// kill sends SIGKILL to the worker's process group and waits for the
// worker's own process to end.
func (p *workerProc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// proxied is a serve with the task proxy on and the task domain its
// external workers poll in.
type proxied struct {
	*proc
	dataDir, addr, proxyAddr, domain string
}

// api is the URL an SDK worker is given as its server: the proxy's /api.
func (p *proxied) api() string { return "http://" + p.proxyAddr + "/api" }

func startProxied(t *testing.T, dataDir, addr, proxyAddr, domain string) *proxied {
	t.Helper()
	p := startServe(t, dataDir, addr, "--conductor-proxy-listen", proxyAddr, "--task-domain", domain)
	return &proxied{proc: p, dataDir: dataDir, addr: addr, proxyAddr: proxyAddr, domain: domain}
}

func newProxied(t *testing.T, name string) *proxied {
	t.Helper()
	return startProxied(t, t.TempDir(), sidecartest.FreeAddr(t), sidecartest.FreeAddr(t), uniq(name))
}

// fanOutPlan: a noop, then n external steps of taskType in parallel, step
// i sleeping sleepMs + i*staggerMs in the worker, then a noop joining them.
func fanOutPlan(id, taskType string, n, sleepMs, staggerMs int, timeoutSeconds int64) *plan.Plan {
	pl := &plan.Plan{PlanID: id, PlanVersion: "1", Steps: []plan.Step{{StepID: "begin", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}}}
	var ids []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("x%d", i)
		ids = append(ids, id)
		pl.Steps = append(pl.Steps, plan.Step{StepID: id, DependsOn: []string{"begin"}, TimeoutSeconds: timeoutSeconds,
			Executor: plan.ExecutorSpec{Type: plan.ExecutorExternal, TaskType: taskType, Input: map[string]string{"sleepMs": strconv.Itoa(sleepMs + i*staggerMs)}}})
	}
	pl.Steps = append(pl.Steps, plan.Step{StepID: "end", DependsOn: ids, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}})
	return pl
}

// externalSteps lists the external step ids with a StepStarted in evs.
func startedExternal(evs []statestore.RunEventRecord) []string {
	var out []string
	for _, e := range evs {
		if e.EventType == statestore.StepStarted && strings.HasPrefix(e.StepID, "x") {
			out = append(out, e.StepID)
		}
	}
	return out
}

// inFlight is the run's in-flight step ids as its drain block shows them
// (nil when the run is not paused).
func inFlight(t *testing.T, p *proc, runID string) []string {
	t.Helper()
	v, err := p.client.Run(t.Context(), runID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Drain == nil {
		return nil
	}
	return v.Drain.InFlightStepIDs
}

// sdkPauseDrainResume: a fan-out of 6 external steps (3 s, 4.5 s, 6 s, ...)
// on a worker of lang running 3 at a time, paused once 3 have started: the
// drain's in-flight count falls as the worker finishes them, one by one,
// and reaches 0 (RunDrainCompleted),
// no external step starts while the run is paused (the worker keeps
// polling through the proxy all along), and resume completes the run with
// every external step completed once and a valid log.
func sdkPauseDrainResume(t *testing.T, lang string) {
	t.Parallel() // its own serve, data dir and worker
	w := sdkWorkerFor(t, lang)
	p := newProxied(t, "e2e-sdk-"+lang)
	taskType := uniq("sdk_" + lang)
	w.start(t, p.api(), taskType, p.domain, 3)
	const n = 6
	started := submit(t, p.proc, fanOutPlan(uniq("e2e-sdk-"+lang), taskType, n, 3000, 1500, 120), "req-1")
	sidecartest.WaitFor(t, "3 external steps to start", 90*time.Second, func() bool {
		return len(startedExternal(allEvents(t, p.proc, started.RunID))) >= 3
	})
	if _, err := p.client.Pause(t.Context(), started.RunID, 60, "sdk worker test"); err != nil {
		t.Fatal(err)
	}
	// The in-flight count, sampled until the drain ends, never rises and
	// ends at 0.
	var counts []int
	sidecartest.WaitFor(t, "the drain to end", 60*time.Second, func() bool {
		if c := len(inFlight(t, p.proc, started.RunID)); len(counts) == 0 || counts[len(counts)-1] != c {
			counts = append(counts, c)
		}
		_, how := drainEnd(t, allEvents(t, p.proc, started.RunID))
		return how != ""
	})
	evs := allEvents(t, p.proc, started.RunID)
	took, how := drainEnd(t, evs)
	t.Logf("%s: drain ended with %s %s after RunPaused; in-flight counts seen %v", lang, how, took, counts)
	if how != statestore.RunDrainCompleted {
		t.Fatalf("drain ended with %s, want RunDrainCompleted\n%v", how, types(evs))
	}
	for i := 1; i < len(counts); i++ {
		if counts[i] > counts[i-1] {
			t.Fatalf("the in-flight count rose while draining: %v", counts)
		}
	}
	if counts[0] == 0 || len(counts) < 3 {
		t.Fatalf("in-flight counts %v: want the count of the pause falling step by step to 0 (the steps end 1.5 s apart)", counts)
	}
	// Paused: the worker polls on, nothing starts.
	time.Sleep(4 * time.Second)
	evs = allEvents(t, p.proc, started.RunID)
	paused := eventIndex(evs, statestore.RunPaused, "", 0)
	for _, e := range evs[paused:] {
		if e.EventType == statestore.StepStarted {
			t.Fatalf("step %s started while the run was paused\n%v", e.StepID, types(evs))
		}
	}
	before := len(startedExternal(evs))
	if before >= n {
		t.Fatalf("all %d external steps had started before the pause took effect; the test proves nothing\n%v", n, types(evs))
	}
	if _, err := p.client.Resume(t.Context(), started.RunID); err != nil {
		t.Fatal(err)
	}
	if v := waitTerminal(t, p.proc, started.RunID, 90*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s after resume, want COMPLETED", v.Status)
	}
	evs = allEvents(t, p.proc, started.RunID)
	validLog(t, evs)
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("x%d", i)
		if c := count(evs, statestore.StepCompleted, id); c != 1 {
			t.Fatalf("step %s completed %d times, want 1\n%v", id, c, types(evs))
		}
	}
	t.Logf("%s: %d external steps started before the pause, %d after the resume", lang, before, n-before)
}

func TestE2E_SDKWorkerPython_PauseDrainResume(t *testing.T) { sdkPauseDrainResume(t, "python") }
func TestE2E_SDKWorkerJS_PauseDrainResume(t *testing.T)     { sdkPauseDrainResume(t, "js") }
func TestE2E_SDKWorkerJava_PauseDrainResume(t *testing.T)   { sdkPauseDrainResume(t, "java") }

// sdkKillWorkerWhileDraining: the worker of lang is killed (-9, its whole
// process group) with its tasks in flight while the run drains; the tasks'
// response timeout (the steps' timeoutSeconds) ends them in Conductor,
// RunStepTryEnded (taskTimedOut) takes them out of flight, and the drain
// completes long before its own timeout.
func sdkKillWorkerWhileDraining(t *testing.T, lang string) {
	t.Parallel() // its own serve, data dir and worker
	w := sdkWorkerFor(t, lang)
	p := newProxied(t, "e2e-sdk-killw-"+lang)
	taskType := uniq("sdk_killw_" + lang)
	wp := w.start(t, p.api(), taskType, p.domain, 2)
	const respTimeout = 8
	started := submit(t, p.proc, fanOutPlan(uniq("e2e-sdk-killw-"+lang), taskType, 2, 120000, 0, respTimeout), "req-1")
	sidecartest.WaitFor(t, "2 external steps to start", 90*time.Second, func() bool {
		return len(startedExternal(allEvents(t, p.proc, started.RunID))) >= 2
	})
	if _, err := p.client.Pause(t.Context(), started.RunID, 300, "sdk worker killed"); err != nil {
		t.Fatal(err)
	}
	if c := len(inFlight(t, p.proc, started.RunID)); c != 2 {
		t.Fatalf("%d steps in flight after the pause, want 2", c)
	}
	wp.kill()
	killed := time.Now()
	sidecartest.WaitFor(t, "the drain to end", 120*time.Second, func() bool {
		_, how := drainEnd(t, allEvents(t, p.proc, started.RunID))
		return how != ""
	})
	evs := allEvents(t, p.proc, started.RunID)
	took, how := drainEnd(t, evs)
	t.Logf("%s: drain ended with %s %s after RunPaused, %s after the kill (response timeout %ds)", lang, how, took, time.Since(killed).Round(time.Second), respTimeout)
	if how != statestore.RunDrainCompleted {
		t.Fatalf("drain ended with %s, want RunDrainCompleted once the response timeout passed\n%v", how, types(evs))
	}
	if took > 90*time.Second {
		t.Fatalf("the drain took %s: it waited for tasks nobody runs", took)
	}
	i := eventIndex(evs, statestore.RunStepTryEnded, "", 0)
	if i < 0 || !strings.Contains(string(evs[i].Payload), `"taskTimedOut"`) {
		t.Fatalf("RunStepTryEnded with reason taskTimedOut expected\n%v", types(evs))
	}
	validLog(t, evs)
	if _, err := p.client.Cancel(t.Context(), started.RunID, "test done"); err != nil {
		t.Fatal(err)
	}
}

// sdkKillSidecarWithTasksInFlight: the sidecar is killed (-9) while the
// worker of lang runs 4 external tasks; it restarts on the same log and
// addresses, the worker's updates (retried by its SDK) reach it, and the
// run completes with each step started and completed once: nothing is lost
// or run twice.
func sdkKillSidecarWithTasksInFlight(t *testing.T, lang string) {
	t.Parallel() // its own serve, data dir and worker
	w := sdkWorkerFor(t, lang)
	p := newProxied(t, "e2e-sdk-kills-"+lang)
	taskType := uniq("sdk_kills_" + lang)
	w.start(t, p.api(), taskType, p.domain, 4)
	const n = 4
	started := submit(t, p.proc, fanOutPlan(uniq("e2e-sdk-kills-"+lang), taskType, n, 6000, 0, 120), "req-1")
	sidecartest.WaitFor(t, "4 external steps to start", 90*time.Second, func() bool {
		return len(startedExternal(allEvents(t, p.proc, started.RunID))) >= n
	})
	p.stop(syscall.SIGKILL)
	p2 := startProxied(t, p.dataDir, p.addr, p.proxyAddr, p.domain)
	if v := waitTerminal(t, p2.proc, started.RunID, 120*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s after the restart, want COMPLETED\n%v", v.Status, types(allEvents(t, p2.proc, started.RunID)))
	}
	evs := allEvents(t, p2.proc, started.RunID)
	validLog(t, evs)
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("x%d", i)
		if s, c := count(evs, statestore.StepStarted, id), count(evs, statestore.StepCompleted, id); s != 1 || c != 1 {
			t.Fatalf("step %s: %d StepStarted, %d StepCompleted, want 1 and 1\n%v", id, s, c, types(evs))
		}
	}
}

func TestE2E_SDKWorkerPython_KillWorkerWhileDraining(t *testing.T) {
	sdkKillWorkerWhileDraining(t, "python")
}
func TestE2E_SDKWorkerJS_KillWorkerWhileDraining(t *testing.T) { sdkKillWorkerWhileDraining(t, "js") }
func TestE2E_SDKWorkerJava_KillWorkerWhileDraining(t *testing.T) {
	sdkKillWorkerWhileDraining(t, "java")
}

func TestE2E_SDKWorkerPython_KillSidecarWithTasksInFlight(t *testing.T) {
	sdkKillSidecarWithTasksInFlight(t, "python")
}
func TestE2E_SDKWorkerJS_KillSidecarWithTasksInFlight(t *testing.T) {
	sdkKillSidecarWithTasksInFlight(t, "js")
}
func TestE2E_SDKWorkerJava_KillSidecarWithTasksInFlight(t *testing.T) {
	sdkKillSidecarWithTasksInFlight(t, "java")
}
