package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// End-to-end tests: the real sidecar binary (package sidecartest builds
// and runs it), the real conductor-oss server (SIDECAR_TEST_CONDUCTOR_URL,
// started by deploy/local/conductor.sh) and the embedded NATS server.

// proc is a running "sidecar serve" and a client of its API.
type proc struct {
	serve  *sidecartest.Serve
	cmd    *exec.Cmd
	addr   string
	client *httpapi.Client
	log    *os.File
}

func newProc(s *sidecartest.Serve) *proc {
	return &proc{serve: s, cmd: s.Cmd, addr: s.Addr, client: httpapi.NewClient(s.URL()), log: s.Log}
}

// startServe runs the sidecar on dataDir (reused across restarts) with a
// worker id and task domain of its own (a later --task-domain in extra
// overrides it: other packages' tests poll the same Conductor), and waits
// until /readyz answers.
func startServe(t *testing.T, dataDir, addr string, extra ...string) *proc {
	t.Helper()
	return newProc(sidecartest.Start(t, sidecartest.Options{DataDir: dataDir, Addr: addr, Args: extra}))
}

// stop sends sig and waits until the process has ended.
func (p *proc) stop(sig syscall.Signal) { p.serve.Stop(sig) }

// submit starts pl as a client would: an answer that says retry (a 5xx,
// 429, or RUN_START_IN_PROGRESS) is repeated with the same runRequestId for
// up to two minutes, so a Conductor slow to answer on a loaded machine costs
// the test time, not its verdict. The start itself is not what these tests
// check; its idempotency is (adapter: TestRuns_StartRun, TestRuns_CrashRecovery
// and the chaos test).
func submit(t *testing.T, p *proc, pl *plan.Plan, requestID string) *httpapi.Started {
	t.Helper()
	started, err := trySubmit(t, p, pl, requestID)
	if err != nil {
		t.Fatal(err)
	}
	return started
}

// trySubmit is submit without t.Fatal, for goroutines.
func trySubmit(t *testing.T, p *proc, pl *plan.Plan, requestID string) (*httpapi.Started, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		started, err := p.client.Start(context.Background(), httpapi.StartRequest{
			TenantID: "t-e2e", ProjectID: "p-e2e", EnvironmentID: "test", RunRequestID: requestID, Plan: pl,
		})
		var apiErr *httpapi.Error
		if err == nil || !errors.As(err, &apiErr) || time.Now().After(deadline) ||
			(apiErr.Status < 500 && apiErr.Status != http.StatusTooManyRequests && apiErr.Code != adapter.CodeRunStartInProgress) {
			return started, err
		}
		t.Logf("start %s: %v; repeating it with the same runRequestId", requestID, err)
		time.Sleep(time.Second)
	}
}

// waitTerminal polls the run until it is terminal and returns its view.
func waitTerminal(t *testing.T, p *proc, runID string, within time.Duration) *httpapi.RunView {
	t.Helper()
	v := waitTerminalOr(p, runID, within)
	if v == nil || !statestore.IsTerminalRunStatus(v.Status) {
		t.Fatalf("run %s not terminal after %s: %+v\n%s", runID, within, v, whereItStands(t, p, v))
	}
	return v
}

// whereItStands is the run's log and its workflow as Conductor has it,
// for the message of a test that waited for the run in vain.
func whereItStands(t *testing.T, p *proc, v *httpapi.RunView) string {
	if v == nil || v.RunSnapshot == nil {
		return ""
	}
	var b strings.Builder
	if page, err := p.client.Events(context.Background(), v.RunID, 0, 1000); err == nil {
		b.WriteString("log:\n" + eventLines(page.Events))
	}
	wf, err := readConductorWorkflow(t, statestore.ConductorWorkflowID(v.EngineRunRef))
	if err != nil {
		fmt.Fprintf(&b, "Conductor's workflow: %v\n", err)
		return b.String()
	}
	fmt.Fprintf(&b, "Conductor's workflow: %s %s\n", wf.Status, wf.ReasonForIncompletion)
	for _, tk := range wf.Tasks {
		fmt.Fprintf(&b, "  task %s %s %s retry %d worker %q %s\n", tk.ReferenceTaskName, tk.TaskType, tk.Status, tk.RetryCount, tk.WorkerID, tk.ReasonForIncompletion)
	}
	return b.String()
}

