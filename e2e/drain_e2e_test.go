package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/jackc/pgx/v5"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func conductorStatus(t *testing.T, workflowID string) string {
	t.Helper()
	resp, err := http.Get(conductortest.URL(t) + "/workflow/" + workflowID + "?includeTasks=false")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var wf struct{ Status string }
	_ = json.NewDecoder(resp.Body).Decode(&wf)
	return wf.Status
}

// conductorWorkflow is Conductor's copy of a workflow, with its tasks
// (the fields the tests read).
type conductorWorkflow struct {
	Status, ReasonForIncompletion string
	Tasks                         []conductorTask
}

type conductorTask struct {
	TaskID                                                               string `json:"taskId"`
	ReferenceTaskName, TaskType, Status, ReasonForIncompletion, WorkerID string
	RetryCount, PollCount                                                int
	Retried                                                              bool
	UpdateTime, EndTime                                                  int64
}

// readConductorWorkflow reads Conductor's copy of a workflow with its tasks.
func readConductorWorkflow(t *testing.T, workflowID string) (*conductorWorkflow, error) {
	t.Helper()
	resp, err := http.Get(conductortest.URL(t) + "/workflow/" + workflowID + "?includeTasks=true")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var wf conductorWorkflow
	if err := json.NewDecoder(resp.Body).Decode(&wf); err != nil {
		return nil, err
	}
	return &wf, nil
}

// conductorTasks describes Conductor's tasks of a workflow, one line each
// (reference name, type, status, retry count, poll count, update and end
// times, reason), and its reason for incompletion: what a failure message
// needs when Conductor decided an outcome the test did not expect.
func conductorTasks(t *testing.T, workflowID string) string {
	t.Helper()
	wf, err := readConductorWorkflow(t, workflowID)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Conductor: workflow %s %q\n", wf.Status, wf.ReasonForIncompletion)
	for _, tk := range wf.Tasks {
		fmt.Fprintf(&b, "  %s %s %s retryCount=%d retried=%t pollCount=%d updated=%s ended=%s %q\n", tk.ReferenceTaskName, tk.TaskType, tk.Status,
			tk.RetryCount, tk.Retried, tk.PollCount, time.UnixMilli(tk.UpdateTime).UTC().Format("15:04:05.000"),
			time.UnixMilli(tk.EndTime).UTC().Format("15:04:05.000"), tk.ReasonForIncompletion)
	}
	return b.String()
}

// TestMain stops the PostgreSQL cluster pgtest started, if any.
func TestMain(m *testing.M) { pgtest.Main(m) }

// forEachLogBackend runs test once per store of the run event log, with
// the serve flags that select it: JetStream (the default) and PostgreSQL
// (--store, a database of its own; skipped without a PostgreSQL, see
// package pgtest). On PostgreSQL it checks at the end that the log and the
// event ids are in the database (not on NATS).
func forEachLogBackend(t *testing.T, test func(t *testing.T, store []string)) {
	t.Run("jetstream", func(t *testing.T) { test(t, nil) })
	t.Run("postgres", func(t *testing.T) {
		url := pgtest.URL(t)
		t.Cleanup(func() { inPostgres(t, url) })
		test(t, []string{"--store", url})
	})
}

// inPostgres fails t unless the database at url holds events, their
// registered eventIds and the runs' persisted snapshots.
func inPostgres(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var events, ids, snaps int
	if err := conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM run_events), (SELECT count(*) FROM event_ids), (SELECT count(*) FROM run_snapshots)").Scan(&events, &ids, &snaps); err != nil {
		t.Fatal(err)
	}
	if events == 0 || ids < events || snaps == 0 {
		t.Fatalf("postgresql holds %d events, %d event ids and %d snapshots: the log is not there", events, ids, snaps)
	}
}

