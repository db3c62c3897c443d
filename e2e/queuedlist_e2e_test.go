package e2e

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_QueuedRunsAreListedAndCancelledBySelector: under admission
// control a queued run is a run like the others: the run list shows it
// with its labels and its place in the queue, and a bulk cancel by label
// selector reaches it.
func TestE2E_QueuedRunsAreListedAndCancelledBySelector(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--max-active-runs", "1", "--admission-policy", "queue")
	pl := &plan.Plan{PlanID: uniq("e2e-queuedlist"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "work", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 600}},
	}}
	ctx := context.Background()
	team := uniq("q")
	var ids []string
	for i := range 3 {
		started, err := p.client.Start(ctx, httpapi.StartRequest{TenantID: "t-e2e", ProjectID: "p-e2e", EnvironmentID: "test",
			RunRequestID: fmt.Sprintf("queued-%d", i), Plan: pl, Labels: map[string]string{"team": team}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, started.RunID)
	}
	q := url.Values{"labelSelector": {"team=" + team}}
	var list *httpapi.RunList
	sidecartest.WaitFor(t, "the three runs in the list", 30*time.Second, func() bool {
		var err error
		list, err = p.client.ListRuns(ctx, q)
		return err == nil && len(list.Runs) == 3
	})
	positions := map[string]int{}
	for _, r := range list.Runs {
		if r.Labels["team"] != team {
			t.Fatalf("run %s (%s) listed without its labels: %v", r.RunID, r.Status, r.Labels)
		}
		if r.Status == statestore.RunStatusQueued {
			positions[r.RunID] = r.QueuePosition
		}
	}
	if len(positions) != 2 || positions[ids[1]] != 1 || positions[ids[2]] != 2 {
		t.Fatalf("queued runs' positions %v, want %s at 1 and %s at 2", positions, ids[1], ids[2])
	}
	res, err := p.client.Bulk(ctx, "cancel", httpapi.BulkRequest{LabelSelector: "team=" + team, Reason: "queued ones too"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 3 {
		t.Fatalf("bulk cancel selected %d runs, want 3 (the queued ones too): %+v", len(res.Runs), res)
	}
	for _, id := range ids {
		if v := waitTerminal(t, p, id, time.Minute); v.Status != statestore.RunStatusCancelled {
			t.Fatalf("run %s %s after the bulk cancel, want CANCELLED", id, v.Status)
		}
	}
}
