package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_Labels: labels given at submission are recorded in RunStarted
// and shown in the run's view; a repeat of the request with other labels
// is the same run with the first labels.
func TestE2E_Labels(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	ctx := context.Background()
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-labels")+`","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`)
	req := httpapi.StartRequest{TenantID: "t-e2e", ProjectID: "p-e2e", EnvironmentID: "test", RunRequestID: uniq("req"), Plan: pl,
		Labels: map[string]string{"team": "data", "app.example.com/tier": "gold"}}
	started, err := p.client.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	v := waitTerminal(t, p, started.RunID, 60*time.Second)
	if v.Labels["team"] != "data" || v.Labels["app.example.com/tier"] != "gold" || len(v.Labels) != 2 {
		t.Fatalf("labels %v", v.Labels)
	}
	evs := allEvents(t, p, started.RunID)
	var payload struct{ Labels map[string]string }
	_ = json.Unmarshal(evs[0].Payload, &payload)
	if evs[0].EventType != statestore.RunStarted || payload.Labels["team"] != "data" {
		t.Fatalf("first event %s with labels %v, want RunStarted carrying them", evs[0].EventType, payload.Labels)
	}
	req.Labels = map[string]string{"team": "other"}
	again, err := p.client.Start(ctx, req)
	if err != nil || again.RunID != started.RunID || again.Created {
		t.Fatalf("repeat: %+v %v, want the same run", again, err)
	}
	if v, _ := p.client.Run(ctx, started.RunID); v.Labels["team"] != "data" {
		t.Fatalf("after a repeat with other labels: %v, want the first", v.Labels)
	}

	// The CLI: -l KEY=VALUE, repeated; a bad label is refused by the API.
	file := filepath.Join(t.TempDir(), "plan.json")
	if err := os.WriteFile(file, []byte(`{"planId":"`+uniq("e2e-labels-cli")+`","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	server := "http://" + p.addr
	code, out, errOut := sidecartest.Run(t, "run", "submit", file, "-l", "team=ml", "-l", "tier=", "--server", server, "-o", "json")
	if code != 0 {
		t.Fatalf("run submit -l: exit %d: %s", code, errOut)
	}
	var s httpapi.Started
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatal(err)
	}
	if v := waitTerminal(t, p, s.RunID, 60*time.Second); v.Labels["team"] != "ml" || v.Labels["tier"] != "" || len(v.Labels) != 2 {
		t.Fatalf("labels from the CLI: %v", v.Labels)
	}
	if code, out, _ := sidecartest.Run(t, "status", s.RunID, "--server", server); code != 0 || !strings.Contains(out, "labels    team=ml,tier=") {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	if code, _, errOut = sidecartest.Run(t, "run", "submit", file, "-l", "team=data science", "--server", server); code == 0 || !strings.Contains(errOut, `labels["team"]`) {
		t.Fatalf("bad label: exit %d: %s", code, errOut)
	}
	if code, _, _ = sidecartest.Run(t, "run", "submit", file, "-l", "noequals", "--server", server); code != sidecartest.ExitUsage {
		t.Fatalf("-l without =: exit %d, want usage", code)
	}
}