func TestE2E_PauseDrainsThenResume(t *testing.T) {
	t.Parallel() // its own serve and data dir
	forEachLogBackend(t, func(t *testing.T, store []string) {
		p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), store...)
		server := "http://" + p.addr
		pl := mustPlan(t, `{"planId":"`+uniq("e2e-drain")+`","planVersion":"1","steps":[
			{"stepId":"p1","executor":{"type":"command","argv":["sleep","3"]}},
			{"stepId":"p2","executor":{"type":"command","argv":["sleep","3"]}},
			{"stepId":"p3","executor":{"type":"command","argv":["sleep","3"]}},
			{"stepId":"d1","executor":{"type":"noop"},"dependsOn":["p1","p2","p3"]},
			{"stepId":"d2","executor":{"type":"noop"},"dependsOn":["d1"]}]}`)
		started := submit(t, p, pl, "req-1")
		sidecartest.WaitFor(t, "the 3 parallel steps to start", 30*time.Second, func() bool {
			evs := allEvents(t, p, started.RunID)
			return count(evs, statestore.StepStarted, "p1")+count(evs, statestore.StepStarted, "p2")+count(evs, statestore.StepStarted, "p3") == 3
		})
		v, err := p.client.Pause(context.Background(), started.RunID, 0, "maintenance")
		if err != nil {
			t.Fatal(err)
		}
		if v.Status != "PAUSED" || v.Substatus != "DRAINING" || v.Drain == nil || len(v.Drain.InFlightStepIDs) != 3 ||
			v.Message != "Workflow paused. Waiting for 3 in-flight tasks to complete." || v.Drain.TimeoutSeconds != 300 {
			t.Fatalf("after pause: %s/%s %q drain %+v", v.Status, v.Substatus, v.Message, v.Drain)
		}
		// pause --wait on the paused run: idempotent, waits for the drain, exit 0.
		code, out, errOut := sidecartest.Run(t, "pause", started.RunID, "--wait", "--server", server)
		if code != 0 || !strings.Contains(out, "DRAINING") {
			t.Fatalf("pause --wait: exit %d\n%s%s", code, out, errOut)
		}
		v, _ = p.client.Run(context.Background(), started.RunID)
		if v.Status != "PAUSED" || v.Substatus != "" || v.Drain.EndedAt == "" || v.Drain.TimedOut {
			t.Fatalf("after the drain: %s/%s %+v", v.Status, v.Substatus, v.Drain)
		}
		// No new step starts while paused: in the log and in Conductor.
		time.Sleep(3 * time.Second)
		evs := allEvents(t, p, started.RunID)
		if eventIndex(evs, statestore.StepStarted, "d1", 0) >= 0 {
			t.Fatal("d1 started while the run was paused")
		}
		if s := conductorStatus(t, started.WorkflowID); s != "PAUSED" {
			t.Fatalf("Conductor workflow %s, want PAUSED", s)
		}
		if eventIndex(evs, statestore.RunDrainCompleted, "", 0) < 0 {
			t.Fatalf("no RunDrainCompleted: %v", types(evs))
		}
		if code, out, errOut := sidecartest.Run(t, "resume", started.RunID, "--server", server); code != 0 {
			t.Fatalf("resume: exit %d %s%s", code, out, errOut)
		}
		v = waitTerminal(t, p, started.RunID, 60*time.Second)
		evs = allEvents(t, p, started.RunID)
		if v.Status != "COMPLETED" {
			t.Fatalf("run %s, want COMPLETED: %v", v.Status, types(evs))
		}
		for _, s := range []string{"p1", "p2", "p3", "d1", "d2"} {
			if count(evs, statestore.StepStarted, s) != 1 || count(evs, statestore.StepCompleted, s) != 1 {
				t.Fatalf("step %s did not run exactly once: %v", s, types(evs))
			}
		}
		runLevelEngineAttemptIsOne(t, evs)
		order := []int{eventIndex(evs, statestore.RunPaused, "", 0), eventIndex(evs, statestore.RunDrainCompleted, "", 0),
			eventIndex(evs, statestore.RunResumed, "", 0), eventIndex(evs, statestore.StepStarted, "d1", 0)}
		for i := 1; i < len(order); i++ {
			if order[i] <= order[i-1] {
				t.Fatalf("want RunPaused < RunDrainCompleted < RunResumed < StepStarted d1: %v", types(evs))
			}
		}
		// Resuming a running run is an invalid transition, and writes nothing.
		if code, _, errOut := sidecartest.Run(t, "resume", started.RunID, "--server", server); code != sidecartest.ExitConflict || !strings.Contains(errOut, "INVALID_TRANSITION") {
			t.Fatalf("resume of a completed run: exit %d %s", code, errOut)
		}
		if n := len(allEvents(t, p, started.RunID)); n != len(evs) {
			t.Fatalf("a refused resume wrote %d events", n-len(evs))
		}
	})
}

