package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

func TestTerminalEvent(t *testing.T) {
	rec := &Run{RunID: "0b7c1c36-2d7a-4c53-9d6e-6f1f5f2d8d4e", TenantID: "t", ProjectID: "p", EnvironmentID: "e",
		PlanID: "plan", PlanVersion: "1", WorkflowName: "wf", WorkflowID: "w"}
	tests := []struct {
		status          string
		reason          string
		cancelRequested bool
		eventType       string
		code            string
		message         string
		label           string
	}{
		{"COMPLETED", "", false, statestore.RunCompleted, "", "", "COMPLETED"},
		{"COMPLETED", "", true, statestore.RunCancelled, "", "", "CANCELLED"},
		{"FAILED", "Task x failed", true, statestore.RunCancelled, "", "", "CANCELLED"},
		{"TIMED_OUT", "Workflow timed out", true, statestore.RunCancelled, "", "", "CANCELLED"},
		{"LOST", "gone", true, statestore.RunCancelled, "", "", "CANCELLED"},
		{"FAILED", "Task x failed", false, statestore.RunFailed, CodeWorkflowFailed, "Task x failed", "FAILED"},
		{"FAILED", "", false, statestore.RunFailed, CodeWorkflowFailed, "workflow FAILED in Conductor", "FAILED"},
		{"TIMED_OUT", "Workflow timed out", false, statestore.RunFailed, CodeWorkflowTimedOut, "Workflow timed out", "TIMED_OUT"},
		{"TERMINATED", "by hand", false, statestore.RunFailed, CodeWorkflowTerminated, "by hand", "TERMINATED"},
		{"TERMINATED", "cancelled by op", true, statestore.RunCancelled, "", "", "CANCELLED"},
		{"LOST", "gone", false, statestore.RunFailed, CodeWorkflowNotFound, "gone", "LOST"},
	}
	for _, tt := range tests {
		ev, label, err := terminalEvent(rec, tt.status, tt.reason, &statestore.RunSnapshot{CancelRequested: tt.cancelRequested}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ev.EventType != tt.eventType || label != tt.label {
			t.Errorf("%s cancel=%v: got %s (%s), want %s (%s)", tt.status, tt.cancelRequested, ev.EventType, label, tt.eventType, tt.label)
		}
		var p struct {
			Error  *statestore.StepError `json:"error"`
			Reason string                `json:"reason"`
		}
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			t.Fatal(err)
		}
		if tt.code != "" && (p.Error == nil || p.Error.Code != tt.code || p.Error.Message != tt.message) {
			t.Errorf("%s: payload error %+v, want code %s message %q", tt.status, p.Error, tt.code, tt.message)
		}
		if ev.EventType == statestore.RunCancelled && p.Reason != tt.reason {
			t.Errorf("%s: reason %q, want %q", tt.status, p.Reason, tt.reason)
		}
		ev.EventID = "9b2f1b8e-4a8e-4c8b-9a57-1c7c7f0e2d11"
		if err := statestore.ValidateWrite(ev); err != nil {
			t.Errorf("%s: invalid event: %v", tt.status, err)
		}
	}
}

// pollTask polls a task type in a task domain until it hands out a task.
func pollTask(t *testing.T, c *Client, taskType, domain string) model.Task {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		tasks, err := c.BatchPollDomain(context.Background(), taskType, "watcher-test", domain, 1, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(tasks) == 1 {
			return tasks[0]
		}
	}
	t.Fatalf("no task of type %s within 10s", taskType)
	return model.Task{}
}

