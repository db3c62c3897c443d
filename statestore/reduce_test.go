package statestore_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// logBuilder makes records of one run with contiguous runSeqs.
type logBuilder struct {
	runID string
	seq   int64
	at    time.Time
	recs  []statestore.RunEventRecord
}

func newLog(runID string) *logBuilder {
	return &logBuilder{runID: runID, at: time.Date(2026, 2, 11, 10, 0, 0, 0, time.UTC)}
}

func (b *logBuilder) add(eventType, stepID string, attempt int64, payload any) *logBuilder {
	w := storetest.EventAt(b.runID, eventType, stepID, attempt)
	if payload != nil {
		storetest.WithPayload(w, payload)
	}
	b.seq++
	b.at = b.at.Add(time.Second)
	b.recs = append(b.recs, statestore.RunEventRecord{RunEventWrite: *w, RunSeq: b.seq, PersistedAt: b.at.Format(time.RFC3339Nano)})
	return b
}

func (b *logBuilder) ev(eventType string) *logBuilder { return b.add(eventType, "", 1, nil) }

func (b *logBuilder) step(eventType, stepID string) *logBuilder {
	return b.add(eventType, stepID, 1, nil)
}

func reduce(t *testing.T, recs []statestore.RunEventRecord) (*statestore.RunSnapshot, []statestore.InvalidTransitionAlert) {
	t.Helper()
	s, alerts := statestore.Reduce(nil, recs)
	if s == nil {
		t.Fatal("no snapshot")
	}
	return s, alerts
}

// runSetups reaches each run status. PAUSED has one step in flight (DRAINING).
var runSetups = map[string]func() *logBuilder{
	"PENDING":  func() *logBuilder { return newLog("r").ev("RunAnnotated") },
	"QUEUED":   func() *logBuilder { return newLog("r").ev(statestore.RunQueued) },
	"APPROVED": func() *logBuilder { return newLog("r").ev(statestore.RunApproved) },
	"RUNNING":  func() *logBuilder { return newLog("r").ev(statestore.RunStarted) },
	"PAUSED": func() *logBuilder {
		return newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").ev(statestore.RunPaused)
	},
	"COMPLETED": func() *logBuilder { return newLog("r").ev(statestore.RunStarted).ev(statestore.RunCompleted) },
	"FAILED":    func() *logBuilder { return newLog("r").ev(statestore.RunStarted).ev(statestore.RunFailed) },
	"CANCELLED": func() *logBuilder { return newLog("r").ev(statestore.RunStarted).ev(statestore.RunCancelled) },
	"RUNNING+cancelRequested": func() *logBuilder {
		return newLog("r").ev(statestore.RunStarted).ev(statestore.RunCancelRequested)
	},
}

const (
	inv   = "INVALID"
	audit = "AUDIT"
)