func TestE2E_DrainTimeout(t *testing.T) {
	t.Parallel() // its own serve and data dir
	forEachLogBackend(t, func(t *testing.T, store []string) {
		p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), store...)
		pl := mustPlan(t, `{"planId":"`+uniq("e2e-timeout")+`","planVersion":"1","steps":[
			{"stepId":"slow","executor":{"type":"command","argv":["sleep","5"]}},
			{"stepId":"after","executor":{"type":"noop"},"dependsOn":["slow"]}]}`)
		started := submit(t, p, pl, "req-1")
		sidecartest.WaitFor(t, "slow to start", 30*time.Second, func() bool {
			return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "slow", 0) >= 0
		})
		code, out, errOut := sidecartest.Run(t, "pause", started.RunID, "--timeout", "1s", "--wait", "--server", "http://"+p.addr)
		if code != sidecartest.ExitDrainTimeout || !strings.Contains(errOut, "PAUSE_DRAIN_TIMEOUT") {
			t.Fatalf("pause --timeout 1s --wait: exit %d, want 3\n%s%s", code, out, errOut)
		}
		evs := allEvents(t, p, started.RunID)
		i := eventIndex(evs, statestore.RunDrainTimedOut, "", 0)
		if i < 0 || !strings.Contains(string(evs[i].Payload), `"PAUSE_DRAIN_TIMEOUT"`) || !strings.Contains(string(evs[i].Payload), `"slow"`) {
			t.Fatalf("RunDrainTimedOut with the code and the in-flight step expected: %v", types(evs))
		}
		// The running step is not interrupted by the pause: it completes, recorded.
		sidecartest.WaitFor(t, "slow to complete after the timeout", 30*time.Second, func() bool {
			return eventIndex(allEvents(t, p, started.RunID), statestore.StepCompleted, "slow", 0) >= 0
		})
		if _, err := p.client.Resume(context.Background(), started.RunID); err != nil {
			t.Fatal(err)
		}
		if v := waitTerminal(t, p, started.RunID, 60*time.Second); v.Status != "COMPLETED" {
			t.Fatalf("run %s", v.Status)
		}
		resp, err := http.Get("http://" + p.addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(body), "sidecar_drain_timeouts_total 1") {
			t.Fatal("sidecar_drain_timeouts_total is not 1")
		}
	})
}

func TestE2E_CancelWhileDraining(t *testing.T) {
	forEachLogBackend(t, func(t *testing.T, store []string) {
		p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), store...)
		marker := filepath.Join(t.TempDir(), "signal")
		script := `trap 'echo TERM > ` + marker + `; exit 143' TERM; sleep 30 & wait`
		pl := mustPlan(t, `{"planId":"`+uniq("e2e-cancel")+`","planVersion":"1","steps":[
			{"stepId":"long","executor":{"type":"command","argv":["sh","-c",`+jsonString(script)+`]}},
			{"stepId":"after","executor":{"type":"noop"},"dependsOn":["long"]}]}`)
		started := submit(t, p, pl, "req-1")
		sidecartest.WaitFor(t, "long to start", 30*time.Second, func() bool {
			return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "long", 0) >= 0
		})
		if v, err := p.client.Pause(context.Background(), started.RunID, 0, ""); err != nil || v.Substatus != "DRAINING" {
			t.Fatalf("pause: %v %v", v, err)
		}
		v, err := p.client.Cancel(context.Background(), started.RunID, "operator")
		if err != nil {
			t.Fatal(err)
		}
		if v.Status != "CANCELLED" {
			t.Fatalf("after cancel: %s", v.Status)
		}
		if s := conductorStatus(t, started.WorkflowID); s != "TERMINATED" {
			t.Fatalf("Conductor workflow %s, want TERMINATED", s)
		}
		sidecartest.WaitFor(t, "the command to receive SIGTERM", 15*time.Second, func() bool {
			b, _ := os.ReadFile(marker)
			return strings.Contains(string(b), "TERM")
		})
		evs := allEvents(t, p, started.RunID)
		if eventIndex(evs, statestore.RunCancelRequested, "", 0) < 0 || eventIndex(evs, statestore.RunCancelled, "", 0) < 0 {
			t.Fatalf("events %v", types(evs))
		}
		time.Sleep(time.Second)
		if v, _ := p.client.Run(context.Background(), started.RunID); v.Status != "CANCELLED" {
			t.Fatalf("cancel must win: %s", v.Status)
		}
	})
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// runLevelEngineAttemptIsOne checks the fallback of IRunStateStore
// Contract v2.0.0 §3.3: an event no engine try produced (every run-level
// event) has engineAttemptId 1.
func runLevelEngineAttemptIsOne(t *testing.T, evs []statestore.RunEventRecord) {
	t.Helper()
	for _, e := range evs {
		if e.StepID == "" && e.EngineAttemptID != 1 {
			t.Fatalf("%s (runSeq %d) has engineAttemptId %d; a run-level event has no engine try: 1", e.EventType, e.RunSeq, e.EngineAttemptID)
		}
	}
}

