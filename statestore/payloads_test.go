package statestore_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestPayload_SameBytesAsMaps: a typed payload is written byte for byte
// as the map[string]any the producers built for the same inputs (sorted
// keys, the same omissions), so eventIds registered and events appended
// before the payloads were typed are the same events. The maps are the
// producers' as they were (taskworkers, drain, adapter, admission).
func TestPayload_SameBytesAsMaps(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	f64 := func(v float64) *float64 { return &v }
	stepErr := &statestore.StepError{Code: "EXIT_CODE", Message: "exit 2 <stderr> & \"more\"", Retryable: true}
	arts := []statestore.ArtifactRef{{URI: "nats-os://artifacts/x", Kind: "stdout", SHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", SizeBytes: 12}}
	labels := map[string]string{"team": "ops", "app": "ünï"}
	cases := []struct {
		name  string
		typed statestore.Payload
		old   map[string]any
	}{
		{"RunQueued queue", statestore.RunQueuedPayload{Policy: "queue", Reason: "tenant t1 has 5 active runs", RequestedBy: "jane", Labels: labels},
			map[string]any{"policy": "queue", "reason": "tenant t1 has 5 active runs", "requestedBy": "jane", "labels": labels}},
		{"RunQueued delay", statestore.RunQueuedPayload{Policy: "delay", Reason: "over", NotBefore: "2026-02-11T10:30:00.5Z"},
			map[string]any{"policy": "delay", "reason": "over", "notBefore": "2026-02-11T10:30:00.5Z"}},
		{"RunQueued empty reason", statestore.RunQueuedPayload{Policy: "queue"}, map[string]any{"policy": "queue", "reason": ""}},
		{"RunApproved", statestore.RunApprovedPayload{}, nil},
		{"RunStarted", statestore.RunStartedPayload{EngineRunRef: "conductor://sidecar_p_v1/abc", EngineType: "conductor", StartedAt: "2026-02-11T10:30:00.123456789Z", Labels: labels},
			map[string]any{"engineRunRef": "conductor://sidecar_p_v1/abc", "engineType": "conductor", "startedAt": "2026-02-11T10:30:00.123456789Z", "labels": labels}},
		{"RunStarted no labels", statestore.RunStartedPayload{EngineRunRef: "conductor://w/1", EngineType: "conductor", StartedAt: "2026-02-11T10:30:00Z"},
			map[string]any{"engineRunRef": "conductor://w/1", "engineType": "conductor", "startedAt": "2026-02-11T10:30:00Z"}},
		{"StepStarted", statestore.StepStartedPayload{}, nil},
		{"StepCompleted", statestore.StepCompletedPayload{Artifacts: arts}, map[string]any{"artifacts": arts}},
		{"StepCompleted without artifacts", statestore.StepCompletedPayload{}, map[string]any{}},
		{"StepFailed", statestore.StepFailedPayload{Error: stepErr, Artifacts: arts}, map[string]any{"error": stepErr, "artifacts": arts}},
		{"StepFailed held", statestore.StepFailedPayload{Error: stepErr, OnStepFailure: statestore.OnStepFailurePause},
			map[string]any{"error": stepErr, "onStepFailure": statestore.OnStepFailurePause}},
		{"StepSkipped", statestore.StepSkippedPayload{Reason: "dependency failed"}, map[string]any{"reason": "dependency failed"}},
		{"RunPaused by an operator", statestore.RunPausedPayload{DrainTimeoutSeconds: i64(300), Reason: "maintenance <db>", RequestedBy: "jane",
			ResumeAt: "2026-02-11T11:00:00Z"},
			map[string]any{"drainTimeoutSeconds": int64(300), "reason": "maintenance <db>", "requestedBy": "jane", "resumeAt": "2026-02-11T11:00:00Z"}},
		{"RunPaused zero timeout", statestore.RunPausedPayload{DrainTimeoutSeconds: i64(0)}, map[string]any{"drainTimeoutSeconds": int64(0)}},
		{"RunPaused step failed", statestore.RunPausedPayload{DrainTimeoutSeconds: i64(60), Reason: "stepFailed", RequestedBy: statestore.RequestedByWorker("w1"), StepID: "b"},
			map[string]any{"drainTimeoutSeconds": int64(60), "reason": "stepFailed", "requestedBy": "sidecar w1", "stepId": "b"}},
		{"RunPaused in Conductor", statestore.RunPausedPayload{DrainTimeoutSeconds: i64(300), RequestedBy: statestore.RequestedByConductor, Reason: "paused in Conductor"},
			map[string]any{"requestedBy": "conductor", "reason": "paused in Conductor", "drainTimeoutSeconds": int64(300)}},
		{"RunResumed", statestore.RunResumedPayload{Reason: "done", RequestedBy: statestore.RequestedBySchedule},
			map[string]any{"reason": "done", "requestedBy": "schedule"}},
		{"RunResumed empty", statestore.RunResumedPayload{}, nil},
		{"RunCompleted", statestore.RunCompletedPayload{EngineStatus: "COMPLETED"}, map[string]any{"engineStatus": "COMPLETED"}},
		{"RunFailed", statestore.RunFailedPayload{EngineStatus: "FAILED", Error: &statestore.StepError{Code: "WORKFLOW_FAILED", Message: "workflow FAILED in Conductor"}},
			map[string]any{"engineStatus": "FAILED", "error": statestore.StepError{Code: "WORKFLOW_FAILED", Message: "workflow FAILED in Conductor"}}},
		{"RunCancelled", statestore.RunCancelledPayload{EngineStatus: "TERMINATED", Reason: "operator"},
			map[string]any{"engineStatus": "TERMINATED", "reason": "operator"}},
		{"RunCancelled while queued", statestore.RunCancelledPayload{Reason: "cancelled while queued"}, map[string]any{"reason": "cancelled while queued"}},
		{"RunCancelRequested", statestore.RunCancelRequestedPayload{Reason: "r", RequestedBy: "jane"}, map[string]any{"reason": "r", "requestedBy": "jane"}},
		{"RunDrainCompleted", statestore.RunDrainCompletedPayload{WaitedSeconds: f64(2.5)}, map[string]any{"waitedSeconds": 2.5}},
		{"RunDrainCompleted at once", statestore.RunDrainCompletedPayload{WaitedSeconds: f64(0)}, map[string]any{"waitedSeconds": float64(0)}},
		{"RunDrainTimedOut", statestore.RunDrainTimedOutPayload{Code: statestore.PauseDrainTimeoutCode, InFlightStepIDs: []string{"a", "b"}, WaitedSeconds: f64(300.000123)},
			map[string]any{"code": statestore.PauseDrainTimeoutCode, "inFlightStepIds": []string{"a", "b"}, "waitedSeconds": 300.000123}},
		{"RunStepRetryRequested", statestore.RunStepRetryRequestedPayload{StepID: "b", StepLogicalAttemptID: 2, RequestedBy: "jane"},
			map[string]any{"stepId": "b", "stepLogicalAttemptId": int64(2), "requestedBy": "jane"}},
		{"RunStepTryEnded", statestore.RunStepTryEndedPayload{StepID: "b", StepLogicalAttemptID: 1, Reason: statestore.TryEndedEngineTryFailed, Error: stepErr},
			map[string]any{"stepId": "b", "stepLogicalAttemptId": int64(1), "reason": statestore.TryEndedEngineTryFailed, "error": stepErr}},
		{"RunStepTryEnded handed back", statestore.RunStepTryEndedPayload{StepID: "b", StepLogicalAttemptID: 3, Reason: statestore.TryEndedHandedBack},
			map[string]any{"stepId": "b", "stepLogicalAttemptId": int64(3), "reason": statestore.TryEndedHandedBack}},
		{"RunStepTryStarted", statestore.RunStepTryStartedPayload{StepID: "b", StepLogicalAttemptID: 1},
			map[string]any{"stepId": "b", "stepLogicalAttemptId": int64(1)}},
	}
	run := statestore.RunRef{RunID: "run-1", TenantID: "t", ProjectID: "p", EnvironmentID: "e", PlanID: "plan", PlanVersion: "1"}
	seen := map[string]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			et := c.typed.EventType()
			seen[et] = true
			var old any
			if len(c.old) > 0 {
				old = c.old // the producers passed nil for an empty map
			}
			want, err := statestore.NewEvent(run, et, "b", 1, 1, old)
			if err != nil {
				t.Fatal(err)
			}
			got, err := statestore.NewEvent(run, et, "b", 1, 1, c.typed)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Payload, want.Payload) {
				t.Fatalf("payload\n got %s\nwant %s", got.Payload, want.Payload)
			}
			// And it reads back as it was written.
			back, ok := statestore.DecodePayload(et, got.Payload)
			if !ok {
				t.Fatalf("DecodePayload(%s): unknown", et)
			}
			again, _ := statestore.NewEvent(run, et, "b", 1, 1, back)
			if !bytes.Equal(again.Payload, got.Payload) {
				t.Fatalf("decoded and encoded again\n got %s\nwant %s", again.Payload, got.Payload)
			}
		})
	}
	for _, et := range knownTypes {
		if !seen[et] {
			t.Errorf("no case for %s", et)
		}
	}
}