func TestDecide_RunTransitions(t *testing.T) {
	// Written out by hand from Run Events Contract v2.0.1 §5.1, Execution
	// Semantics Contract v1.1 §1.2 and docs/events.md: the status after the event,
	// INVALID (Policy A) or AUDIT (kept, no effect).
	want := map[string]map[string]string{
		"PENDING": {"RunQueued": "QUEUED", "RunApproved": "APPROVED", "RunStarted": "RUNNING", "RunPaused": inv, "RunResumed": inv,
			"RunCompleted": inv, "RunFailed": inv, "RunCancelled": "CANCELLED", "RunCancelRequested": "PENDING", "RunDrainCompleted": inv, "RunDrainTimedOut": inv, "RunStepRetryRequested": inv},
		"QUEUED": {"RunQueued": inv, "RunApproved": "APPROVED", "RunStarted": "RUNNING", "RunPaused": inv, "RunResumed": inv,
			"RunCompleted": inv, "RunFailed": inv, "RunCancelled": "CANCELLED", "RunCancelRequested": "QUEUED", "RunDrainCompleted": inv, "RunDrainTimedOut": inv, "RunStepRetryRequested": inv},
		"APPROVED": {"RunQueued": inv, "RunApproved": inv, "RunStarted": "RUNNING", "RunPaused": inv, "RunResumed": inv,
			"RunCompleted": inv, "RunFailed": inv, "RunCancelled": "CANCELLED", "RunCancelRequested": "APPROVED", "RunDrainCompleted": inv, "RunDrainTimedOut": inv, "RunStepRetryRequested": inv},
		"RUNNING": {"RunQueued": inv, "RunApproved": inv, "RunStarted": inv, "RunPaused": "PAUSED", "RunResumed": inv,
			"RunCompleted": "COMPLETED", "RunFailed": "FAILED", "RunCancelled": "CANCELLED", "RunCancelRequested": "RUNNING", "RunDrainCompleted": inv, "RunDrainTimedOut": inv, "RunStepRetryRequested": inv},
		"PAUSED": {"RunQueued": inv, "RunApproved": inv, "RunStarted": inv, "RunPaused": inv, "RunResumed": "RUNNING",
			"RunCompleted": inv, "RunFailed": "FAILED", "RunCancelled": "CANCELLED", "RunCancelRequested": "PAUSED", "RunDrainCompleted": "PAUSED", "RunDrainTimedOut": "PAUSED", "RunStepRetryRequested": "PAUSED"},
		"COMPLETED": {"RunQueued": inv, "RunApproved": inv, "RunStarted": inv, "RunPaused": inv, "RunResumed": inv,
			"RunCompleted": inv, "RunFailed": inv, "RunCancelled": inv, "RunCancelRequested": inv, "RunDrainCompleted": inv, "RunDrainTimedOut": inv, "RunStepRetryRequested": inv},
		"FAILED": {"RunQueued": inv, "RunApproved": inv, "RunStarted": inv, "RunPaused": inv, "RunResumed": inv,
			"RunCompleted": inv, "RunFailed": inv, "RunCancelled": inv, "RunCancelRequested": inv, "RunDrainCompleted": inv, "RunDrainTimedOut": inv, "RunStepRetryRequested": inv},
		"CANCELLED": {"RunQueued": inv, "RunApproved": inv, "RunStarted": inv, "RunPaused": inv, "RunResumed": inv,
			"RunCompleted": audit, "RunFailed": audit, "RunCancelled": inv, "RunCancelRequested": inv, "RunDrainCompleted": inv, "RunDrainTimedOut": inv, "RunStepRetryRequested": inv},
		"RUNNING+cancelRequested": {"RunQueued": inv, "RunApproved": inv, "RunStarted": inv, "RunPaused": "PAUSED", "RunResumed": inv,
			"RunCompleted": audit, "RunFailed": audit, "RunCancelled": "CANCELLED", "RunCancelRequested": "RUNNING", "RunDrainCompleted": inv, "RunDrainTimedOut": inv, "RunStepRetryRequested": inv},
	}
	for from, row := range want {
		for event, to := range row {
			t.Run(from+"/"+event, func(t *testing.T) {
				b := runSetups[from]()
				before, _ := reduce(t, b.recs)
				var payload any
				switch event {
				case statestore.RunDrainTimedOut:
					payload = map[string]any{"code": "PAUSE_DRAIN_TIMEOUT"}
				case statestore.RunStepRetryRequested:
					payload = map[string]any{"stepId": "a", "stepLogicalAttemptId": 2}
				}
				b.add(event, "", 1, payload) // pause cycle 1: the one PAUSED opened
				got, alerts := statestore.Reduce(before, b.recs[len(b.recs)-1:])
				switch to {
				case inv:
					if len(alerts) != 1 || !got.Inconsistent || got.Status != before.Status {
						t.Fatalf("want INVALID: got status %s→%s inconsistent=%v alerts=%d", before.Status, got.Status, got.Inconsistent, len(alerts))
					}
				case audit:
					if len(alerts) != 0 || got.Inconsistent || got.Status != before.Status || got.SupersededEvents != before.SupersededEvents+1 {
						t.Fatalf("want AUDIT: got status %s→%s inconsistent=%v alerts=%d superseded=%d", before.Status, got.Status, got.Inconsistent, len(alerts), got.SupersededEvents)
					}
				default:
					if len(alerts) != 0 || got.Inconsistent || got.Status != to {
						t.Fatalf("got status %s inconsistent=%v alerts=%v, want %s", got.Status, got.Inconsistent, alerts, to)
					}
				}
				if got.LastEventSeq != b.seq {
					t.Fatalf("watermark %d, want %d", got.LastEventSeq, b.seq)
				}
				// Decide agrees with the projector (Layer 1/2 use the same rules).
				w := b.recs[len(b.recs)-1].RunEventWrite
				if err := statestore.CheckTransition(before, &w); (err != nil) != (to == inv) {
					t.Fatalf("CheckTransition: %v, want invalid=%v", err, to == inv)
				}
			})
		}
	}
}

func TestDecide_StepTransitions(t *testing.T) {
	setups := map[string]func(b *logBuilder){
		"PENDING": func(b *logBuilder) {},
		"RUNNING": func(b *logBuilder) { b.step(statestore.StepStarted, "s") },
		"SUCCESS": func(b *logBuilder) { b.step(statestore.StepStarted, "s").step(statestore.StepCompleted, "s") },
		"FAILED":  func(b *logBuilder) { b.step(statestore.StepStarted, "s").step(statestore.StepFailed, "s") },
		"SKIPPED": func(b *logBuilder) { b.step(statestore.StepSkipped, "s") },
	}
	want := map[string]map[string]string{
		"PENDING": {"StepStarted": "RUNNING", "StepCompleted": inv, "StepFailed": inv, "StepSkipped": "SKIPPED"},
		"RUNNING": {"StepStarted": inv, "StepCompleted": "SUCCESS", "StepFailed": "FAILED", "StepSkipped": inv},
		"SUCCESS": {"StepStarted": inv, "StepCompleted": inv, "StepFailed": inv, "StepSkipped": inv},
		"FAILED":  {"StepStarted": inv, "StepCompleted": inv, "StepFailed": inv, "StepSkipped": inv},
		"SKIPPED": {"StepStarted": inv, "StepCompleted": inv, "StepFailed": inv, "StepSkipped": inv},
	}
	for from, row := range want {
		for event, to := range row {
			t.Run(from+"/"+event, func(t *testing.T) {
				b := newLog("r").ev(statestore.RunStarted)
				setups[from](b)
				before, _ := reduce(t, b.recs)
				b.step(event, "s")
				got, alerts := statestore.Reduce(before, b.recs[len(b.recs)-1:])
				st := got.Step("s")
				prior := statestore.StepStatusPending
				if p := before.Step("s"); p != nil {
					prior = p.Status
				}
				if to == inv {
					if len(alerts) != 1 || !got.Inconsistent || (st != nil && st.Status != prior) {
						t.Fatalf("want INVALID: alerts=%d inconsistent=%v step=%+v", len(alerts), got.Inconsistent, st)
					}
					if a := alerts[0]; a.Entity != "step" || a.PriorState != prior || a.AttemptedState != statestore.StepTransitions[event].To || a.StepID != "s" {
						t.Fatalf("alert: %+v", a)
					}
					return
				}
				if len(alerts) != 0 || st == nil || st.Status != to {
					t.Fatalf("got step %+v alerts %v, want %s", st, alerts, to)
				}
			})
		}
	}
}

