package statestore_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
)

type vector struct {
	Name             string  `json:"name"`
	RunID            string  `json:"runId"`
	StepID           *string `json:"stepId"`
	StepIDNormalized string  `json:"stepIdNormalized"`
	LogicalAttemptID int64   `json:"logicalAttemptId"`
	EventType        string  `json:"eventType"`
	PlanID           string  `json:"planId"`
	PlanVersion      string  `json:"planVersion"`
	Preimage         string  `json:"preimage"`
	ExpectedSha256   string  `json:"expectedSha256Hex"`
}

func loadVectors(t testing.TB) []vector {
	t.Helper()
	b, err := statestore.Contract.ReadFile("contract/RunEvents.v2.0.1.idempotency_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatal(err)
	}
	return vs
}

func TestIdempotencyKey_Vectors(t *testing.T) {
	vs := loadVectors(t)
	if len(vs) < 10 {
		t.Fatalf("got %d vectors, want the 5 of the Run Events Contract and at least 5 more", len(vs))
	}
	seen := map[string]bool{}
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			step := ""
			if v.StepID != nil {
				step = *v.StepID
				if v.StepIDNormalized != step {
					t.Fatalf("vector file: stepIdNormalized %q != stepId %q", v.StepIDNormalized, step)
				}
			} else if v.StepIDNormalized != "RUN" {
				t.Fatalf("vector file: run-level stepIdNormalized %q", v.StepIDNormalized)
			}
			in := statestore.KeyInput{RunID: v.RunID, StepID: step, LogicalAttemptID: v.LogicalAttemptID,
				EventType: v.EventType, PlanID: v.PlanID, PlanVersion: v.PlanVersion}
			if got := in.Preimage(); got != v.Preimage {
				t.Fatalf("preimage: got %q want %q", got, v.Preimage)
			}
			// The digest is SHA-256 of the UTF-8 preimage bytes, lowercase hex.
			sum := sha256.Sum256([]byte(v.Preimage))
			if hex.EncodeToString(sum[:]) != v.ExpectedSha256 {
				t.Fatalf("vector file digest does not match its preimage")
			}
			key := statestore.IdempotencyKey(v.RunID, step, v.LogicalAttemptID, v.EventType, v.PlanID, v.PlanVersion)
			if key != v.ExpectedSha256 {
				t.Fatalf("key: got %s want %s", key, v.ExpectedSha256)
			}
			// Forbidden fields do not participate: an event that differs only in
			// tenantId, projectId, environmentId and engineAttemptId has the same key.
			for i, f := range []struct {
				tenant, project, env string
				engine               int64
			}{{"t1", "p1", "e1", 1}, {"tenant_acme", "proj_marketing", "prod", 7}, {"ü", "日本", "🚀", 1 << 40}} {
				w := statestore.RunEventWrite{RunID: v.RunID, StepID: step, LogicalAttemptID: v.LogicalAttemptID,
					EventType: v.EventType, PlanID: v.PlanID, PlanVersion: v.PlanVersion,
					TenantID: f.tenant, ProjectID: f.project, EnvironmentID: f.env, EngineAttemptID: f.engine}
				if got := w.KeyInput().Key(); got != v.ExpectedSha256 {
					t.Fatalf("variation %d of forbidden fields changed the key to %s", i, got)
				}
			}
		})
		seen[v.Name] = true
	}
	for _, name := range []string{"vector-1-step-started", "vector-2-run-started", "vector-3-step-failed-attempt-2",
		"vector-4-run-failed-plan-v3", "vector-5-step-skipped-customers-v1"} {
		if !seen[name] {
			t.Errorf("contract vector %s missing from the vectors file", name)
		}
	}
}

func TestKeyInput_Preimage(t *testing.T) {
	tests := []struct {
		name string
		in   statestore.KeyInput
		want string
	}{
		{"run level normalizes to RUN", statestore.KeyInput{"r", "", 1, "RunStarted", "p", "1"}, "r|RUN|1|RunStarted|p|1"},
		{"base-10 no leading zeros", statestore.KeyInput{"r", "s", 10, "StepStarted", "p", "1"}, "r|s|10|StepStarted|p|1"},
		{"verbatim, no trimming", statestore.KeyInput{" r ", " s", 1, "StepStarted", "p ", " 1"}, " r | s|1|StepStarted|p | 1"},
		{"no unicode normalization", statestore.KeyInput{"e\u0301", "é", 1, "StepStarted", "p", "1"}, "e\u0301|é|1|StepStarted|p|1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.in.Preimage(); got != tt.want {
				t.Fatalf("got %q want %q", got, tt.want)
			}
		})
	}
	// NFC and NFD spellings of the same text are different keys.
	if statestore.IdempotencyKey("é", "", 1, "RunStarted", "p", "1") == statestore.IdempotencyKey("e\u0301", "", 1, "RunStarted", "p", "1") {
		t.Fatal("unicode normalization changed the key")
	}
}

func TestRunEventWrite_KeyInputIgnoresStepIDOfRunEvents(t *testing.T) {
	w := statestore.RunEventWrite{RunID: "r", StepID: "s", LogicalAttemptID: 1, EventType: "RunStarted", PlanID: "p", PlanVersion: "1"}
	if got := w.KeyInput().Preimage(); got != "r|RUN|1|RunStarted|p|1" {
		t.Fatalf("got %q", got)
	}
}

func TestKeyInput_Validate(t *testing.T) {
	ok := statestore.KeyInput{RunID: "r", StepID: "s", LogicalAttemptID: 1, EventType: "StepStarted", PlanID: "p", PlanVersion: "1"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		mut   func(k *statestore.KeyInput)
		field string
	}{
		"pipe in runId":         {func(k *statestore.KeyInput) { k.RunID = "a|b" }, "runId"},
		"empty planVersion":     {func(k *statestore.KeyInput) { k.PlanVersion = "" }, "planVersion"},
		"attempt zero":          {func(k *statestore.KeyInput) { k.LogicalAttemptID = 0 }, "logicalAttemptId"},
		"step event no stepId":  {func(k *statestore.KeyInput) { k.StepID = "" }, "stepId"},
		"run event with stepId": {func(k *statestore.KeyInput) { k.EventType = "RunStarted" }, "stepId"},
		"pipe in eventType":     {func(k *statestore.KeyInput) { k.EventType = "Run|Started"; k.StepID = "" }, "eventType"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			k := ok
			tt.mut(&k)
			var e *statestore.Error
			if err := k.Validate(); !errors.As(err, &e) || e.Field != tt.field || e.Code != statestore.CodeSchemaValidationFailed {
				t.Fatalf("got %v, want SCHEMA_VALIDATION_FAILED on %s", err, tt.field)
			}
		})
	}
}