// TestPayloadFor_EveryKnownType: the map from event type to payload type
// covers exactly the types the projector knows, each payload names its
// own type, and NewEvent refuses a payload of another type.
func TestPayloadFor_EveryKnownType(t *testing.T) {
	for _, et := range knownTypes {
		p, ok := statestore.PayloadFor(et)
		if !ok || p.EventType() != et {
			t.Errorf("PayloadFor(%s) = %T, %v", et, p, ok)
		}
	}
	if p, ok := statestore.PayloadFor("RunAnnotated"); ok {
		t.Errorf("PayloadFor(RunAnnotated) = %T, want none", p)
	}
	run := statestore.RunRef{RunID: "r", TenantID: "t", ProjectID: "p", EnvironmentID: "e", PlanID: "plan", PlanVersion: "1"}
	if _, err := statestore.NewEvent(run, statestore.RunResumed, "", 1, 1, statestore.RunPausedPayload{Reason: "x"}); err == nil {
		t.Error("NewEvent took a RunPaused payload for RunResumed")
	}
	w, err := statestore.NewEvent(run, statestore.RunResumed, "", 1, 1, (*statestore.RunResumedPayload)(nil))
	if err != nil || w.Payload != nil {
		t.Errorf("NewEvent with a nil payload: %s, %v", w.Payload, err)
	}
}

