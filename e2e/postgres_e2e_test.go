package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// postgresConductor is a Conductor server on PostgreSQL that this test
// started (deploy/local/conductor.sh, CONDUCTOR_STORE=postgres) in a
// directory of its own, on ports of its own.
type postgresConductor struct {
	env  []string
	port int
}

// startPostgresConductor starts one, or skips the test unless
// SIDECAR_TEST_CONDUCTOR_POSTGRES=1 (.ci/run sets it; the first start
// installs Debian's PostgreSQL if it is missing, and takes 20-40 s).
func startPostgresConductor(t *testing.T) *postgresConductor {
	t.Helper()
	if os.Getenv("SIDECAR_TEST_CONDUCTOR_POSTGRES") != "1" {
		t.Skip("SIDECAR_TEST_CONDUCTOR_POSTGRES=1 runs Conductor on PostgreSQL (deploy/local/conductor.sh)")
	}
	// Not t.TempDir: its 0700 would keep the cluster's owner, the
	// postgres user when the test runs as root, out.
	dir, err := os.MkdirTemp("", "conductor-pg-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	port, pgPort := freePort(t), freePort(t)
	c := &postgresConductor{port: port, env: append(os.Environ(), "CONDUCTOR_STORE=postgres",
		"CONDUCTOR_STATE_DIR="+dir, "CONDUCTOR_PORT="+strconv.Itoa(port), "CONDUCTOR_PG_PORT="+strconv.Itoa(pgPort))}
	t.Cleanup(func() {
		c.run(t, "stop")
		_ = os.RemoveAll(dir)
	})
	c.run(t, "start")
	return c
}

func (c *postgresConductor) run(t *testing.T, command string) {
	t.Helper()
	cmd := exec.Command(filepath.Join("..", "deploy", "local", "conductor.sh"), command)
	cmd.Env = c.env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("conductor.sh %s: %v\n%s", command, err, out)
	}
}

// describe is the run's workflow and its tasks as Conductor has them.
func (c *postgresConductor) describe(t *testing.T, p *proc, runID string) string {
	t.Helper()
	v, err := p.client.Run(context.Background(), runID)
	if err != nil || v.RunSnapshot == nil {
		return fmt.Sprintf("(run unreadable: %v)", err)
	}
	resp, err := http.Get(c.url() + "/workflow/" + statestore.ConductorWorkflowID(v.EngineRunRef) + "?includeTasks=true")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var wf struct {
		Status string `json:"status"`
		Tasks  []struct {
			Ref    string `json:"referenceTaskName"`
			Status string `json:"status"`
			Retry  int    `json:"retryCount"`
		} `json:"tasks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&wf); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%+v", wf)
}

func (c *postgresConductor) url() string { return "http://127.0.0.1:" + strconv.Itoa(c.port) + "/api" }

func freePort(t *testing.T) int {
	t.Helper()
	_, port, err := net.SplitHostPort(sidecartest.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	return n
}

// TestE2E_ConductorRestartOnPostgres: Conductor on PostgreSQL restarted
// while steps run keeps its workflows, and the sidecar carries every run
// to its end, each step started and completed once.
func TestE2E_ConductorRestartOnPostgres(t *testing.T) {
	t.Parallel() // its own serve and data dir
	c := startPostgresConductor(t)
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	p := startServe(t, dataDir, addr, "--conductor-url", c.url())
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-pg-restart")+`","planVersion":"1","steps":[
		{"stepId":"slow","executor":{"type":"command","argv":["sleep","4"]}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["slow"]}]}`)
	const runs = 5
	ids := make([]string, runs)
	for i := range ids {
		ids[i] = submit(t, p, pl, uniq("req")).RunID
	}
	sidecartest.WaitFor(t, "every slow step to start", 60*time.Second, func() bool {
		for _, id := range ids {
			if eventIndex(allEvents(t, p, id), statestore.StepStarted, "slow", 0) < 0 {
				return false
			}
		}
		return true
	})
	c.run(t, "stop")
	c.run(t, "start")
	for _, id := range ids {
		if v := waitTerminalOr(p, id, 120*time.Second); v == nil || v.Status != "COMPLETED" {
			t.Fatalf("run %s: %+v; in Conductor: %s", id, v, c.describe(t, p, id))
		}
		evs := allEvents(t, p, id)
		for _, step := range []string{"slow", "after"} {
			if count(evs, statestore.StepStarted, step) != 1 || count(evs, statestore.StepCompleted, step) != 1 {
				t.Fatalf("run %s, step %s: events %s", id, step, strings.Join(types(evs), " "))
			}
		}
		assertNoDuplicateKeys(t, evs)
	}
}

// TestE2E_ConcurrentTaskDefRegistrationsOnPostgres: replicas' first starts
// register the same task definitions at once, and Conductor on PostgreSQL
// races itself on their insert (a 500 "duplicate key" for the losers). Each
// registration still succeeds: the sidecar's registration is an upsert,
// and Conductor takes the repeat as an update.
func TestE2E_ConcurrentTaskDefRegistrationsOnPostgres(t *testing.T) {
	t.Parallel() // its own Conductor
	c := startPostgresConductor(t)
	cl, err := adapter.NewClient(adapter.ClientOptions{BaseURL: c.url(), Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const rounds, replicas = 3, 12
	atOnce := func(round int, what string, register func() error) {
		errs := make([]error, replicas)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = register()
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d, %s registration %d of %d at once: %v", round, what, i, replicas, err)
			}
		}
	}
	ctx := context.Background()
	for round := range rounds {
		name := strings.ReplaceAll(uniq("e2e-def"), "-", "_")
		defs := fmt.Sprintf(`[{"name":%q,"retryCount":0,"timeoutSeconds":0,"responseTimeoutSeconds":60,"ownerEmail":"sidecar@example.com"}]`, name)
		atOnce(round, "task definition", func() error { return cl.RegisterTaskDefsJSON(ctx, []byte(defs)) })
		// Conductor answers a workflow definition's lost race with 200
		// and the error in bulkErrorResults.
		def := fmt.Sprintf(`{"name":%q,"version":1,"schemaVersion":2,"ownerEmail":"sidecar@example.com","tasks":[{"name":%q,"taskReferenceName":"a","type":"SIMPLE"}]}`, name, name)
		atOnce(round, "workflow definition", func() error { return cl.RegisterWorkflowDefJSON(ctx, []byte(def)) })
		if got, err := cl.WorkflowDef(ctx, name, 1); err != nil || got == nil || len(got.Tasks) != 1 {
			t.Fatalf("round %d: the workflow definition read back: %+v, %v", round, got, err)
		}
	}
}
