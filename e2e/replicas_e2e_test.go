package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_ReplicasShareTheRuns: three sidecars on one NATS cluster divide
// the runs' background work (each watcher follows about a third of the
// active runs, the sum is all of them); when one is killed with SIGKILL
// the two others take its runs over: workflows terminated in Conductor's
// own API after the kill (no worker of ours finishes a task, so no nudge
// helps) are all recorded as ended in the log.
func TestE2E_ReplicasShareTheRuns(t *testing.T) {
	t.Parallel() // its own serve and data dir
	cl := startNATSCluster(t)
	url := cl.url(t)
	domain := "--task-domain=" + uniq("e2e-share")
	var reps []*proc
	for range 3 {
		reps = append(reps, startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--nats-url", url, "--nats-replicas", "3", domain))
	}
	sidecartest.WaitFor(t, "every replica to count three live replicas", 30*time.Second, func() bool {
		for _, p := range reps {
			if metricValue(t, p.addr, "sidecar_members_live") != 3 || metricValue(t, p.addr, "sidecar_members_owns_all") != 0 {
				return false
			}
		}
		return true
	})

	const n = 30
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-share")+`","planVersion":"1","steps":[
		{"stepId":"hold","executor":{"type":"command","argv":["sleep","600"]}}]}`)
	var runs []string
	workflows := map[string]string{}
	for i := range n {
		s := submit(t, reps[i%3], pl, fmt.Sprintf("req-%d", i))
		runs = append(runs, s.RunID)
		workflows[s.RunID] = s.WorkflowID
	}
	t.Cleanup(func() {
		for _, wf := range workflows {
			_, _ = conductorTry(t, "DELETE", "/workflow/"+wf+"?reason=cleanup", "")
		}
	})
	followed := make([]float64, 3)
	sidecartest.WaitFor(t, "the watchers to follow every run between them", 30*time.Second, func() bool {
		sum := 0.0
		for i, p := range reps {
			followed[i] = metricValue(t, p.addr, "sidecar_run_watcher_active_runs")
			sum += followed[i]
		}
		return sum == n
	})
	for i, f := range followed {
		if f == 0 || f == n {
			t.Fatalf("replica %d follows %v of %d runs: %v; want a share", i, f, n, followed)
		}
	}
	t.Logf("runs followed per replica: %v", followed)

	// Replica 1 dies; Conductor ends every workflow.
	reps[1].stop(syscall.SIGKILL)
	for _, id := range runs {
		conductorCall(t, "DELETE", "/workflow/"+workflows[id]+"?reason=ended+in+Conductor", "")
	}
	// Taken over once its heartbeat is 10 s old, then at the next scan.
	for _, id := range runs {
		v := waitTerminal(t, reps[0], id, 60*time.Second)
		if !statestore.IsTerminalRunStatus(v.Status) {
			t.Fatalf("run %s: %s", id, v.Status)
		}
	}
	for _, i := range []int{0, 2} {
		if live := metricValue(t, reps[i].addr, "sidecar_members_live"); live != 2 {
			t.Errorf("replica %d counts %v live replicas after one was killed, want 2", i, live)
		}
	}
}
