package statestore_test

import (
	"encoding/json"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
)

var fuzzTypes = []string{
	statestore.RunQueued, statestore.RunApproved, statestore.RunStarted, statestore.StepStarted, statestore.StepCompleted,
	statestore.StepFailed, statestore.StepSkipped, statestore.RunPaused, statestore.RunResumed, statestore.RunCompleted,
	statestore.RunFailed, statestore.RunCancelled, statestore.RunCancelRequested, statestore.RunDrainCompleted,
	statestore.RunDrainTimedOut, "RunAnnotated", statestore.RunStepRetryRequested,
}

// FuzzReduce drives the reducer with arbitrary event sequences, three bytes
// an event: type, step, attempt (and a payload choice). Whatever the order,
// the reducer must not panic, must be deterministic, must equal the
// incremental reduction, must never leave a terminal status, and must keep
// DRAINING consistent with the in-flight steps.
func FuzzReduce(f *testing.F) {
	f.Add([]byte{2, 0, 1, 3, 0, 1, 7, 0, 1, 4, 0, 1, 13, 0, 1})
	f.Add([]byte{2, 0, 1, 12, 0, 1, 9, 0, 1, 11, 0, 1})
	f.Add([]byte{2, 0, 1, 3, 1, 1, 5, 1, 1, 3, 1, 2, 4, 1, 1})
	payloads := []json.RawMessage{nil, []byte(`{"reason":"x","drainTimeoutSeconds":5}`), []byte(`{"artifacts":[{"uri":"u","kind":"k"}]}`),
		[]byte(`{"error":{"code":"E","message":"m"}}`), []byte(`{"artifacts":"not-an-array","error":7}`),
		[]byte(`{"error":{"code":"E","message":"m"},"onStepFailure":"pause"}`), []byte(`{"stepId":"a","stepLogicalAttemptId":2}`)}
	f.Fuzz(func(t *testing.T, data []byte) {
		var recs []statestore.RunEventRecord
		for i := 0; i+2 < len(data) && len(recs) < 200; i += 3 {
			et := fuzzTypes[int(data[i])%len(fuzzTypes)]
			step := ""
			if statestore.IsStepEvent(et) {
				step = string(rune('a' + data[i+1]%4))
			}
			w := statestore.RunEventWrite{EventID: "e", EventType: et, RunID: "r", StepID: step,
				LogicalAttemptID: int64(data[i+2]%4) + 1, EngineAttemptID: 1,
				Payload: payloads[int(data[i+1]/4)%len(payloads)]}
			recs = append(recs, statestore.RunEventRecord{RunEventWrite: w, RunSeq: int64(len(recs)+1) * 3, PersistedAt: "2026-02-11T10:00:00Z"})
		}
		whole, alerts := statestore.Reduce(nil, recs)
		again, alerts2 := statestore.Reduce(nil, recs)
		if string(mustJSON(t, whole)) != string(mustJSON(t, again)) || len(alerts) != len(alerts2) {
			t.Fatal("Reduce is not deterministic")
		}
		var inc *statestore.RunSnapshot
		terminal := ""
		for i := range recs {
			inc, _ = statestore.Reduce(inc, recs[i:i+1])
			if terminal != "" && inc.Status != terminal {
				t.Fatalf("terminal status %s changed to %s", terminal, inc.Status)
			}
			if statestore.IsTerminalRunStatus(inc.Status) {
				terminal = inc.Status
			}
			if inc.Substatus == statestore.SubstatusDraining && (inc.Status != statestore.RunStatusPaused || len(inc.InFlight()) == 0) {
				t.Fatalf("DRAINING with status %s and %d in flight", inc.Status, len(inc.InFlight()))
			}
		}
		if len(recs) > 0 && string(mustJSON(t, inc)) != string(mustJSON(t, whole)) {
			t.Fatalf("incremental and whole reductions differ")
		}
		if whole != nil && whole.Inconsistent != (len(alerts) > 0) {
			t.Fatalf("inconsistent=%v with %d alerts", whole.Inconsistent, len(alerts))
		}
	})
}