func allEvents(t *testing.T, p *proc, runID string) []statestore.RunEventRecord {
	t.Helper()
	page, err := p.client.Events(context.Background(), runID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return page.Events
}

// eventLines is evs one line each, with attempts and payloads, for a
// failure's message.
func eventLines(evs []statestore.RunEventRecord) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  %d %s %s logical=%d engine=%d %s\n", e.RunSeq, e.EventType, e.StepID, e.LogicalAttemptID, e.EngineAttemptID, e.Payload)
	}
	return b.String()
}

// eventIndex returns the position of the first event of type et for stepID
// (and logical attempt, when > 0), or -1.
func eventIndex(evs []statestore.RunEventRecord, et, stepID string, attempt int64) int {
	for i, e := range evs {
		if e.EventType == et && e.StepID == stepID && (attempt == 0 || e.LogicalAttemptID == attempt) {
			return i
		}
	}
	return -1
}

func count(evs []statestore.RunEventRecord, et, stepID string) int {
	n := 0
	for _, e := range evs {
		if e.EventType == et && e.StepID == stepID {
			n++
		}
	}
	return n
}

func mustPlan(t *testing.T, js string) *plan.Plan {
	t.Helper()
	p, err := plan.Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// uniq is prefix made unique among this process's tests, parallel ones
// included, and its earlier runs on the same Conductor.
func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d%03d", prefix, time.Now().UnixNano(), uniqSeq.Add(1)%1000)
}

var uniqSeq atomic.Int64