func TestReduce_StepRulesAcrossRunStates(t *testing.T) {
	t.Run("StepStarted in a run not started is invalid", func(t *testing.T) {
		s, alerts := reduce(t, newLog("r").ev(statestore.RunQueued).step(statestore.StepStarted, "a").recs)
		if len(alerts) != 1 || s.Step("a") != nil {
			t.Fatalf("alerts=%d step=%+v", len(alerts), s.Step("a"))
		}
	})
	t.Run("StepStarted in a completed run is invalid", func(t *testing.T) {
		_, alerts := reduce(t, newLog("r").ev(statestore.RunStarted).ev(statestore.RunCompleted).step(statestore.StepStarted, "a").recs)
		if len(alerts) != 1 || alerts[0].PriorState != "run COMPLETED" {
			t.Fatalf("alerts=%+v", alerts)
		}
	})
	t.Run("StepStarted racing a pause is recorded", func(t *testing.T) {
		// (A StepStarted replayed from the outbox: its step runs, and the
		// drain, not ended yet, waits for it.)
		s, alerts := reduce(t, newLog("r").ev(statestore.RunStarted).ev(statestore.RunPaused).step(statestore.StepStarted, "a").recs)
		if len(alerts) != 0 || s.Step("a").Status != statestore.StepStatusRunning || s.Substatus != statestore.SubstatusDraining {
			t.Fatalf("alerts=%v step=%+v substatus=%q", alerts, s.Step("a"), s.Substatus)
		}
	})
	t.Run("in-flight steps finish after the run failed", func(t *testing.T) {
		s, alerts := reduce(t, newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").step(statestore.StepStarted, "b").
			step(statestore.StepFailed, "a").ev(statestore.RunFailed).step(statestore.StepCompleted, "b").recs)
		if len(alerts) != 0 || s.Status != statestore.RunStatusFailed || s.Step("b").Status != statestore.StepStatusSuccess || s.FailedSteps != 1 {
			t.Fatalf("alerts=%v status=%s b=%+v", alerts, s.Status, s.Step("b"))
		}
	})
	t.Run("in-flight steps finish after cancel", func(t *testing.T) {
		s, alerts := reduce(t, newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").ev(statestore.RunCancelled).step(statestore.StepCompleted, "a").recs)
		if len(alerts) != 0 || s.Status != statestore.RunStatusCancelled || s.Step("a").Status != statestore.StepStatusSuccess {
			t.Fatalf("alerts=%v status=%s", alerts, s.Status)
		}
	})
}

func TestReduce_LogicalAttempts(t *testing.T) {
	b := newLog("r").ev(statestore.RunStarted).
		add(statestore.StepStarted, "a", 1, nil).
		add(statestore.StepFailed, "a", 1, map[string]any{"error": map[string]any{"code": "EXIT_CODE", "message": "exit 1", "retryable": true}}).
		add(statestore.StepStarted, "a", 2, nil)
	s, alerts := reduce(t, b.recs)
	st := s.Step("a")
	if len(alerts) != 0 || st.LogicalAttemptID != 2 || st.Status != statestore.StepStatusRunning || st.Error != nil {
		t.Fatalf("attempt 2 must start fresh: %+v alerts %v", st, alerts)
	}
	// A late event of attempt 1 is audit only.
	b.add(statestore.StepCompleted, "a", 1, nil)
	s2, alerts := statestore.Reduce(s, b.recs[len(b.recs)-1:])
	if len(alerts) != 0 || s2.Inconsistent || s2.Step("a").Status != statestore.StepStatusRunning || s2.LastEventSeq != b.seq {
		t.Fatalf("late attempt-1 event changed state: %+v", s2.Step("a"))
	}
	b.add(statestore.StepCompleted, "a", 2, map[string]any{"artifacts": []any{map[string]any{"uri": "nats-os://a/out", "kind": "stdout", "sizeBytes": 3}}})
	s3, _ := statestore.Reduce(s2, b.recs[len(b.recs)-1:])
	if st := s3.Step("a"); st.Status != statestore.StepStatusSuccess || len(st.Artifacts) != 1 || s3.FailedSteps != 1 {
		t.Fatalf("attempt 2 completion: %+v failedSteps=%d", st, s3.FailedSteps)
	}
	// A third attempt may open straight after a lost attempt (no StepFailed).
	b.add(statestore.StepStarted, "b", 1, nil).add(statestore.StepStarted, "b", 2, nil)
	s4, alerts := statestore.Reduce(s3, b.recs[len(b.recs)-2:])
	if len(alerts) != 0 || s4.Step("b").LogicalAttemptID != 2 {
		t.Fatalf("step b: %+v %v", s4.Step("b"), alerts)
	}
}

func TestReduce_StepRetry(t *testing.T) {
	held := map[string]any{"error": map[string]any{"code": "EXIT_CODE", "message": "exit 1"}, "onStepFailure": "pause"}
	retry := func(step string, attempt int64) map[string]any {
		return map[string]any{"stepId": step, "stepLogicalAttemptId": attempt}
	}
	b := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").add(statestore.StepFailed, "a", 1, held).
		add(statestore.RunPaused, "", 1, map[string]any{"reason": "stepFailed", "stepId": "a"})
	s, _ := reduce(t, b.recs)
	if got := s.HeldSteps(); !reflect.DeepEqual(got, []string{"a"}) || s.Substatus != "" {
		t.Fatalf("held steps %v substatus %q, want [a] and no drain", got, s.Substatus)
	}
	// A second request with the same number is another operator's copy of
	// the first: the store deduplicates it; here the reducer sees one.
	b.add(statestore.RunStepRetryRequested, "", 1, retry("a", 2))
	s, alerts := reduce(t, b.recs)
	st := s.Step("a")
	if len(alerts) != 0 || st.Status != statestore.StepStatusPending || st.LogicalAttemptID != 2 || !st.RetryRequested || st.Held || s.StepRetries != 1 {
		t.Fatalf("after retry: step %+v retries %d alerts %v", st, s.StepRetries, alerts)
	}
	if len(s.HeldSteps()) != 0 {
		t.Fatalf("held steps after retry: %v", s.HeldSteps())
	}
	// Retry numbers must follow each other.
	skip := newLog("r").ev(statestore.RunStarted).ev(statestore.RunPaused).add(statestore.RunStepRetryRequested, "", 2, retry("a", 2))
	if _, alerts := reduce(t, skip.recs); len(alerts) != 1 {
		t.Fatalf("retry request 2 before 1: alerts %v, want one", alerts)
	}
	// A retry that does not fit the step (not failed) counts and changes no step.
	notFailed := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").ev(statestore.RunPaused).
		add(statestore.RunStepRetryRequested, "", 1, retry("a", 2))
	s2, _ := reduce(t, notFailed.recs)
	if st := s2.Step("a"); st.Status != statestore.StepStatusRunning || st.LogicalAttemptID != 1 || s2.StepRetries != 1 {
		t.Fatalf("retry of a running step changed it: %+v retries %d", st, s2.StepRetries)
	}
	// The retried attempt runs after the resume and completes.
	b.ev(statestore.RunResumed).add(statestore.StepStarted, "a", 2, nil).add(statestore.StepCompleted, "a", 2, nil)
	s, alerts = reduce(t, b.recs)
	if st := s.Step("a"); len(alerts) != 0 || st.Status != statestore.StepStatusSuccess || st.LogicalAttemptID != 2 || st.RetryRequested {
		t.Fatalf("after the retried attempt: %+v alerts %v", st, alerts)
	}
	// A failure under onStepFailure fail is not held.
	f := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").add(statestore.StepFailed, "a", 1,
		map[string]any{"error": map[string]any{"code": "X", "message": "y"}})
	if s, _ := reduce(t, f.recs); len(s.HeldSteps()) != 0 {
		t.Fatalf("held steps without the pause policy: %v", s.HeldSteps())
	}
}