// TestE2E_KillMidCancelThenRestart: serve is killed -9 after it recorded
// RunCancelRequested and before its terminate reached Conductor (held at a
// front of Conductor, which the kill cuts). The serve started on the same
// data dir completes the cancel: Conductor TERMINATED, the log CANCELLED,
// RunCancelled naming who requested the cancel, the step not run to its
// end and nothing after the cancel.
func TestE2E_KillMidCancelThenRestart(t *testing.T) {
	t.Parallel() // its own serve, data dir and front of Conductor
	forEachLogBackend(t, func(t *testing.T, store []string) {
		front, conductorURL := conductortest.NewHolding(t)
		dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
		start := func() *proc {
			return newProc(sidecartest.Start(t, sidecartest.Options{DataDir: dataDir, Addr: addr, ConductorURL: conductorURL, Args: store}))
		}
		p := start()
		marker := filepath.Join(t.TempDir(), "ran")
		pl := mustPlan(t, `{"planId":"`+uniq("e2e-killcancel")+`","planVersion":"1","steps":[
			{"stepId":"long","executor":{"type":"command","argv":["sh","-c",`+jsonString("sleep 8; echo done > "+marker)+`]}},
			{"stepId":"after","executor":{"type":"noop"},"dependsOn":["long"]}]}`)
		started := submit(t, p, pl, "req-1")
		sidecartest.WaitFor(t, "long to start", 30*time.Second, func() bool {
			return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "long", 0) >= 0
		})
		held := front.HoldNext("terminate")
		go func() { _, _ = p.client.Cancel(context.Background(), started.RunID, "stop it") }()
		select {
		case <-held.Entered:
		case <-time.After(30 * time.Second):
			t.Fatal("the cancel's terminate never reached Conductor's front")
		}
		requested := allEvents(t, p, started.RunID)
		at := eventIndex(requested, statestore.RunCancelRequested, "", 0)
		if at < 0 {
			t.Fatalf("log %v while the terminate is under way, want RunCancelRequested in it", types(requested))
		}
		p.stop(syscall.SIGKILL)
		killedAt := time.Now() // the held terminate stays held: it never reaches Conductor
		if s := conductorStatus(t, started.WorkflowID); s != "RUNNING" {
			t.Fatalf("Conductor's workflow %s after the kill, want RUNNING: the cancel was not cut short", s)
		}

		p2 := start()
		v := waitTerminal(t, p2, started.RunID, 90*time.Second)
		if v.Status != statestore.RunStatusCancelled {
			t.Fatalf("run ended %s after the restart, want CANCELLED", v.Status)
		}
		sidecartest.WaitFor(t, "Conductor to terminate the workflow", 30*time.Second, func() bool {
			return conductorStatus(t, started.WorkflowID) == "TERMINATED"
		})
		evs := allEvents(t, p2, started.RunID)
		var req struct{ RequestedBy string }
		_ = json.Unmarshal(requested[at].Payload, &req)
		last := evs[len(evs)-1]
		if last.EventType != statestore.RunCancelled || req.RequestedBy == "" ||
			len(storetest.RequestedBy([]statestore.RunEventRecord{last}, req.RequestedBy)) != 1 {
			t.Fatalf("log %v ends with %s %s, want RunCancelled requested by %q", types(evs), last.EventType, last.Payload, req.RequestedBy)
		}
		for _, e := range evs[at+1:] {
			if e.EventType == statestore.StepStarted || e.EventType == statestore.StepCompleted {
				t.Fatalf("log %v: %s %s after the cancel was requested", types(evs), e.EventType, e.StepID)
			}
		}
		time.Sleep(time.Until(killedAt.Add(10 * time.Second))) // past the step's own end
		if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("step long ran to its end (%v) although the run was cancelled", err)
		}
	})
}
