package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_Labels: labels given at submission are recorded in RunStarted
// and shown in the run's view; a repeat of the request with other labels
// is the same run with the first labels (issue #14 §1, the labels).
func TestE2E_Labels(t *testing.T) {
	p := startServe(t, t.TempDir(), freeAddr(t))
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
}