func TestReduce_PolicyA(t *testing.T) {
	b := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").step(statestore.StepCompleted, "a").ev(statestore.RunCompleted)
	good, _ := reduce(t, b.recs)
	b.ev(statestore.RunPaused).step(statestore.StepFailed, "a")
	s, alerts := reduce(t, b.recs)
	if s.Status != statestore.RunStatusCompleted || s.Step("a").Status != statestore.StepStatusSuccess {
		t.Fatalf("invalid events changed state: status %s step %s", s.Status, s.Step("a").Status)
	}
	if !s.Inconsistent || len(s.InvalidEvents) != 2 || len(alerts) != 2 {
		t.Fatalf("inconsistent=%v invalid=%v alerts=%d", s.Inconsistent, s.InvalidEvents, len(alerts))
	}
	if s.LastEventSeq != b.seq || s.EventCount != good.EventCount+2 {
		t.Fatalf("watermark %d, want %d", s.LastEventSeq, b.seq)
	}
	// The alert carries every field of Run Events Contract v2.0.1 §5.4.
	r := b.recs[4]
	want := statestore.InvalidTransitionAlert{
		Code: "INVALID_TRANSITION", RunID: "r", TenantID: r.TenantID, ProjectID: r.ProjectID, EnvironmentID: r.EnvironmentID,
		EventID: r.EventID, EventType: "RunPaused", RunSeq: 5, PersistedAt: r.PersistedAt, Entity: "run",
		PriorState: "COMPLETED", AttemptedState: "PAUSED", ExpectedState: "RUNNING", Reason: "RunPaused is not allowed: the run is COMPLETED",
	}
	if alerts[0] != want {
		t.Fatalf("alert:\n got %+v\nwant %+v", alerts[0], want)
	}
	for _, f := range []string{"runId", "tenantId", "projectId", "environmentId", "eventId", "eventType", "runSeq", "persistedAt", "priorState", "attemptedState", "code"} {
		var m map[string]any
		_ = json.Unmarshal(mustJSON(t, alerts[0]), &m)
		if _, ok := m[f]; !ok {
			t.Errorf("alert JSON lacks %s", f)
		}
	}
}