func TestE2E_DiamondCompletes(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-diamond")+`","planVersion":"1","steps":[
		{"stepId":"a","executor":{"type":"command","argv":["sh","-c","echo a"]}},
		{"stepId":"b","executor":{"type":"sleep","seconds":0.5},"dependsOn":["a"]},
		{"stepId":"c","executor":{"type":"noop"},"dependsOn":["a"]},
		{"stepId":"d","executor":{"type":"noop"},"dependsOn":["b","c"]}]}`)
	started := submit(t, p, pl, "req-1")
	if !started.Created || !strings.HasPrefix(started.EngineRunRef, "conductor://") {
		t.Fatalf("start: %+v", started)
	}
	again := submit(t, p, pl, "req-1")
	if again.Created || again.RunID != started.RunID || again.WorkflowID != started.WorkflowID {
		t.Fatalf("a repeated start must return the same run: %+v vs %+v", again, started)
	}
	v := waitTerminal(t, p, started.RunID, 60*time.Second)
	if v.Status != statestore.RunStatusCompleted || v.Inconsistent || len(v.Steps) != 4 {
		t.Fatalf("run ended %s inconsistent=%v steps=%d", v.Status, v.Inconsistent, len(v.Steps))
	}
	for _, s := range v.Steps {
		if s.Status != statestore.StepStatusSuccess || s.LogicalAttemptID != 1 {
			t.Errorf("step %s: %s attempt %d", s.StepID, s.Status, s.LogicalAttemptID)
		}
	}
	a := v.Step("a")
	if len(a.Artifacts) == 0 || a.Artifacts[0].SHA256 == "" {
		t.Errorf("command step a has no stdout artifact: %+v", a.Artifacts)
	}
	evs := allEvents(t, p, started.RunID)
	if evs[0].EventType != statestore.RunStarted || evs[len(evs)-1].EventType != statestore.RunCompleted || len(evs) != 10 {
		t.Fatalf("want RunStarted, 4 x StepStarted/StepCompleted, RunCompleted; got %d events", len(evs))
	}
	// Every step starts after all its dependencies completed.
	for step, deps := range map[string][]string{"b": {"a"}, "c": {"a"}, "d": {"b", "c"}} {
		for _, dep := range deps {
			if eventIndex(evs, statestore.StepStarted, step, 1) < eventIndex(evs, statestore.StepCompleted, dep, 1) {
				t.Errorf("%s started before %s completed", step, dep)
			}
		}
	}
	if evs[0].PersistedAt == "" || !strings.Contains(string(evs[0].Payload), started.WorkflowID) {
		t.Errorf("RunStarted must carry the engineRunRef: %s", evs[0].Payload)
	}
}

func TestE2E_EngineRetriesGiveOneStepFailed(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-fail")+`","planVersion":"1","steps":[
		{"stepId":"flaky","executor":{"type":"command","argv":["sh","-c","echo failing >&2; exit 3"]},
		 "retries":{"engineTries":3}}]}`)
	started := submit(t, p, pl, "req-1")
	v := waitTerminal(t, p, started.RunID, 90*time.Second)
	if v.Status != statestore.RunStatusFailed {
		t.Fatalf("run ended %s, want FAILED", v.Status)
	}
	evs := allEvents(t, p, started.RunID)
	if n := count(evs, statestore.StepFailed, "flaky"); n != 1 {
		t.Fatalf("%d StepFailed, want exactly 1 (engine retries are not logical attempts)", n)
	}
	failed := evs[eventIndex(evs, statestore.StepFailed, "flaky", 0)]
	if failed.LogicalAttemptID != 1 || failed.EngineAttemptID != 3 {
		t.Fatalf("StepFailed at attempt %d.%d, want logical 1, engine 3", failed.LogicalAttemptID, failed.EngineAttemptID)
	}
	if count(evs, statestore.StepStarted, "flaky") != 1 || count(evs, statestore.RunFailed, "") != 1 {
		t.Fatalf("want one StepStarted (engine retries share its key) and one RunFailed: %v", types(evs))
	}
	if s := v.Step("flaky"); s.Error == nil || !strings.Contains(s.Error.Code+s.Error.Message, "3") {
		t.Fatalf("step error %+v should carry the exit code", s.Error)
	}
}

func TestE2E_SecondLogicalAttemptSucceeds(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	counter := filepath.Join(t.TempDir(), "tries")
	// Fails on tries 1 and 2 (logical attempt 1, engine tries 1 and 2),
	// succeeds on try 3 (logical attempt 2, engine try 1).
	script := fmt.Sprintf(`n=$(cat %[1]s 2>/dev/null || echo 0); n=$((n+1)); echo $n > %[1]s; [ $n -ge 3 ]`, counter)
	pl := &plan.Plan{PlanID: uniq("e2e-logical"), PlanVersion: "1", Steps: []plan.Step{{
		StepID: "s", Executor: plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c", script}},
		Retries: plan.RetryPolicy{EngineTries: 2, LogicalAttempts: 2},
	}}}
	started := submit(t, p, pl, "req-1")
	v := waitTerminal(t, p, started.RunID, 90*time.Second)
	if v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run ended %s, want COMPLETED", v.Status)
	}
	evs := allEvents(t, p, started.RunID)
	// The failed engine try of attempt 1 is not a StepFailed: it is
	// recorded as a try that ended (the step is idle until its next try
	// starts), so that no drain would wait for it (docs/events.md).
	want := []string{"RunStarted", "StepStarted/1", "RunStepTryEnded", "RunStepTryStarted", "StepFailed/1", "StepStarted/2", "StepCompleted/2", "RunCompleted"}
	if got := types(evs); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v, want %v", got, want)
	}
	if s := v.Step("s"); s.LogicalAttemptID != 2 || s.Status != statestore.StepStatusSuccess {
		t.Fatalf("step: %+v", s)
	}
}

// TestE2E_KillDuringStepThenRestart: kill -9 mid-step, restart on the same
// data dir (and, on PostgreSQL, database): the step runs to completion once,
// no event is doubled, and the run list shows the run COMPLETED.
func TestE2E_KillDuringStepThenRestart(t *testing.T) {
	t.Parallel() // its own serve and data dir
	forEachLogBackend(t, func(t *testing.T, store []string) {
		dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
		p := startServe(t, dataDir, addr, store...)
		marker := filepath.Join(t.TempDir(), "completions")
		pl := &plan.Plan{PlanID: uniq("e2e-kill"), PlanVersion: "1", Steps: []plan.Step{
			{StepID: "long", TimeoutSeconds: 8, Retries: plan.RetryPolicy{EngineTries: 3},
				Executor: plan.ExecutorSpec{Type: plan.ExecutorCommand, Argv: []string{"sh", "-c", "sleep 3; echo done >> " + marker}}},
			{StepID: "after", DependsOn: []string{"long"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
		}}
		started := submit(t, p, pl, "req-1")
		waitStepStarted(t, p, started.RunID, "long")
		p.stop(syscall.SIGKILL) // kill -9 mid-step
		p2 := startServe(t, dataDir, addr, store...)
		v := waitTerminal(t, p2, started.RunID, 120*time.Second)
		if v.Status != statestore.RunStatusCompleted {
			t.Fatalf("run ended %s after the restart, want COMPLETED", v.Status)
		}
		evs := allEvents(t, p2, started.RunID)
		seen := map[string]bool{}
		for _, e := range evs {
			if seen[e.IdempotencyKey] {
				t.Fatalf("duplicate event %s %s in the log", e.EventType, e.StepID)
			}
			seen[e.IdempotencyKey] = true
		}
		if count(evs, statestore.StepCompleted, "long") != 1 || count(evs, statestore.StepStarted, "long") != 1 {
			t.Fatalf("events %v", types(evs))
		}
		b, err := os.ReadFile(marker)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "done"); n != 1 {
			t.Fatalf("step long ran to completion %d times, want exactly once", n)
		}
		sidecartest.WaitFor(t, "the run list to show the run COMPLETED", 30*time.Second, func() bool {
			page, err := p2.client.ListRuns(context.Background(), url.Values{"planId": {pl.PlanID}})
			return err == nil && len(page.Runs) == 1 && page.Runs[0].RunID == started.RunID && page.Runs[0].Status == statestore.RunStatusCompleted
		})
	})
}

func types(evs []statestore.RunEventRecord) []string {
	var out []string
	for _, e := range evs {
		s := e.EventType
		if e.StepID != "" {
			s += fmt.Sprintf("/%d", e.LogicalAttemptID)
		}
		out = append(out, s)
	}
	return out
}

func TestE2E_SecretsNeverInEventsOrLogs(t *testing.T) {
	secret := "s3cr3t-" + uuid.NewString()
	t.Setenv("E2E_API_TOKEN", secret) // inherited by the sidecar process
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--log-level", "debug", "--secret-env-allow", "E2E_API_TOKEN")
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-secret")+`","planVersion":"1","steps":[
		{"stepId":"uses-secret","executor":{"type":"command","argv":["sh","-c","echo token=$API_TOKEN; echo $API_TOKEN >&2; exit 1"]},
		 "secrets":[{"name":"API_TOKEN","ref":"env:E2E_API_TOKEN"}]}]}`)
	started := submit(t, p, pl, "req-1")
	v := waitTerminal(t, p, started.RunID, 60*time.Second)
	if v.Status != statestore.RunStatusFailed {
		t.Fatalf("run ended %s, want FAILED (the step exits 1)", v.Status)
	}
	page, err := p.client.Events(context.Background(), started.RunID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(page)
	if strings.Contains(string(b), secret) {
		t.Fatal("the secret's value is in the event log")
	}
	if !strings.Contains(string(b), "stdout") {
		t.Fatal("the failed step should still reference its stdout artifact")
	}
	p.stop(syscall.SIGTERM)
	logs, _ := os.ReadFile(p.log.Name())
	if strings.Contains(string(logs), secret) {
		t.Fatal("the secret's value is in the sidecar's log")
	}
	if !strings.Contains(string(logs), "uses-secret") {
		t.Fatal("the sidecar log does not mention the step: the grep above proves nothing")
	}
}

func TestE2E_SIGTERMLetsRunningStepFinish(t *testing.T) {
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	p := startServe(t, dataDir, addr)
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-term")+`","planVersion":"1","steps":[
		{"stepId":"slow","executor":{"type":"command","argv":["sleep","2"]}},
		{"stepId":"next","executor":{"type":"noop"},"dependsOn":["slow"]}]}`)
	started := submit(t, p, pl, "req-1")
	waitStepStarted(t, p, started.RunID, "slow")
	began := time.Now()
	p.stop(syscall.SIGTERM) // graceful: the 5s grace exceeds the step's remaining time
	if took := time.Since(began); took < time.Second {
		t.Fatalf("sidecar exited after %s: it did not wait for the running step", took)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("graceful shutdown exited %d", code)
	}
	// Reopen the same log: the running step finished and was recorded
	// before exit, once; after the restart the run carries on to the end.
	p2 := startServe(t, dataDir, addr)
	evs := allEvents(t, p2, started.RunID)
	if i := eventIndex(evs, statestore.StepCompleted, "slow", 1); i < 0 {
		t.Fatalf("StepCompleted of the running step was not recorded before exit: %v", types(evs))
	}
	v := waitTerminal(t, p2, started.RunID, 60*time.Second)
	evs = allEvents(t, p2, started.RunID)
	if v.Status != statestore.RunStatusCompleted || count(evs, statestore.StepStarted, "slow") != 1 || count(evs, statestore.StepCompleted, "slow") != 1 {
		t.Fatalf("run %s, events %v", v.Status, types(evs))
	}
}

func TestE2E_CLI(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	server := "http://" + p.addr
	code, out, errOut := sidecartest.Run(t, "run", "submit", "../deploy/local/plans/diamond.yaml", "--server", server, "--run-request-id", uniq("cli"), "-o", "json")
	if code != 0 {
		t.Fatalf("run submit: exit %d %s", code, errOut)
	}
	var started httpapi.Started
	if err := json.Unmarshal([]byte(out), &started); err != nil || started.RunID == "" {
		t.Fatalf("run submit output %q: %v", out, err)
	}
	// events --follow returns by itself once the run has ended.
	done := make(chan struct{})
	var evOut string
	go func() {
		defer close(done)
		code, evOut, errOut = sidecartest.Run(t, "events", started.RunID, "--follow", "--interval", "200ms", "--server", server)
	}()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("events --follow did not return after the run ended")
	}
	if code != 0 || strings.Count(evOut, "\n") != 10 || !strings.Contains(evOut, "RunCompleted") {
		t.Fatalf("events --follow: exit %d, %d lines:\n%s%s", code, strings.Count(evOut, "\n"), evOut, errOut)
	}
	code, out, _ = sidecartest.Run(t, "status", started.RunID, "--server", server)
	if code != 0 || !strings.Contains(out, "COMPLETED") || strings.Count(out, "SUCCESS") != 4 {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	if code, _, errOut := sidecartest.Run(t, "status", "no-such-run", "--server", server); code != sidecartest.ExitNotFound || !strings.Contains(errOut, "RUN_NOT_FOUND") {
		t.Fatalf("status of an unknown run: exit %d %s", code, errOut)
	}
	// The same log in the other vocabularies: the diamond's
	// 10 events are 15 Core Events (EXECUTION_CREATED and a NODE_CREATED
	// per step added) and 12 NoETL events (start and end are each a
	// playbook and a workflow event).
	for vocabulary, n := range map[string]int{"core": 15, "noetl": 12} {
		code, out, errOut := sidecartest.Run(t, "events", started.RunID, "--vocabulary", vocabulary, "--server", server)
		if code != 0 || strings.Count(out, "\n") != n {
			t.Fatalf("events --vocabulary %s: exit %d, %d lines, want %d:\n%s%s", vocabulary, code, strings.Count(out, "\n"), n, out, errOut)
		}
	}
	if code, _, _ := sidecartest.Run(t, "events", started.RunID, "--vocabulary", "temporal", "--server", server); code != sidecartest.ExitUsage {
		t.Fatalf("an unknown vocabulary: exit %d", code)
	}
}

// waitTerminalOr is waitTerminal that returns the last view (nil when
// unreadable) instead of failing, so that the caller can say more.
func waitTerminalOr(p *proc, runID string, within time.Duration) *httpapi.RunView {
	deadline := time.Now().Add(within)
	for {
		v, err := p.client.Run(context.Background(), runID)
		if err == nil && statestore.IsTerminalRunStatus(v.Status) {
			return v
		}
		if time.Now().After(deadline) {
			return v
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestE2E_SIGTERMPastTheGraceExitsZero: a stop whose grace ends before a
// running step (the documented path: the step is interrupted, its task
// handed back) is a clean stop: exit 0, one line saying what was
// interrupted, not an error.
func TestE2E_SIGTERMPastTheGraceExitsZero(t *testing.T) {
	domain := uniq("e2e-term-grace")
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--shutdown-grace", "1s", "--task-domain", domain)
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-term-grace")+`","planVersion":"1","steps":[
		{"stepId":"long","executor":{"type":"command","argv":["sleep","60"]}}]}`)
	started := submit(t, p, pl, "req-1")
	waitStepStarted(t, p, started.RunID, "long")
	p.stop(syscall.SIGTERM)
	logs, _ := os.ReadFile(p.log.Name())
	if code := p.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(string(logs), "interrupted and their tasks handed back") {
		t.Fatalf("a stop past the grace exited %d; log:\n%s", code, logs[max(0, len(logs)-3000):])
	}
	// The interrupted step's task was handed back: Conductor gives it to
	// the next worker that polls, not only after its response timeout or
	// once this worker id starts again.
	poll := conductortest.URL(t) + "/tasks/poll/batch/" + plan.TaskType(plan.ExecutorCommand) +
		"?count=1&timeout=1000&workerid=e2e-next&domain=" + url.QueryEscape(domain)
	for deadline := time.Now().Add(20 * time.Second); ; {
		var tasks []struct {
			WorkflowInstanceID string `json:"workflowInstanceId"`
		}
		resp, err := http.Get(poll)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&tasks)
			resp.Body.Close()
		}
		if err == nil && len(tasks) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the interrupted step's task is not handed back to Conductor (a poll gets %d tasks, %v); log:\n%s",
				len(tasks), err, logs[max(0, len(logs)-3000):])
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitStepStarted waits (30 s at most) until the log of runID has the
// StepStarted of stepID.
func waitStepStarted(t *testing.T, p *proc, runID, stepID string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); eventIndex(allEvents(t, p, runID), statestore.StepStarted, stepID, 0) < 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("step %s never started", stepID)
		}
	}
}

// newToken makes a token of name with roles (sidecar token new): the
// token, and its entry for a tokens file under "principals:".
func newToken(t *testing.T, name, roles string) (token, entry string) {
	t.Helper()
	out, err := exec.Command(sidecartest.Binary(t), "token", "new", "--name", name, "--roles", roles).Output()
	if err != nil {
		t.Fatal(err)
	}
	token, entry, _ = strings.Cut(string(out), "\n")
	return token, entry
}