// waitFinal waits until the run is FINAL in the registry and gone from
// the active index, and returns its event log. The watcher marks the run
// FINAL and then deletes its active entry: two writes a reader may see
// apart. Nothing answers "is this run active" from the index (the run list
// and the run cache do, from the log and the FINAL entry); the index is
// the watcher's work list, and a FINAL run found in it is dropped on the
// next visit. So the test waits for the end state, not for the moment
// between the writes.
func waitFinal(t *testing.T, env *natsEnv, r *Runs, runID string) []statestore.RunEventRecord {
	t.Helper()
	const wait = 2 * time.Minute // a safety net: the runs end through Nudge
	deadline := time.Now().Add(wait)
	for {
		rec, err := r.Run(context.Background(), runID)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State == RunStateFinal {
			keys, err := r.listKeys(context.Background(), keyActive+runID)
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) == 0 {
				return env.events(t, runID)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %s (want FINAL and out of the active index) after %s", runID, rec.State, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lastEvent(t *testing.T, recs []statestore.RunEventRecord) statestore.RunEventRecord {
	t.Helper()
	if len(recs) == 0 {
		t.Fatal("no events")
	}
	return recs[len(recs)-1]
}

func TestWatcher_Terminal(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, u, RunsOptions{})
	// A long interval: the runs end through Nudge, not through the ticker.
	pauses, _ := env.pauses(t, r, env.store, 0)
	w := NewWatcher(r, env.store, WatcherOptions{Interval: time.Hour, Pauses: pauses, Logger: zaptest.NewLogger(t)})
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	start := func(t *testing.T) (*plan.Compiled, Run) {
		t.Helper()
		p := testPlan(t)
		res, err := r.StartRun(ctx, request(p, "req"))
		if err != nil {
			t.Fatal(err)
		}
		return p, res.Run
	}
	complete := func(t *testing.T, p *plan.Compiled, run Run, status model.TaskResultStatus, reason string, nudge bool) {
		t.Helper()
		// The task is only handed out in the run's task domain.
		if other, err := r.Client().BatchPollDomain(ctx, plan.TaskTypeNoop, "watcher-test", "other-"+suffix(t), 1, 0); err != nil || len(other) != 0 {
			t.Fatalf("poll in another domain: %d tasks, %v", len(other), err)
		}
		task := pollTask(t, r.Client(), plan.TaskTypeNoop, run.TaskDomain)
		if task.WorkflowInstanceId != run.WorkflowID || task.Domain != run.TaskDomain {
			t.Fatalf("polled a task of workflow %s, want %s", task.WorkflowInstanceId, run.WorkflowID)
		}
		if err := r.Client().UpdateTask(ctx, &model.TaskResult{TaskId: task.TaskId, WorkflowInstanceId: run.WorkflowID,
			Status: status, ReasonForIncompletion: reason}); err != nil {
			t.Fatal(err)
		}
		if nudge {
			w.Nudge(run.RunID)
		}
	}

	t.Run("RunCompleted", func(t *testing.T) {
		p, run := start(t)
		w.Nudge(run.RunID) // still running: nothing happens
		complete(t, p, run, model.CompletedTask, "", true)
		recs := waitFinal(t, env, r, run.RunID)
		if ev := lastEvent(t, recs); ev.EventType != statestore.RunCompleted || len(recs) != 2 {
			t.Fatalf("events %d, last %s, want RunStarted, RunCompleted", len(recs), ev.EventType)
		}
		snap, err := env.store.ProjectSnapshot(ctx, run.RunID)
		if err != nil || snap.Status != statestore.RunStatusCompleted {
			t.Fatalf("snapshot %v %v, want COMPLETED", snap, err)
		}
		if rec, _ := r.Run(ctx, run.RunID); rec.EngineStatus != "COMPLETED" {
			t.Fatalf("engine status %q", rec.EngineStatus)
		}
	})
	t.Run("RunFailed", func(t *testing.T) {
		p, run := start(t)
		complete(t, p, run, model.FailedTask, "disk full", true)
		ev := lastEvent(t, waitFinal(t, env, r, run.RunID))
		var payload struct{ Error statestore.StepError }
		if err := json.Unmarshal(ev.Payload, &payload); err != nil {
			t.Fatal(err)
		}
		if ev.EventType != statestore.RunFailed || payload.Error.Code != CodeWorkflowFailed {
			t.Fatalf("got %s %+v, want RunFailed WORKFLOW_FAILED", ev.EventType, payload.Error)
		}
		if want := "disk full"; !strings.Contains(payload.Error.Message, want) {
			t.Fatalf("message %q does not carry the task's reason %q", payload.Error.Message, want)
		}
	})
	t.Run("RunCancelled", func(t *testing.T) {
		_, run := start(t)
		cancelReq, err := runEvent(&run, statestore.RunCancelRequested, map[string]any{"reason": "operator", "requestedBy": "test"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.emitter.Emit(ctx, cancelReq); err != nil {
			t.Fatal(err)
		}
		if err := r.Client().Terminate(ctx, run.WorkflowID, "cancelled by test"); err != nil {
			t.Fatal(err)
		}
		w.Nudge(run.RunID)
		ev := lastEvent(t, waitFinal(t, env, r, run.RunID))
		if ev.EventType != statestore.RunCancelled || len(storetest.RequestedBy([]statestore.RunEventRecord{ev}, "test")) != 1 {
			t.Fatalf("got %s %s, want RunCancelled, requestedBy test (who requested the cancel)", ev.EventType, ev.Payload)
		}
		snap, err := env.store.ProjectSnapshot(ctx, run.RunID)
		if err != nil || snap.Status != statestore.RunStatusCancelled {
			t.Fatalf("snapshot %v %v, want CANCELLED", snap, err)
		}
	})
	// Cancel wins: whatever Conductor reports at the end of a run whose
	// cancel is requested (the cancel's terminate never reached it, and
	// the workflow completed or failed on its own), the run ends
	// CANCELLED, with Conductor's status in RunCancelled's payload.
	for _, tc := range []struct {
		name   string
		status model.TaskResultStatus
		engine string
	}{
		{"CancelRequested/Completed", model.CompletedTask, "COMPLETED"},
		{"CancelRequested/Failed", model.FailedWithTerminalErrorTask, "FAILED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, run := start(t)
			cancelReq, err := runEvent(&run, statestore.RunCancelRequested, map[string]any{"reason": "operator", "requestedBy": "test"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := env.emitter.Emit(ctx, cancelReq); err != nil {
				t.Fatal(err)
			}
			complete(t, p, run, tc.status, "ended on its own", true)
			recs := waitFinal(t, env, r, run.RunID)
			snap, err := env.store.ProjectSnapshot(ctx, run.RunID)
			if err != nil || snap.Status != statestore.RunStatusCancelled {
				t.Fatalf("log %s: status %v (%v), want CANCELLED: the cancel requested before Conductor's %s", strings.Join(eventTypes(recs), " "),
					snap.Status, err, tc.engine)
			}
			var cancelled struct{ EngineStatus, RequestedBy string }
			_ = json.Unmarshal(lastEvent(t, recs).Payload, &cancelled)
			if cancelled.EngineStatus != tc.engine || cancelled.RequestedBy != "test" {
				t.Fatalf("RunCancelled payload %s, want engineStatus %s, requestedBy test (who requested the cancel)", lastEvent(t, recs).Payload, tc.engine)
			}
		})
	}
	t.Run("RunFailed/Terminated", func(t *testing.T) {
		_, run := start(t)
		if err := r.Client().Terminate(ctx, run.WorkflowID, "killed by hand"); err != nil {
			t.Fatal(err)
		}
		w.Nudge(run.RunID)
		ev := lastEvent(t, waitFinal(t, env, r, run.RunID))
		var payload struct{ Error statestore.StepError }
		_ = json.Unmarshal(ev.Payload, &payload)
		if ev.EventType != statestore.RunFailed || payload.Error.Code != CodeWorkflowTerminated || payload.Error.Message != "killed by hand" {
			t.Fatalf("got %s %+v, want RunFailed WORKFLOW_TERMINATED 'killed by hand'", ev.EventType, payload.Error)
		}
	})
	t.Run("PauseRacedCompletion", func(t *testing.T) {
		// A pause reached the log after Conductor had already taken the
		// run's last task: the log says PAUSED, Conductor
		// COMPLETED. The watcher closes the pause itself (RunResumed,
		// requestedBy sidecar, the reason says why), then RunCompleted:
		// the run ends COMPLETED, the log is valid and nothing alerts.
		p, run := start(t)
		paused, err := runEvent(&run, statestore.RunPaused, map[string]any{"drainTimeoutSeconds": 300, "requestedBy": "test"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.emitter.Emit(ctx, paused); err != nil {
			t.Fatal(err)
		}
		complete(t, p, run, model.CompletedTask, "", true)
		recs := waitFinal(t, env, r, run.RunID)
		if got := strings.Join(eventTypes(recs), " "); got != "RunStarted RunPaused RunResumed RunCompleted" {
			t.Fatalf("log %s", got)
		}
		var resumed struct{ Reason, RequestedBy string }
		_ = json.Unmarshal(recs[2].Payload, &resumed)
		if resumed.RequestedBy != "sidecar" || !strings.Contains(resumed.Reason, "COMPLETED") {
			t.Fatalf("RunResumed payload %s: want requestedBy sidecar and a reason naming Conductor's COMPLETED", recs[2].Payload)
		}
		if _, alerts := statestore.Reduce(nil, recs); len(alerts) != 0 {
			t.Fatalf("the log raises %d alerts: %+v", len(alerts), alerts[0])
		}
		snap, err := env.store.ProjectSnapshot(ctx, run.RunID)
		if err != nil || snap.Status != statestore.RunStatusCompleted || snap.Inconsistent {
			t.Fatalf("snapshot %+v %v, want COMPLETED and consistent", snap, err)
		}
	})
	t.Run("Replicas", func(t *testing.T) {
		// Three other replicas race on the same ended run (the open
		// watcher is not nudged): one terminal event.
		p, run := start(t)
		complete(t, p, run, model.CompletedTask, "", false)
		waitStatus(t, r.Client(), run.WorkflowID, model.CompletedWorkflow)
		errs := make(chan error, 3)
		for range 3 {
			other := NewWatcher(env.newRuns(t, u, RunsOptions{}), env.store, WatcherOptions{})
			go func() { errs <- other.Scan(ctx) }()
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		recs := waitFinal(t, env, r, run.RunID)
		if n := countType(recs, statestore.RunCompleted); n != 1 {
			t.Fatalf("%d RunCompleted, want 1", n)
		}
	})
}

func TestWatcher_Scan(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, u, RunsOptions{})

	t.Run("MissingRunStarted", func(t *testing.T) {
		// A start that crashed after recording the workflow but before
		// appending RunStarted: the scan appends it.
		p := testPlan(t)
		if err := r.RegisterPlan(ctx, "tenant-a", p); err != nil {
			t.Fatal(err)
		}
		rec := crashedStart(t, r, request(p, "req"), true)
		_, rev, err := r.get(ctx, rec.RunID)
		if err != nil {
			t.Fatal(err)
		}
		rec.State, rec.StartedAt, rec.LeaseExpiresAt = RunStateStarted, time.Now().UTC(), time.Time{}
		if _, err := r.updateRun(ctx, rec, rev); err != nil {
			t.Fatal(err)
		}
		w := NewWatcher(r, env.store, WatcherOptions{})
		if err := w.Scan(ctx); err != nil {
			t.Fatal(err)
		}
		checkStarted(t, env, r, p, *rec)
	})
	t.Run("Lost", func(t *testing.T) {
		// The run's workflow is gone from Conductor (a restarted memory
		// store): after LostAfter scans the run fails WORKFLOW_NOT_FOUND.
		p := testPlan(t)
		res, err := r.StartRun(ctx, request(p, "req"))
		if err != nil {
			t.Fatal(err)
		}
		rec, rev, err := r.get(ctx, res.Run.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Client().Terminate(ctx, rec.WorkflowID, "cleanup"); err != nil {
			t.Fatal(err)
		}
		rec.WorkflowID = "00000000-0000-4000-8000-00000000dead"
		if _, err := r.updateRun(ctx, rec, rev); err != nil {
			t.Fatal(err)
		}
		w := NewWatcher(r, env.store, WatcherOptions{LostAfter: 2})
		for range 2 {
			if err := w.Check(ctx, rec.RunID); err != nil {
				t.Fatal(err)
			}
		}
		ev := lastEvent(t, waitFinal(t, env, r, rec.RunID))
		var payload struct{ Error statestore.StepError }
		_ = json.Unmarshal(ev.Payload, &payload)
		if ev.EventType != statestore.RunFailed || payload.Error.Code != CodeWorkflowNotFound {
			t.Fatalf("got %s %+v, want RunFailed WORKFLOW_NOT_FOUND", ev.EventType, payload.Error)
		}
	})
	t.Run("EngineDown", func(t *testing.T) {
		// Conductor unreachable: the check fails with ENGINE_UNAVAILABLE
		// and changes nothing.
		p := testPlan(t)
		res, err := r.StartRun(ctx, request(p, "req"))
		if err != nil {
			t.Fatal(err)
		}
		down := env.newRuns(t, unusedURL(t), RunsOptions{})
		w := NewWatcher(down, env.store, WatcherOptions{})
		if err := w.Check(ctx, res.Run.RunID); errcode.CodeOf(err) != CodeEngineUnavailable {
			t.Fatalf("got %v, want ENGINE_UNAVAILABLE", err)
		}
		if got, _ := r.Run(ctx, res.Run.RunID); got.State != RunStateStarted {
			t.Fatalf("state %s, want STARTED", got.State)
		}
		if err := r.Client().Terminate(ctx, res.Run.WorkflowID, "cleanup"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestWatcher_ScanReadsRunningLists checks that a scan costs Conductor one
// running-list call per plan version plus one read per run that is not on
// it, and still records the run whose workflow ended; a full scan (the
// safety net every ReconcileInterval) reads every run.
func TestWatcher_ScanReadsRunningLists(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t) // its own registry: only this test's runs are active
	reg := prometheus.NewRegistry()
	c, err := NewClient(ClientOptions{BaseURL: u, Timeout: 10 * time.Second, Logger: zaptest.NewLogger(t), Metrics: NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := OpenRuns(ctx, env.connect(t), c, env.emitter, RunsOptions{TaskDomain: env.domain, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	p := testPlan(t)
	var runs []StartResult
	for i := range 3 {
		res, err := r.StartRun(ctx, request(p, fmt.Sprintf("req-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, res)
		t.Cleanup(func() { _ = c.Terminate(context.Background(), res.Run.WorkflowID, "cleanup") })
	}
	if err := c.Terminate(ctx, runs[0].Run.WorkflowID, "ended outside the sidecar"); err != nil {
		t.Fatal(err)
	}
	calls := func(op string) float64 {
		return testutil.ToFloat64(c.metrics.requests[[2]string{op, resultOK}])
	}
	w := NewWatcher(r, env.store, WatcherOptions{})
	gets, lists := calls(opGetWorkflow), calls(opRunningWorkflows)
	if err := w.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if got := calls(opRunningWorkflows) - lists; got != 1 {
		t.Fatalf("%v running-list calls, want 1 (one plan version)", got)
	}
	if got := calls(opGetWorkflow) - gets; got != 1 {
		t.Fatalf("%v workflow reads, want 1 (the terminated run only)", got)
	}
	ev := lastEvent(t, waitFinal(t, env, r, runs[0].Run.RunID))
	if ev.EventType != statestore.RunFailed {
		t.Fatalf("terminated run: last event %s, want RunFailed", ev.EventType)
	}
	for _, res := range runs[1:] {
		if got, _ := r.Run(ctx, res.Run.RunID); got.State != RunStateStarted {
			t.Fatalf("running run %s: state %s, want STARTED", res.Run.RunID, got.State)
		}
	}
	gets = calls(opGetWorkflow)
	if err := w.scan(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got := calls(opGetWorkflow) - gets; got != 2 {
		t.Fatalf("full scan: %v workflow reads, want 2 (the two running runs)", got)
	}
}

func TestWatcher_OpenClose(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, u, RunsOptions{})
	w := NewWatcher(r, env.store, WatcherOptions{Interval: 50 * time.Millisecond, Logger: zaptest.NewLogger(t)})
	if err := w.Close(ctx); err != nil {
		t.Fatalf("close before open: %v", err)
	}
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Open(ctx); err == nil {
		t.Fatal("second Open succeeded")
	}
	// The ticker alone (no Nudge) finishes a completed run.
	p := testPlan(t)
	res, err := r.StartRun(ctx, request(p, "req"))
	if err != nil {
		t.Fatal(err)
	}
	task := pollTask(t, r.Client(), plan.TaskTypeNoop, res.Run.TaskDomain)
	if err := r.Client().UpdateTask(ctx, &model.TaskResult{TaskId: task.TaskId, WorkflowInstanceId: res.Run.WorkflowID,
		Status: model.CompletedTask}); err != nil {
		t.Fatal(err)
	}
	if ev := lastEvent(t, waitFinal(t, env, r, res.Run.RunID)); ev.EventType != statestore.RunCompleted {
		t.Fatalf("got %s, want RunCompleted", ev.EventType)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := w.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Open(ctx); err != nil { // reopen after close
		t.Fatal(err)
	}
	if err := w.Close(cctx); err != nil {
		t.Fatal(err)
	}
}

func eventTypes(recs []statestore.RunEventRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.EventType
	}
	return out
}

// TestWatcher_ConductorPauseAndResume: a pause and a resume made in
// Conductor's own API are recorded in the log (requestedBy conductor), and
// a pause or resume of the sidecar's that did not reach Conductor is
// applied to it, not mistaken for an action in Conductor.
func TestWatcher_ConductorPauseAndResume(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, u, RunsOptions{})
	pauses, ledger := env.pauses(t, r, env.store, 42*time.Second)
	w := NewWatcher(r, env.store, WatcherOptions{Interval: time.Hour, Pauses: pauses, Logger: zaptest.NewLogger(t)})
	p := testPlan(t)
	res, err := r.StartRun(ctx, request(p, "req"))
	if err != nil {
		t.Fatal(err)
	}
	run := res.Run
	t.Cleanup(func() { _ = r.Client().Terminate(context.Background(), run.WorkflowID, "test done") })
	check := func(want string) *statestore.RunSnapshot {
		t.Helper()
		if err := w.Check(ctx, run.RunID); err != nil {
			t.Fatal(err)
		}
		recs := env.events(t, run.RunID)
		if got := strings.Join(eventTypes(recs), " "); got != want {
			t.Fatalf("log %s, want %s", got, want)
		}
		snap, alerts := statestore.Reduce(nil, recs)
		if len(alerts) != 0 {
			t.Fatalf("alert %+v", alerts[0])
		}
		return snap
	}
	check("RunStarted")

	// Paused in Conductor: recorded as a pause of the next cycle.
	if err := r.Client().Pause(ctx, run.WorkflowID); err != nil {
		t.Fatal(err)
	}
	snap := check("RunStarted RunPaused")
	if snap.Status != statestore.RunStatusPaused || snap.Pause.RequestedBy != statestore.RequestedByConductor || snap.Pause.DrainTimeoutSeconds != 42 {
		t.Fatalf("pause %+v, want requestedBy conductor and the default drain timeout", snap.Pause)
	}
	check("RunStarted RunPaused") // in step: nothing more

	// Resumed in Conductor.
	if err := r.Client().Resume(ctx, run.WorkflowID); err != nil {
		t.Fatal(err)
	}
	snap = check("RunStarted RunPaused RunResumed")
	if snap.Status != statestore.RunStatusRunning {
		t.Fatalf("status %s after a resume in Conductor", snap.Status)
	}

	// The sidecar's own pause, recorded but not applied to Conductor (its
	// call failed): the watcher applies it, and records nothing.
	ev, err := runEvent(&run, statestore.RunPaused, map[string]any{"requestedBy": "ops"})
	if err != nil {
		t.Fatal(err)
	}
	ev.LogicalAttemptID = 2
	ev.IdempotencyKey = ev.KeyInput().Key()
	if _, err := env.emitter.Emit(ctx, ev); err != nil {
		t.Fatal(err)
	}
	check("RunStarted RunPaused RunResumed RunPaused")
	waitStatus(t, r.Client(), run.WorkflowID, model.PausedWorkflow)
	// The same for its resume.
	ev, _ = runEvent(&run, statestore.RunResumed, map[string]any{"requestedBy": "ops"})
	ev.LogicalAttemptID = 2
	ev.IdempotencyKey = ev.KeyInput().Key()
	if _, err := env.emitter.Emit(ctx, ev); err != nil {
		t.Fatal(err)
	}
	check("RunStarted RunPaused RunResumed RunPaused RunResumed")
	waitStatus(t, r.Client(), run.WorkflowID, model.RunningWorkflow)
	if paused, cycle, _ := ledger.EngineState(ctx, run.RunID); paused || cycle != 2 {
		t.Fatalf("ledger paused=%v cycle=%d, want resumed in cycle 2", paused, cycle)
	}
}

// forgetfulConductor is the real Conductor behind a proxy that, for one
// workflow, answers the workflow read with status RUNNING until a decide
// of it passes through: Conductor's lost decide (seen on a real server: all
// tasks COMPLETED, the workflow RUNNING for 7 minutes), which the real server
// cannot be made to show on demand. Every call still reaches the real
// server; only that one answer is rewritten.
type forgetfulConductor struct {
	target  *url.URL
	mu      sync.Mutex
	stuck   string // workflowId
	decided int
}

func (f *forgetfulConductor) forget(workflowID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stuck = workflowID
}

func (f *forgetfulConductor) decides() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.decided
}

func (f *forgetfulConductor) start(t *testing.T) string {
	t.Helper()
	proxy := conductortest.ReverseProxy(t, f.target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		f.mu.Lock()
		stuck := f.stuck
		f.mu.Unlock()
		req := resp.Request
		if stuck == "" || resp.StatusCode != http.StatusOK {
			return nil
		}
		if req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, "/workflow/decide/"+stuck) {
			f.mu.Lock()
			f.decided++
			f.stuck = ""
			f.mu.Unlock()
			return nil
		}
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/workflow/"+stuck) {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		var wf map[string]any
		if err := json.Unmarshal(body, &wf); err != nil {
			return err
		}
		wf["status"] = "RUNNING"
		out, _ := json.Marshal(wf)
		resp.Body = io.NopCloser(bytes.NewReader(out))
		resp.ContentLength = int64(len(out))
		resp.Header.Set("Content-Length", strconv.Itoa(len(out)))
		return nil
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return srv.URL + f.target.Path
}

// TestWatcher_DecidesAStuckWorkflow: a workflow Conductor leaves RUNNING
// with every task done is asked to decide after StuckAfter, counted, and
// then recorded as it ends: after the nudge of the worker that reported
// its last task, and without it (the nudge lost with its replica, or spent
// before the decide Conductor lost as it restarted): the scan finds it.
// The nudged case runs no scan: the watcher is not opened, and the test
// takes the loop's steps itself (the nudge's read, the suspects' check,
// the run's check), so that only the nudge can have found the workflow.
func TestWatcher_DecidesAStuckWorkflow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nudge bool
	}{{"Nudged", true}, {"NobodyNudged", false}} {
		t.Run(tc.name, func(t *testing.T) {
			u := conductortest.URL(t)
			target, err := url.Parse(u)
			if err != nil {
				t.Fatal(err)
			}
			fc := &forgetfulConductor{target: target}
			ctx := context.Background()
			env := newNATS(t)
			r := env.newRuns(t, fc.start(t), RunsOptions{})
			m := NewMetrics(prometheus.NewRegistry())
			w := NewWatcher(r, env.store, WatcherOptions{Interval: 50 * time.Millisecond, StuckAfter: 100 * time.Millisecond,
				Metrics: m, Logger: zaptest.NewLogger(t)})
			res, err := r.StartRun(ctx, request(testPlan(t), "req"))
			if err != nil {
				t.Fatal(err)
			}
			run := res.Run
			fc.forget(run.WorkflowID)
			task := pollTask(t, r.Client(), plan.TaskTypeNoop, run.TaskDomain)
			if err := r.Client().UpdateTask(ctx, &model.TaskResult{TaskId: task.TaskId, WorkflowInstanceId: run.WorkflowID, Status: model.CompletedTask}); err != nil {
				t.Fatal(err)
			}
			if tc.nudge {
				w.Nudge(run.RunID) // the worker's nudge after the last task
				if err := w.checkNudged(ctx); err != nil {
					t.Fatal(err)
				}
				time.Sleep(w.opts.StuckAfter)
				if err := w.checkSuspects(ctx); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(30 * time.Second)
				for {
					if err := w.Check(ctx, run.RunID); err != nil {
						t.Fatal(err)
					}
					if rec, err := r.Run(ctx, run.RunID); err == nil && rec.State == RunStateFinal {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("the decided workflow's end was never recorded")
					}
					time.Sleep(50 * time.Millisecond)
				}
			} else {
				if err := w.Open(ctx); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = w.Close(context.Background()) })
			}
			recs := waitFinal(t, env, r, run.RunID)
			if got := strings.Join(eventTypes(recs), " "); got != "RunStarted RunCompleted" {
				t.Fatalf("log %s", got)
			}
			if fc.decides() != 1 {
				t.Fatalf("%d decides reached Conductor, want 1", fc.decides())
			}
			if v := testutil.ToFloat64(m.actions[actionDecide]); v != 1 {
				t.Fatalf("decide counted %v times", v)
			}
		})
	}
}

// TestWatcher_ScanCostFollowsChange: with its run cache, a scan reads
// nothing from the run index per run and reads from Conductor only the
// runs its turn comes to (it used to make a KV get per active run every 2 s,
// and read every workflow every 30 s in one burst). A run that ends is
// still seen.
func TestWatcher_ScanCostFollowsChange(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	c, err := NewClient(ClientOptions{BaseURL: u, Timeout: 10 * time.Second, Logger: zaptest.NewLogger(t), Metrics: NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	js := env.connect(t)
	r, err := OpenRuns(ctx, js, c, env.emitter, RunsOptions{TaskDomain: env.domain, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	p := testPlan(t)
	const n = 20
	var runs []StartResult
	for i := range n {
		res, err := r.StartRun(ctx, request(p, fmt.Sprintf("req-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, res)
		t.Cleanup(func() { _ = c.Terminate(context.Background(), res.Run.WorkflowID, "cleanup") })
	}
	// A slow ticker: the test drives the scans itself.
	w := NewWatcher(r, env.store, WatcherOptions{Interval: time.Hour, ReconcileInterval: time.Hour, FullReadRate: 1, Logger: zaptest.NewLogger(t)})
	w.opts.Interval = time.Second // one run read in turn per scan
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	deadline := time.Now().Add(10 * time.Second)
	for !w.cache.ready() || len(w.cache.open()) != n {
		if time.Now().After(deadline) {
			t.Fatal("the run cache never held the runs")
		}
		time.Sleep(10 * time.Millisecond)
	}
	reads := func() float64 { return testutil.ToFloat64(c.metrics.requests[[2]string{opGetWorkflow, resultOK}]) }
	before, sent, began := reads(), js.Conn().Stats().OutMsgs, time.Now()
	const scans = 10
	for range scans {
		if err := w.Scan(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The watcher's own loop scans each Interval too: one more read in
	// turn per second the test's scans took (on a loaded machine, or a
	// Conductor slower to answer, they take more than one).
	ticks := int(time.Since(began) / w.opts.Interval)
	// A few messages are the connection's own (the watch's flow control,
	// the watcher's first reconcile); a read per run per scan would be 200.
	if got := js.Conn().Stats().OutMsgs - sent; got > n/2 {
		t.Fatalf("%d scans of %d runs sent %d messages to the run index, want none per run", scans, n, got)
	}
	// (The watcher's own first scan may still be reading its one run.)
	if got := reads() - before; got < scans || got > float64(scans+1+ticks) {
		t.Fatalf("%d scans of %d runs read %v workflows, want %d (one in turn per scan; the loop's own %d scans read up to %d more)", scans, n, got, scans, ticks, ticks+1)
	}
	// A run terminated in Conductor drops off its running list and ends.
	if err := c.Terminate(ctx, runs[3].Run.WorkflowID, "ended outside the sidecar"); err != nil {
		t.Fatal(err)
	}
	if err := w.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := lastEvent(t, waitFinal(t, env, r, runs[3].Run.RunID)); ev.EventType != statestore.RunFailed {
		t.Fatalf("terminated run: last event %s", ev.EventType)
	}
}

// TestWatcher_NudgeWorkflow: a status change Conductor notifies names the
// workflow, not the run. NudgeWorkflow finds the run of a workflow the
// watcher has not read yet (a run started after its last scan) and checks
// it at once: a pause made in Conductor is recorded long before the next
// scan. A workflow of no run is left alone.
func TestWatcher_NudgeWorkflow(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, u, RunsOptions{})
	pauses, _ := env.pauses(t, r, env.store, 42*time.Second)
	w := NewWatcher(r, env.store, WatcherOptions{Interval: time.Hour, ReconcileInterval: time.Hour, Pauses: pauses, Logger: zaptest.NewLogger(t)})
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	if w.NudgeWorkflow("no-such-workflow") {
		t.Fatal("NudgeWorkflow of a workflow of no run: true")
	}
	res, err := r.StartRun(ctx, request(testPlan(t), "req"))
	if err != nil {
		t.Fatal(err)
	}
	run := res.Run
	t.Cleanup(func() { _ = r.Client().Terminate(context.Background(), run.WorkflowID, "test done") })
	if err := r.Client().Pause(ctx, run.WorkflowID); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	for !w.NudgeWorkflow(run.WorkflowID) { // the run index reaches the watcher's cache
		if time.Since(began) > 5*time.Second {
			t.Fatal("NudgeWorkflow of a started run's workflow: false for 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		if got := strings.Join(eventTypes(env.events(t, run.RunID)), " "); got == "RunStarted RunPaused" {
			break
		} else if time.Since(began) > 10*time.Second {
			t.Fatalf("log %q 10 s after the nudge, want RunStarted RunPaused", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("pause in Conductor recorded %s after the nudge", time.Since(began).Round(time.Millisecond))
}