func TestReduce_CancelWins(t *testing.T) {
	b := newLog("r").ev(statestore.RunStarted).ev(statestore.RunCancelRequested).ev(statestore.RunCompleted).ev(statestore.RunFailed)
	s, alerts := reduce(t, b.recs)
	if s.Status != statestore.RunStatusRunning || !s.CancelRequested || s.SupersededEvents != 2 || len(alerts) != 0 {
		t.Fatalf("status %s cancelRequested %v superseded %d alerts %v", s.Status, s.CancelRequested, s.SupersededEvents, alerts)
	}
	b.ev(statestore.RunCancelled)
	s, _ = reduce(t, b.recs)
	if s.Status != statestore.RunStatusCancelled || s.CompletedAt == "" {
		t.Fatalf("status %s", s.Status)
	}
	// Terminal: nothing changes it afterwards.
	b.add(statestore.RunPaused, "", 1, nil).add(statestore.RunResumed, "", 1, nil).add(statestore.RunStarted, "", 2, nil)
	s, _ = reduce(t, b.recs)
	if s.Status != statestore.RunStatusCancelled {
		t.Fatalf("terminal status changed to %s", s.Status)
	}
}

func TestReduce_DrainingSubstatus(t *testing.T) {
	b := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").step(statestore.StepStarted, "b").step(statestore.StepStarted, "c").
		add(statestore.RunPaused, "", 1, map[string]any{"reason": "maintenance", "requestedBy": "jane", "drainTimeoutSeconds": 300})
	s, _ := reduce(t, b.recs)
	if s.Status != statestore.RunStatusPaused || s.Substatus != statestore.SubstatusDraining || len(s.InFlight()) != 3 {
		t.Fatalf("status %s substatus %q inflight %v", s.Status, s.Substatus, s.InFlight())
	}
	if p := s.Pause; p.Cycle != 1 || p.Reason != "maintenance" || p.RequestedBy != "jane" || p.DrainTimeoutSeconds != 300 || p.PausedAt != b.recs[4].PersistedAt {
		t.Fatalf("pause: %+v", p)
	}
	b.step(statestore.StepCompleted, "a").step(statestore.StepCompleted, "b")
	s, _ = reduce(t, b.recs)
	if s.Substatus != statestore.SubstatusDraining || len(s.InFlight()) != 1 {
		t.Fatalf("substatus %q inflight %v", s.Substatus, s.InFlight())
	}
	b.step(statestore.StepCompleted, "c")
	s, _ = reduce(t, b.recs)
	if s.Substatus != "" || s.Status != statestore.RunStatusPaused {
		t.Fatalf("drained: status %s substatus %q", s.Status, s.Substatus)
	}
	b.add(statestore.RunDrainCompleted, "", 1, map[string]any{"waitedSeconds": 3})
	s, alerts := reduce(t, b.recs)
	if len(alerts) != 0 || s.Pause.DrainEndedAt == "" || s.Pause.DrainTimedOut {
		t.Fatalf("drain completed: %+v alerts %v", s.Pause, alerts)
	}
	// A second RunDrainCompleted (another replica) is audit only.
	b.add(statestore.RunDrainTimedOut, "", 1, map[string]any{"code": "PAUSE_DRAIN_TIMEOUT"})
	s, alerts = reduce(t, b.recs)
	if len(alerts) != 0 || s.Pause.DrainTimedOut {
		t.Fatalf("late drain timeout changed state: %+v", s.Pause)
	}
	b.add(statestore.RunResumed, "", 1, nil).add(statestore.RunPaused, "", 2, nil)
	s, alerts = reduce(t, b.recs)
	if len(alerts) != 0 || s.Pause.Cycle != 2 || s.Substatus != "" || s.Pause.DrainEndedAt != "" {
		t.Fatalf("cycle 2 with nothing in flight: %+v substatus %q alerts %v", s.Pause, s.Substatus, alerts)
	}
	// Every cycle's drain ends with an event, even with nothing in flight.
	b.add(statestore.RunDrainCompleted, "", 2, map[string]any{"waitedSeconds": 0})
	if s, alerts = reduce(t, b.recs); len(alerts) != 0 || s.Pause.DrainEndedAt == "" {
		t.Fatalf("cycle 2 drained: %+v alerts %v", s.Pause, alerts)
	}
	b.add(statestore.RunResumed, "", 1, nil)
	if _, alerts = reduce(t, b.recs); len(alerts) != 1 {
		t.Fatalf("RunResumed of cycle 1 while cycle 2 is open: alerts %v", alerts)
	}
}

