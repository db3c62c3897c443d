package statestore_test

import (
	"encoding/json"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestPayloads_OldAndNewShapes: the Execution Semantics contract's
// consumer rule (accept old and new event shapes while a contract
// changes). A payload written by a newer producer (fields this version
// does not know, at any depth) and one
// written before an optional field existed (no drainTimeoutSeconds, no
// requestedBy, no sha256) are both accepted before append, in Go and by
// the published schemas, and project exactly as the shape this version
// writes: unknown fields change nothing, missing optional ones take their
// defaults.
func TestPayloads_OldAndNewShapes(t *testing.T) {
	art := map[string]any{"uri": "nats-os://artifacts/x", "kind": "stdout", "sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "sizeBytes": 12}
	current := map[string]map[string]any{
		statestore.RunStarted:    {"engineRunRef": "conductor://wf/abc", "engineType": "conductor"},
		statestore.StepCompleted: {"artifacts": []any{art}},
		statestore.RunPaused:     {"reason": "operator", "requestedBy": "jane", "drainTimeoutSeconds": 300},
		statestore.StepFailed:    {"error": map[string]any{"code": "EXIT_CODE", "message": "exit 2", "retryable": false}},
	}
	newer := map[string]map[string]any{
		statestore.RunStarted: {"engineRunRef": "conductor://wf/abc", "engineType": "conductor", "engineVersion": "3.99", "region": map[string]any{"name": "eu"}},
		statestore.StepCompleted: {"artifacts": []any{map[string]any{"uri": "nats-os://artifacts/x", "kind": "stdout",
			"sha256": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "sizeBytes": 12, "compression": "zstd"}}, "durationMs": 1500},
		statestore.RunPaused:  {"reason": "operator", "requestedBy": "jane", "drainTimeoutSeconds": 300, "priority": 2, "ticket": []any{"OPS-1"}},
		statestore.StepFailed: {"error": map[string]any{"code": "EXIT_CODE", "message": "exit 2", "retryable": false, "details": map[string]any{"exitCode": 2}}, "hint": "x"},
	}
	older := map[string]map[string]any{
		statestore.RunStarted:    {"engineRunRef": "conductor://wf/abc", "engineType": "conductor"},
		statestore.StepCompleted: {"artifacts": []any{map[string]any{"uri": "nats-os://artifacts/x", "kind": "stdout"}}},
		statestore.RunPaused:     {"reason": "operator"},
		statestore.StepFailed:    {"error": map[string]any{"code": "EXIT_CODE", "message": "exit 2"}},
	}
	sch := schemas(t)
	project := func(t *testing.T, payloads map[string]map[string]any) *statestore.RunSnapshot {
		t.Helper()
		b := newLog("run-shapes")
		for _, ev := range []struct{ typ, step string }{
			{statestore.RunStarted, ""}, {statestore.StepStarted, "a"}, {statestore.StepCompleted, "a"},
			{statestore.StepStarted, "b"}, {statestore.RunPaused, ""}, {statestore.StepFailed, "b"},
		} {
			var p any
			if pl, ok := payloads[ev.typ]; ok {
				p = pl
			}
			b.add(ev.typ, ev.step, 1, p)
			w := &b.recs[len(b.recs)-1].RunEventWrite
			if err := statestore.ValidateWrite(w); err != nil {
				t.Fatalf("%s: %v", ev.typ, err)
			}
			doc, _ := json.Marshal(w)
			if _, err := statestore.DecodeWrite(doc); err != nil {
				t.Fatalf("%s: DecodeWrite: %v", ev.typ, err)
			}
			if err := schemaValid(t, sch, doc); err != nil {
				t.Fatalf("%s: the published schemas refuse it: %v", ev.typ, err)
			}
		}
		// Same event ids and times in every shape: only the payloads differ.
		for i := range b.recs {
			b.recs[i].EventID = "00000000-0000-4000-8000-00000000000" + string(rune('0'+i))
		}
		snap, alerts := statestore.Reduce(nil, b.recs)
		if len(alerts) != 0 {
			t.Fatalf("alerts: %+v", alerts)
		}
		return snap
	}
	snapJSON := func(s *statestore.RunSnapshot) string {
		b, _ := json.Marshal(s)
		return string(b)
	}
	want := snapJSON(project(t, current))
	t.Run("newer", func(t *testing.T) {
		if got := snapJSON(project(t, newer)); got != want {
			t.Fatalf("a newer producer's payloads project differently:\n got %s\nwant %s", got, want)
		}
	})
	t.Run("older", func(t *testing.T) {
		s := project(t, older)
		if s.Status != statestore.RunStatusPaused || s.Pause == nil || s.Pause.Reason != "operator" || len(s.Steps) != 2 ||
			s.Steps[0].Status != statestore.StepStatusSuccess || len(s.Steps[0].Artifacts) != 1 || s.Steps[1].Status != statestore.StepStatusFailed {
			t.Fatalf("an older producer's payloads: %s", snapJSON(s))
		}
	})
}