// TestDecodePayload_KeepsWhatFits: a reader gets the fields of the right
// type from a payload with one of the wrong type, as the reducer always did.
func TestDecodePayload_KeepsWhatFits(t *testing.T) {
	p, _ := statestore.DecodePayload(statestore.RunPaused, json.RawMessage(`{"reason":"r","drainTimeoutSeconds":"5m","requestedBy":"jane"}`))
	got := p.(*statestore.RunPausedPayload)
	if got.Reason != "r" || got.RequestedBy != "jane" || (got.DrainTimeoutSeconds != nil && *got.DrainTimeoutSeconds != 0) {
		t.Fatalf("got %+v", got)
	}
	if _, ok := statestore.DecodePayload("RunAnnotated", json.RawMessage(`{}`)); ok {
		t.Fatal("an unknown type decoded")
	}
}

// TestValidateWrite_PayloadPresence: a required payload field that is
// absent or null is "required", told apart from a present zero value; a
// present but empty resumeAt is not a time.
func TestValidateWrite_PayloadPresence(t *testing.T) {
	cases := []struct {
		name, eventType, payload, field, msg string
	}{
		{"retry attempt absent", statestore.RunStepRetryRequested, `{"stepId":"a"}`, "payload.stepLogicalAttemptId", "is required"},
		{"retry attempt null", statestore.RunStepRetryRequested, `{"stepId":"a","stepLogicalAttemptId":null}`, "payload.stepLogicalAttemptId", "is required"},
		{"retry attempt 0", statestore.RunStepRetryRequested, `{"stepId":"a","stepLogicalAttemptId":0}`, "payload.stepLogicalAttemptId", "must be >= 2"},
		{"try ended reason absent", statestore.RunStepTryEnded, `{"stepId":"a","stepLogicalAttemptId":1}`, "payload.reason", "is required"},
		{"try ended reason empty", statestore.RunStepTryEnded, `{"stepId":"a","stepLogicalAttemptId":1,"reason":""}`, "payload.reason", "must be"},
		{"try started attempt absent", statestore.RunStepTryStarted, `{"stepId":"a"}`, "payload.stepLogicalAttemptId", "is required"},
		{"resumeAt empty", statestore.RunPaused, `{"resumeAt":""}`, "payload.resumeAt", "must be an RFC 3339 time"},
		{"engineStatus is the sidecar's, untyped", statestore.RunCompleted, `{"engineStatus":5}`, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := storetest.WithPayload(storetest.Event("run-presence", c.eventType, "a"), json.RawMessage(c.payload))
			err := statestore.ValidateWrite(w)
			if c.field == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			var e *statestore.Error
			if !errors.As(err, &e) || e.Field != c.field || !strings.HasPrefix(e.Message, c.msg) {
				t.Fatalf("got %v, want %s %s", err, c.field, c.msg)
			}
		})
	}
}