func TestReduce_DrainTimeout(t *testing.T) {
	b := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").ev(statestore.RunPaused).
		add(statestore.RunDrainTimedOut, "", 1, map[string]any{"code": "PAUSE_DRAIN_TIMEOUT", "inFlightStepIds": []string{"a"}, "waitedSeconds": 300})
	s, alerts := reduce(t, b.recs)
	if len(alerts) != 0 || s.Substatus != "" || !s.Pause.DrainTimedOut || len(s.InFlight()) != 1 || s.Status != statestore.RunStatusPaused {
		t.Fatalf("timed out: substatus %q pause %+v inflight %v", s.Substatus, s.Pause, s.InFlight())
	}
	// The orphaned step may finish later; it is recorded.
	b.step(statestore.StepCompleted, "a").add(statestore.RunResumed, "", 1, nil)
	s, alerts = reduce(t, b.recs)
	if len(alerts) != 0 || s.Step("a").Status != statestore.StepStatusSuccess || s.Status != statestore.RunStatusRunning {
		t.Fatalf("after timeout: %+v %v", s, alerts)
	}
}

func TestReduce_UnknownEventAdvancesWatermarkOnly(t *testing.T) {
	b := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a")
	before, _ := reduce(t, b.recs)
	b.add("StepDelayed", "", 1, map[string]any{"status": "COMPLETED"}).add("RunAnnotated", "", 7, nil)
	after, alerts := statestore.Reduce(before, b.recs[2:])
	if len(alerts) != 0 || after.LastEventSeq != 4 || after.EventCount != 4 {
		t.Fatalf("watermark %d count %d alerts %v", after.LastEventSeq, after.EventCount, alerts)
	}
	a, bb := *after, *before
	a.LastEventSeq, a.EventCount, bb.LastEventSeq, bb.EventCount = 0, 0, 0, 0
	if !reflect.DeepEqual(a, bb) {
		t.Fatalf("unknown events changed derived state:\n%+v\n%+v", a, bb)
	}
}

func TestReduce_PureAndIdempotent(t *testing.T) {
	b := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").
		add(statestore.StepCompleted, "a", 1, map[string]any{"artifacts": []any{map[string]any{"uri": "u", "kind": "k"}}}).
		step(statestore.StepStarted, "b")
	first, _ := reduce(t, b.recs[:2])
	snapJSON := string(mustJSON(t, first))
	recsJSON := string(mustJSON(t, b.recs))
	second, _ := statestore.Reduce(first, b.recs)
	if string(mustJSON(t, first)) != snapJSON || string(mustJSON(t, b.recs)) != recsJSON {
		t.Fatal("Reduce modified its input")
	}
	// Reprocessing from the watermark is idempotent.
	again, alerts := statestore.Reduce(second, b.recs)
	if again != second || alerts != nil {
		t.Fatal("re-reducing applied records changed the snapshot")
	}
	whole, _ := reduce(t, b.recs)
	if string(mustJSON(t, whole)) != string(mustJSON(t, second)) {
		t.Fatalf("incremental and whole reductions differ:\n%s\n%s", mustJSON(t, whole), mustJSON(t, second))
	}
	// Records of another run are ignored.
	other := newLog("other").ev(statestore.RunFailed)
	other.recs[0].RunSeq = 99
	if s, _ := statestore.Reduce(second, other.recs); s != second {
		t.Fatal("a record of another run was applied")
	}
}

func TestReduce_RunLifecycleFields(t *testing.T) {
	b := newLog("r").
		add(statestore.RunStarted, "", 1, map[string]any{"engineRunRef": "conductor://etl/42", "engineType": "conductor", "startedAt": "2026-02-11T10:00:00Z"}).
		step(statestore.StepStarted, "a").
		add(statestore.StepCompleted, "a", 1, map[string]any{"artifacts": []any{map[string]any{"uri": "nats-os://x/1", "kind": "stdout"}}}).
		add(statestore.StepSkipped, "b", 1, map[string]any{"reason": "condition false"}).
		ev(statestore.RunCompleted)
	s, _ := reduce(t, b.recs)
	if s.EngineRunRef != "conductor://etl/42" || s.EngineType != "conductor" || s.StartedAt != "2026-02-11T10:00:00Z" {
		t.Fatalf("RunStarted fields: %+v", s)
	}
	if s.Status != statestore.RunStatusCompleted || len(s.Artifacts) != 1 || s.TotalDurationMs != 5000 || s.Step("b").SkipReason != "condition false" {
		t.Fatalf("completion: %s artifacts %v duration %d", s.Status, s.Artifacts, s.TotalDurationMs)
	}
	f := newLog("f").ev(statestore.RunStarted).add(statestore.RunFailed, "", 1, map[string]any{"error": map[string]any{"code": "STEP_FAILED", "message": "a failed"}})
	s, _ = reduce(t, f.recs)
	if s.Error == nil || s.Error.Code != "STEP_FAILED" {
		t.Fatalf("RunFailed error: %+v", s.Error)
	}
}

