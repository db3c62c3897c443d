package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

func apiCode(err error) string {
	var e *httpapi.Error
	if errors.As(err, &e) {
		return strconv.Itoa(e.Status) + " " + e.Code
	}
	return ""
}

// A step that fails for good under onStepFailure: pause pauses the run and
// is held; RESUME is refused until the step is retried; RETRY_STEP reruns
// it as the next logical attempt and RESUME carries the run on.
func TestE2E_StepFailurePausesThenRetry(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--log-format", "json")
	server := "http://" + p.addr
	marker := filepath.Join(t.TempDir(), "fixed")
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-retry")+`","planVersion":"1","onStepFailure":"pause","steps":[
		{"stepId":"flaky","executor":{"type":"command","argv":["test","-f",`+jsonString(marker)+`]}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["flaky"]}]}`)
	started := submit(t, p, pl, "req-1")
	ctx := context.Background()
	var v *httpapi.RunView
	sidecartest.WaitFor(t, "the run to pause on the failure", 30*time.Second, func() bool {
		v, _ = p.client.Run(ctx, started.RunID)
		return v != nil && v.Status == "PAUSED"
	})
	if v.Pause == nil || v.Pause.Reason != "stepFailed" || v.Pause.StepID != "flaky" ||
		!strings.Contains(v.Message, "step flaky failed") {
		t.Fatalf("paused on failure: %+v %q", v.Pause, v.Message)
	}
	if st := v.Step("flaky"); st == nil || st.Status != "FAILED" || !st.Held || st.LogicalAttemptID != 1 {
		t.Fatalf("held step: %+v", st)
	}
	code, out, errOut := sidecartest.Run(t, "status", started.RunID, "--server", server)
	if code != 0 || !strings.Contains(out, "reason    stepFailed (step flaky)") || !strings.Contains(out, "HELD (retry it: sidecar retry "+started.RunID+" flaky)") {
		t.Fatalf("status of a run paused on a failure: exit %d\n%s%s", code, out, errOut)
	}
	// Held, not failed: Conductor's workflow is paused, its task in progress.
	time.Sleep(2 * time.Second)
	if s := conductorStatus(t, started.WorkflowID); s != "PAUSED" {
		t.Fatalf("Conductor workflow %s, want PAUSED", s)
	}
	// RESUME without a retry would strand the step: refused, nothing written.
	before := len(allEvents(t, p, started.RunID))
	if _, err := p.client.Resume(ctx, started.RunID); apiCode(err) != "409 INVALID_TRANSITION" {
		t.Fatalf("resume while a failed step is held: %v", err)
	}
	if _, err := p.client.RetryStep(ctx, started.RunID, "nope", ""); apiCode(err) != "404 STEP_NOT_FOUND" {
		t.Fatalf("retry of an unknown step: %v", err)
	}
	if _, err := p.client.RetryStep(ctx, started.RunID, "after", ""); apiCode(err) != "404 STEP_NOT_FOUND" {
		t.Fatalf("retry of a step that never ran: %v", err)
	}
	if n := len(allEvents(t, p, started.RunID)); n != before {
		t.Fatalf("refused actions wrote %d events", n-before)
	}
	// Fix the cause, retry through the CLI with an Idempotency-Key, then
	// repeat it: the repeat is the first answer, replayed.
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = sidecartest.Run(t, "retry", started.RunID, "flaky", "--idempotency-key", "retry-1", "--server", server, "-o", "json")
	if code != 0 || !strings.Contains(out, `"retryRequested": true`) {
		t.Fatalf("sidecar retry: exit %d\n%s%s", code, out, errOut)
	}
	code, again, errOut := sidecartest.Run(t, "retry", started.RunID, "flaky", "--idempotency-key", "retry-1", "--server", server, "-o", "json")
	if code != 0 || again != out {
		t.Fatalf("replayed retry differs: exit %d\n%s\nvs\n%s%s", code, again, out, errOut)
	}
	// In text the CLI says it is a replay and shows the run as it is now
	// too (it printed the stored state as if current before).
	code, text, errOut := sidecartest.Run(t, "retry", started.RunID, "flaky", "--idempotency-key", "retry-1", "--server", server)
	if code != 0 || !strings.HasPrefix(text, "replayed: ") || !strings.Contains(text, "\nnow: ") {
		t.Fatalf("replayed retry in text: exit %d\n%s%s", code, text, errOut)
	}
	if _, err := p.client.Resume(ctx, started.RunID); err != nil {
		t.Fatal(err)
	}
	if v := waitTerminal(t, p, started.RunID, 60*time.Second); v.Status != "COMPLETED" {
		t.Fatalf("run %s after retry and resume", v.Status)
	}
	evs := allEvents(t, p, started.RunID)
	if count(evs, statestore.RunStepRetryRequested, "") != 1 {
		t.Fatalf("want one RunStepRetryRequested: %v", types(evs))
	}
	failed1 := eventIndex(evs, statestore.StepFailed, "flaky", 1)
	started2 := eventIndex(evs, statestore.StepStarted, "flaky", 2)
	completed2 := eventIndex(evs, statestore.StepCompleted, "flaky", 2)
	afterDone := eventIndex(evs, statestore.StepCompleted, "after", 0)
	if failed1 < 0 || started2 < failed1 || completed2 < started2 || afterDone < completed2 ||
		!strings.Contains(string(evs[failed1].Payload), `"onStepFailure":"pause"`) {
		t.Fatalf("event order: %v", types(evs))
	}
	if s := conductorStatus(t, started.WorkflowID); s != "COMPLETED" {
		t.Fatalf("Conductor workflow %s", s)
	}
	// The JSON log names the run, the step and the attempt where they apply.
	found := false
	for _, line := range logLines(t, p) {
		if line["msg"] == "step failed for this logical attempt" {
			found = line["runId"] == started.RunID && line["stepId"] == "flaky" && line["logicalAttemptId"] == 1.0 && line["held"] == true
			if !found {
				t.Fatalf("step failure log line without its fields: %v", line)
			}
		}
	}
	if !found {
		t.Fatal("no JSON log line for the step failure")
	}
}

// logLines decodes the sidecar's JSON log.
func logLines(t *testing.T, p *proc) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(p.log.Name())
	if err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for _, l := range strings.Split(string(b), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			lines = append(lines, m)
		}
	}
	if len(lines) == 0 {
		t.Fatal("the sidecar's log has no JSON line")
	}
	return lines
}

// Under onStepFailure: fail (the default) the run fails, terminal, and a
// RETRY_STEP gets 409.
func TestE2E_FailPolicyRetryConflicts(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-fail")+`","planVersion":"1","steps":[
		{"stepId":"bad","executor":{"type":"command","argv":["false"]}}]}`)
	started := submit(t, p, pl, "req-1")
	if v := waitTerminal(t, p, started.RunID, 60*time.Second); v.Status != "FAILED" {
		t.Fatalf("run %s", v.Status)
	}
	before := len(allEvents(t, p, started.RunID))
	if _, err := p.client.RetryStep(context.Background(), started.RunID, "bad", ""); apiCode(err) != "409 INVALID_TRANSITION" {
		t.Fatalf("retry under the fail policy: %v", err)
	}
	if n := len(allEvents(t, p, started.RunID)); n != before {
		t.Fatal("a refused retry wrote events")
	}
}

func metricValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in /metrics", name)
	}
	f, _ := strconv.ParseFloat(string(m[1]), 64)
	return f
}

// kill -9 of the sidecar while a run is DRAINING; the drain deadline passes
// while no sidecar runs; the restarted process raises it once, at start,
// and carries the run on from the log.
func TestE2E_RestartWhileDraining(t *testing.T) {
	t.Parallel() // its own serve and data dir
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	p := startServe(t, dataDir, addr)
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-restart-drain")+`","planVersion":"1","steps":[
		{"stepId":"slow","executor":{"type":"command","argv":["sleep","8"]}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["slow"]}]}`)
	started := submit(t, p, pl, "req-1")
	sidecartest.WaitFor(t, "slow to start", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "slow", 0) >= 0
	})
	v, err := p.client.Pause(context.Background(), started.RunID, 2, "")
	if err != nil || v.Substatus != "DRAINING" {
		t.Fatalf("pause: %+v %v", v, err)
	}
	p.stop(syscall.SIGKILL)
	time.Sleep(3 * time.Second) // the 2s deadline passes while no sidecar runs

	p = startServe(t, dataDir, addr)
	var evs []statestore.RunEventRecord
	sidecartest.WaitFor(t, "the restarted sidecar to raise the drain timeout", 15*time.Second, func() bool {
		evs = allEvents(t, p, started.RunID)
		return eventIndex(evs, statestore.RunDrainTimedOut, "", 0) >= 0
	})
	if n := metricValue(t, addr, "sidecar_drain_timeouts_total"); n != 1 {
		t.Fatalf("sidecar_drain_timeouts_total %v after restart, want 1", n)
	}
	v, _ = p.client.Run(context.Background(), started.RunID)
	if v.Status != "PAUSED" || v.Drain == nil || !v.Drain.TimedOut {
		t.Fatalf("after restart: %s %+v", v.Status, v.Drain)
	}
	// The step's process died with the first sidecar; after RESUME the
	// task, recovered by worker id, runs again and the run completes.
	if _, err := p.client.Resume(context.Background(), started.RunID); err != nil {
		t.Fatal(err)
	}
	if v := waitTerminal(t, p, started.RunID, 90*time.Second); v.Status != "COMPLETED" {
		t.Fatalf("run %s", v.Status)
	}
	evs = allEvents(t, p, started.RunID)
	if count(evs, statestore.RunDrainTimedOut, "") != 1 || count(evs, statestore.StepCompleted, "slow") != 1 {
		t.Fatalf("events %v", types(evs))
	}
	assertNoDuplicateKeys(t, evs)
}

func assertNoDuplicateKeys(t *testing.T, evs []statestore.RunEventRecord) {
	t.Helper()
	seen := map[string]bool{}
	for _, e := range evs {
		if seen[e.IdempotencyKey] {
			t.Fatalf("idempotencyKey %s twice in the log: %v", e.IdempotencyKey, types(evs))
		}
		seen[e.IdempotencyKey] = true
	}
}

// Two sidecars share one NATS and one Conductor: the first opens its
// embedded server to the second (--nats-listen, user sidecar with a
// password file), and both watch the drain; between them the log gets one
// RunDrainTimedOut and the metrics one PAUSE_DRAIN_TIMEOUT.
func TestE2E_TwoSidecarsShareNATS(t *testing.T) {
	conductortest.URL(t) // skip early without Conductor
	pw := filepath.Join(t.TempDir(), "nats-password")
	if err := os.WriteFile(pw, []byte("e2e-shared-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	natsAddr, domain := sidecartest.FreeAddr(t), uniq("e2e-shared")
	a := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--nats-listen", natsAddr, "--nats-password-file", pw, "--task-domain", domain)
	b := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--nats-url", "nats://"+natsAddr, "--nats-password-file", pw, "--task-domain", domain)
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-two")+`","planVersion":"1","steps":[
		{"stepId":"s1","executor":{"type":"command","argv":["sleep","5"]}},
		{"stepId":"s2","executor":{"type":"command","argv":["sleep","5"]}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["s1","s2"]}]}`)
	started := submit(t, a, pl, "req-1")
	// The same start through the other sidecar is the same run.
	if again := submit(t, b, pl, "req-1"); again.RunID != started.RunID || again.Created {
		t.Fatalf("start through the second sidecar: %+v", again)
	}
	sidecartest.WaitFor(t, "both steps to start", 30*time.Second, func() bool {
		evs := allEvents(t, a, started.RunID)
		return count(evs, statestore.StepStarted, "s1")+count(evs, statestore.StepStarted, "s2") == 2
	})
	if _, err := a.client.Pause(context.Background(), started.RunID, 1, ""); err != nil {
		t.Fatal(err)
	}
	// Pausing again through the other sidecar changes nothing.
	if v, err := b.client.Pause(context.Background(), started.RunID, 1, ""); err != nil || v.Status != "PAUSED" {
		t.Fatalf("second pause: %+v %v", v, err)
	}
	sidecartest.WaitFor(t, "the drain to time out", 15*time.Second, func() bool {
		return eventIndex(allEvents(t, b, started.RunID), statestore.RunDrainTimedOut, "", 0) >= 0
	})
	sidecartest.WaitFor(t, "the steps to finish after the timeout", 30*time.Second, func() bool {
		evs := allEvents(t, b, started.RunID)
		return count(evs, statestore.StepCompleted, "s1")+count(evs, statestore.StepCompleted, "s2") == 2
	})
	if _, err := b.client.Resume(context.Background(), started.RunID); err != nil {
		t.Fatal(err)
	}
	if v := waitTerminal(t, a, started.RunID, 60*time.Second); v.Status != "COMPLETED" {
		t.Fatalf("run %s", v.Status)
	}
	evs := allEvents(t, b, started.RunID)
	if count(evs, statestore.RunDrainTimedOut, "") != 1 || count(evs, statestore.RunPaused, "") != 1 {
		t.Fatalf("events %v", types(evs))
	}
	assertNoDuplicateKeys(t, evs)
	if n := metricValue(t, a.addr, "sidecar_drain_timeouts_total") + metricValue(t, b.addr, "sidecar_drain_timeouts_total"); n != 1 {
		t.Fatalf("drain timeouts counted %v between the two sidecars, want 1", n)
	}
}

// Two deployments (each its own NATS) on one Conductor, without task
// domains: each polls the other's tasks too, hands them back untouched, and
// both runs complete.
func TestE2E_TwoDeploymentsOnOneConductor(t *testing.T) {
	a := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--task-domain", "")
	b := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--task-domain", "")
	chain := func(id string) string {
		steps := `{"stepId":"s0","executor":{"type":"noop"}}`
		for i := 1; i < 6; i++ {
			steps += `,{"stepId":"s` + strconv.Itoa(i) + `","executor":{"type":"noop"},"dependsOn":["s` + strconv.Itoa(i-1) + `"]}`
		}
		return `{"planId":"` + uniq(id) + `","planVersion":"1","steps":[` + steps + `]}`
	}
	ra := submit(t, a, mustPlan(t, chain("e2e-dep-a")), "req-a")
	rb := submit(t, b, mustPlan(t, chain("e2e-dep-b")), "req-b")
	for _, c := range []struct {
		p   *proc
		run string
	}{{a, ra.RunID}, {b, rb.RunID}} {
		if v := waitTerminal(t, c.p, c.run, 90*time.Second); v.Status != "COMPLETED" {
			t.Fatalf("run %s: %s (steps %+v)", c.run, v.Status, v.Steps)
		}
		if evs := allEvents(t, c.p, c.run); count(evs, statestore.StepCompleted, "s5") != 1 {
			t.Fatalf("events %v", types(evs))
		}
	}
	handedBack := metricValue(t, a.addr, `sidecar_worker_tasks_handed_back_total{reason="unknown_run"}`) +
		metricValue(t, b.addr, `sidecar_worker_tasks_handed_back_total{reason="unknown_run"}`)
	t.Logf("tasks of the other deployment handed back: %v", handedBack)
}

// A held step's task completed by hand in Conductor is never polled
// again: the RETRY_STEP records the retried attempt as Conductor completed
// it (naming the task), and RESUME carries the run on with every step
// ended as Conductor ended it. One failed by hand, with no engine retry
// left, fails the workflow at the resume; the retried attempt is recorded
// as Conductor failed it.
func TestE2E_HeldStepCompletedInConductor(t *testing.T) {
	heldStepEndedInConductor(t, "COMPLETED")
}

func TestE2E_HeldStepFailedInConductor(t *testing.T) {
	heldStepEndedInConductor(t, "FAILED")
}

func heldStepEndedInConductor(t *testing.T, status string) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-held-hand")+`","planVersion":"1","onStepFailure":"pause","steps":[
		{"stepId":"flaky","executor":{"type":"command","argv":["false"]}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["flaky"]}]}`)
	started := submit(t, p, pl, "req-1")
	ctx := context.Background()
	sidecartest.WaitFor(t, "the run to pause on the failure", 30*time.Second, func() bool {
		v, _ := p.client.Run(ctx, started.RunID)
		return v != nil && v.Status == "PAUSED" && v.Step("flaky") != nil && v.Step("flaky").Held
	})
	// The operator ends the held task in Conductor.
	var held conductorTask
	sidecartest.WaitFor(t, "the held task in Conductor", 30*time.Second, func() bool {
		wf, err := readConductorWorkflow(t, started.WorkflowID)
		if err != nil {
			return false
		}
		for _, tk := range wf.Tasks {
			if id, ok := plan.StepIDFromRef(tk.ReferenceTaskName); ok && id == "flaky" && (tk.Status == "SCHEDULED" || tk.Status == "IN_PROGRESS") {
				held = tk
				return true
			}
		}
		return false
	})
	body, _ := json.Marshal(map[string]any{"taskId": held.TaskID, "workflowInstanceId": started.WorkflowID,
		"status": status, "outputData": map[string]any{"byHand": true}, "reasonForIncompletion": "by hand"})
	resp, err := http.Post(conductortest.URL(t)+"/tasks", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("update by hand: %s", resp.Status)
	}
	v, err := p.client.RetryStep(ctx, started.RunID, "flaky", "")
	if err != nil {
		t.Fatal(err)
	}
	want := "SUCCESS" // at the retry: the attempt Conductor completed
	if status == "FAILED" {
		want = "PENDING" // Conductor decides at the resume
	}
	if st := v.Step("flaky"); st == nil || st.Status != want || st.LogicalAttemptID != 2 {
		t.Fatalf("the retry's answer shows flaky %+v, want %s at logical attempt 2", st, want)
	}
	if _, err := p.client.Resume(ctx, started.RunID); err != nil {
		t.Fatal(err)
	}
	v = waitTerminal(t, p, started.RunID, 60*time.Second)
	evs := allEvents(t, p, started.RunID)
	assertNoDuplicateKeys(t, evs)
	if status == "FAILED" {
		// No engine retry left: the workflow fails, and the retried
		// attempt is recorded as Conductor failed it.
		if st := v.Step("flaky"); v.Status != "FAILED" || v.Inconsistent || st == nil || st.Status != "FAILED" || st.LogicalAttemptID != 2 ||
			st.Error == nil || !strings.Contains(st.Error.Message, "by hand") {
			t.Fatalf("run %s (inconsistent %t), flaky %+v; want FAILED, flaky FAILED at logical attempt 2 with Conductor's reason\n%s",
				v.Status, v.Inconsistent, st, conductorTasks(t, started.WorkflowID))
		}
		return
	}
	if v.Status != "COMPLETED" || v.Inconsistent {
		t.Fatalf("run %s (inconsistent %t)\n%s", v.Status, v.Inconsistent, conductorTasks(t, started.WorkflowID))
	}
	for _, id := range []string{"flaky", "after"} {
		if st := v.Step(id); st == nil || st.Status != "SUCCESS" {
			t.Fatalf("step %s: %+v, want SUCCESS", id, st)
		}
	}
	retry := eventIndex(evs, statestore.RunStepRetryRequested, "", 0)
	started2 := eventIndex(evs, statestore.StepStarted, "flaky", 2)
	completed2 := eventIndex(evs, statestore.StepCompleted, "flaky", 2)
	if retry < 0 || started2 < retry || completed2 < started2 || !strings.Contains(string(evs[completed2].Payload), `"engineTaskId":"`+held.TaskID+`"`) {
		t.Fatalf("events %v; want the retried attempt started and completed as Conductor did, naming task %s", types(evs), held.TaskID)
	}
}
