package node

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// envStartRefusedChild makes the test binary the child of
// TestNode_StartOnAStreamThatRefusesWrites, with the data dir as its
// value.
const envStartRefusedChild = "NODE_START_REFUSED_CHILD_DIR"

// TestNode_StartOnAStreamThatRefusesWrites re-executes the test binary as
// a child whose files may not grow past natstest.WriteErrLimit. Once the
// run index's stream (KV_SIDECAR_RUNS) failed a write, /readyz answers
// 503 and a start through the API answers 503 STORE_WRITE_REFUSED naming
// the stream and the fix, not the RUN_REGISTRY_UNAVAILABLE that wraps it.
func TestNode_StartOnAStreamThatRefusesWrites(t *testing.T) {
	natstest.RunWriteErrChild(t, "TestNode_StartRefusedChild", envStartRefusedChild, "start: ")
}

// TestNode_StartRefusedChild is the child of
// TestNode_StartOnAStreamThatRefusesWrites.
func TestNode_StartRefusedChild(t *testing.T) {
	ctx := context.Background()
	n, cfg, logs := openWriteErrChild(t, envStartRefusedChild)
	kv, err := n.js.KeyValue(ctx, "SIDECAR_RUNS")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server: %s", natstest.FillUntilWriteError(t, kv, logs))

	base := "http://" + cfg.API.Addr().String()
	client := &http.Client{Timeout: 2 * time.Minute} // a safety net, not a budget
	resp, err := client.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz: %d, want 503", resp.StatusCode)
	}

	body, _ := json.Marshal(httpapi.StartRequest{TenantID: "t", ProjectID: "p", EnvironmentID: "e", RunRequestID: uuid.NewString(),
		Plan: &plan.Plan{PlanID: "refused-" + uuid.NewString()[:8], PlanVersion: "1", Steps: []plan.Step{{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}}}}})
	began := time.Now()
	resp, err = client.Post(base+"/v1/runs", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var ans struct{ Code, Message string }
	err = json.NewDecoder(resp.Body).Decode(&ans)
	resp.Body.Close()
	t.Logf("start: %d %s in %s: %s", resp.StatusCode, ans.Code, time.Since(began).Round(time.Millisecond), ans.Message)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || ans.Code != natsstore.CodeWriteRefused {
		t.Fatalf("start: %d %+v %v, want 503 %s", resp.StatusCode, ans, err, natsstore.CodeWriteRefused)
	}
	for _, want := range []string{"KV_SIDECAR_RUNS", "file too large", "free space", "restart serve"} {
		if !strings.Contains(ans.Message, want) {
			t.Errorf("start's message %q, want it to name %q", ans.Message, want)
		}
	}
	if strings.Contains(ans.Message, "\n") {
		t.Errorf("start's message %q, want one line", ans.Message)
	}
}