func ExampleReduce() {
	recs := newLog("run-1").ev(statestore.RunStarted).step(statestore.StepStarted, "extract").ev(statestore.RunPaused).recs
	s, _ := statestore.Reduce(nil, recs)
	fmt.Println(s.Status, s.Substatus, s.InFlight())
	// Output: PAUSED DRAINING [extract]
}

// TestReduce_StepTries: a RUNNING step whose try ended without an outcome
// is idle, not in flight, and a drain does not wait for it; its next try
// makes it in flight again. The try events share one per-run counter.
func TestReduce_StepTries(t *testing.T) {
	ended := func(step string) map[string]any {
		return map[string]any{"stepId": step, "stepLogicalAttemptId": 1, "reason": "engineTryFailed"}
	}
	b := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").step(statestore.StepStarted, "b").
		add(statestore.RunPaused, "", 1, map[string]any{"drainTimeoutSeconds": 300})
	s, _ := reduce(t, b.recs)
	if s.Substatus != statestore.SubstatusDraining || len(s.InFlight()) != 2 {
		t.Fatalf("substatus %q inflight %v", s.Substatus, s.InFlight())
	}
	b.add(statestore.RunStepTryEnded, "", 1, ended("a"))
	s, alerts := reduce(t, b.recs)
	if len(alerts) != 0 || len(s.InFlight()) != 1 || s.InFlight()[0] != "b" || !s.Step("a").Idle || s.Step("a").Status != statestore.StepStatusRunning {
		t.Fatalf("after a's try ended: inflight %v step a %+v alerts %v", s.InFlight(), s.Step("a"), alerts)
	}
	b.add(statestore.RunStepTryEnded, "", 2, map[string]any{"stepId": "b", "stepLogicalAttemptId": 1, "reason": "workerRestarted"})
	s, alerts = reduce(t, b.recs)
	if len(alerts) != 0 || s.Substatus != "" || len(s.InFlight()) != 0 || s.StepTryEvents != 2 {
		t.Fatalf("nothing runs: substatus %q inflight %v tries %d alerts %v", s.Substatus, s.InFlight(), s.StepTryEvents, alerts)
	}
	// A try cannot start while the run is paused (the gate's fence).
	bad := *b
	bad.recs = append([]statestore.RunEventRecord(nil), b.recs...)
	bad.add(statestore.RunStepTryStarted, "", 3, map[string]any{"stepId": "a", "stepLogicalAttemptId": 1})
	if _, alerts := reduce(t, bad.recs); len(alerts) != 1 {
		t.Fatalf("RunStepTryStarted in a paused run: %d alerts, want 1", len(alerts))
	}
	b.add(statestore.RunResumed, "", 1, nil).add(statestore.RunStepTryStarted, "", 3, map[string]any{"stepId": "a", "stepLogicalAttemptId": 1})
	s, alerts = reduce(t, b.recs)
	if len(alerts) != 0 || s.Step("a").Idle || len(s.InFlight()) != 1 {
		t.Fatalf("a's next try: step a %+v inflight %v alerts %v", s.Step("a"), s.InFlight(), alerts)
	}
	// The counter is per run: a number out of order is an invalid transition.
	b.add(statestore.RunStepTryEnded, "", 3, ended("a"))
	if _, alerts = reduce(t, b.recs); len(alerts) != 1 {
		t.Fatalf("repeated try event number: %d alerts, want 1", len(alerts))
	}
	b.step(statestore.StepCompleted, "a")
	if s, _ = reduce(t, b.recs); s.Step("a").Status != statestore.StepStatusSuccess || s.Step("a").Idle {
		t.Fatalf("a completed: %+v", s.Step("a"))
	}
}

// TestReduce_StepTriesByEngineAttempt: try events that name their engine
// attempt move the step's current try. The engine's next try can start
// before anyone recorded that the previous one ended (Conductor timed it
// out); the late end of that earlier try then changes nothing, and the
// step stays in flight for the try that runs. An end without an engine
// attempt (records written before it was said) ends the current try.
func TestReduce_StepTriesByEngineAttempt(t *testing.T) {
	try := func(step string, engine int) map[string]any {
		return map[string]any{"stepId": step, "stepLogicalAttemptId": 1, "engineAttemptId": engine}
	}
	end := func(step string, engine int) map[string]any {
		p := map[string]any{"stepId": step, "stepLogicalAttemptId": 1, "reason": "taskTimedOut"}
		if engine > 0 {
			p["engineAttemptId"] = engine
		}
		return p
	}
	b := newLog("r").ev(statestore.RunStarted).step(statestore.StepStarted, "a").
		add(statestore.RunStepTryStarted, "", 1, try("a", 2))
	s, alerts := reduce(t, b.recs)
	if st := s.Step("a"); len(alerts) != 0 || st.Idle || st.EngineAttemptID != 2 {
		t.Fatalf("the engine's next try started: step %+v alerts %v", st, alerts)
	}
	b.add(statestore.RunStepTryEnded, "", 2, end("a", 1))
	s, alerts = reduce(t, b.recs)
	if st := s.Step("a"); len(alerts) != 0 || st.Idle || st.EngineAttemptID != 2 || len(s.InFlight()) != 1 {
		t.Fatalf("the earlier try's late end: step %+v inflight %v alerts %v, want try 2 still in flight", st, s.InFlight(), alerts)
	}
	b.add(statestore.RunStepTryEnded, "", 3, end("a", 2))
	if s, _ = reduce(t, b.recs); !s.Step("a").Idle || len(s.InFlight()) != 0 {
		t.Fatalf("the current try's end: step %+v inflight %v, want idle", s.Step("a"), s.InFlight())
	}
	b.add(statestore.RunStepTryStarted, "", 4, try("a", 3)).add(statestore.RunStepTryEnded, "", 5, end("a", 0))
	if s, _ = reduce(t, b.recs); !s.Step("a").Idle || s.Step("a").EngineAttemptID != 3 {
		t.Fatalf("an end that names no engine attempt: step %+v, want the current try (3) ended", s.Step("a"))
	}
}

// TestReduce_PausedSeconds: the time between each RunPaused and the event
// that ended the pause (RunResumed, or a terminal event of a paused run)
// adds up in pausedSeconds; an open pause adds nothing yet, and a refused
// RunResumed ends none (paused time is kept apart from run time).
func TestReduce_PausedSeconds(t *testing.T) {
	b := newLog("r").ev(statestore.RunStarted).ev(statestore.RunPaused) // events 1 s apart
	if s, _ := reduce(t, b.recs); s.PausedSeconds != 0 {
		t.Fatalf("open pause: pausedSeconds %v, want 0", s.PausedSeconds)
	}
	b.add(statestore.RunDrainCompleted, "", 1, nil).add(statestore.RunResumed, "", 1, nil)
	if s, _ := reduce(t, b.recs); s.PausedSeconds != 2 {
		t.Fatalf("after a 2 s pause: pausedSeconds %v", s.PausedSeconds)
	}
	b.add(statestore.RunResumed, "", 1, nil) // refused: the run is RUNNING
	if s, alerts := reduce(t, b.recs); s.PausedSeconds != 2 || len(alerts) != 1 {
		t.Fatalf("a refused RunResumed: pausedSeconds %v, alerts %d", s.PausedSeconds, len(alerts))
	}
	b.add(statestore.RunPaused, "", 2, nil).add(statestore.RunDrainCompleted, "", 2, nil).add(statestore.RunCancelled, "", 1, nil)
	s, _ := reduce(t, b.recs)
	if s.PausedSeconds != 4 || s.Status != statestore.RunStatusCancelled {
		t.Fatalf("cancelled while paused 2 s more: pausedSeconds %v, status %s", s.PausedSeconds, s.Status)
	}
	if s.TotalDurationMs != 7000 {
		t.Fatalf("totalDurationMs %d, want 7000 (paused time included)", s.TotalDurationMs)
	}
}

// TestReduce_RunEventsLeaveNoRoomForSteps: a snapshot that only run-level
// events changed (a pause, its drain's end, a resume) has no room in its
// steps for steps those events cannot add, since the projector and the run
// list's follower keep such snapshots of every paused run; a step event
// still gets room for the step it may add, and the snapshots are the same.
func TestReduce_RunEventsLeaveNoRoomForSteps(t *testing.T) {
	for _, steps := range []int{0, 1, 3} {
		b := newLog("r").ev(statestore.RunStarted)
		for i := range steps {
			b.step(statestore.StepStarted, fmt.Sprintf("s%d", i))
		}
		prev, _ := reduce(t, b.recs)
		n := len(b.recs)
		b.ev(statestore.RunPaused).ev(statestore.RunDrainCompleted)
		for _, recs := range [][]statestore.RunEventRecord{b.recs[n : n+1], b.recs[n:]} {
			next, _ := statestore.Reduce(prev, recs)
			if len(next.Steps) != steps || next.Steps == nil {
				t.Fatalf("%d steps: %d after %d run events", steps, len(next.Steps), len(recs))
			}
			if c := cap(next.Steps); c != steps {
				t.Errorf("%d steps, %d run events: the snapshot's steps have room for %d, want %d (no step to add)", steps, len(recs), c, steps)
			}
			whole, _ := reduce(t, b.recs[:n+len(recs)])
			if !reflect.DeepEqual(next, whole) {
				t.Fatalf("%d steps: reduced in two batches\n%+v\nfrom scratch\n%+v", steps, next, whole)
			}
		}
		b.step(statestore.StepStarted, "late")
		next, _ := statestore.Reduce(prev, b.recs[n:])
		if len(next.Steps) != steps+1 {
			t.Fatalf("%d steps: %d after a StepStarted", steps, len(next.Steps))
		}
	}
}
