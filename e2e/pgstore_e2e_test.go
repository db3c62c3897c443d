package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/proctest"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
)

// TestE2E_PostgresStoreFailsClosed: with --store postgres://..., a
// database that does not answer stops serve at start with one line naming
// it (password redacted), a URL of another scheme is a configuration
// error, and a table dropped under a running sidecar turns /readyz 503
// with STORE_DAMAGED.
func TestE2E_PostgresStoreFailsClosed(t *testing.T) {
	url := pgtest.URL(t)
	down := fmt.Sprintf("postgres://sidecar:hunter2@%s/sidecar?connect_timeout=2", sidecartest.FreeAddr(t))
	out, err := proctest.CombinedOutput(exec.Command(sidecartest.Binary(t), "serve", "--conductor-url", "http://127.0.0.1:1/api", "--store", down,
		"--data-dir", t.TempDir(), "--listen", sidecartest.FreeAddr(t)))
	if err == nil || !strings.Contains(string(out), "STORE_UNAVAILABLE: cannot reach PostgreSQL at 127.0.0.1:") ||
		!strings.Contains(string(out), ": connection refused: check --store") || strings.Contains(string(out), "hunter2") {
		t.Fatalf("a database that does not answer: %v\n%s", err, out)
	}
	out, err = proctest.CombinedOutput(exec.Command(sidecartest.Binary(t), "serve", "--store", "mysql://sidecar:hunter2@db/sidecar", "--data-dir", t.TempDir()))
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "--store mysql://sidecar:xxxxx@db/sidecar: want nats or a PostgreSQL URL") {
		t.Fatalf("--store mysql://: exit %d\n%s", code, out)
	}

	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--store", url)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP TABLE control_replies"); err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(t, p); code != http.StatusServiceUnavailable || !strings.Contains(body, "STORE_DAMAGED") || !strings.Contains(body, "control_replies") {
		t.Fatalf("/readyz after a dropped table: %d %s", code, body)
	}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestE2E_PostgresStoreLostNATSState: with --store postgres://..., the run
// index, the run list's cursor, the bus's cursors and the artifacts stay
// on NATS (embedded: in --data-dir). A sidecar started on the same
// database with another data dir (the volume lost, or the wrong one) would
// not know the runs in flight; serve refuses to start, in one line with
// the fix, and the original data dir goes on where it stopped.
func TestE2E_PostgresStoreLostNATSState(t *testing.T) {
	url := pgtest.URL(t)
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	same := []string{"--store", url, "--task-domain", "e2e-lost-" + filepath.Base(dataDir), "--worker-id", "e2e-lost"}
	p := startServe(t, dataDir, addr, same...)
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-lost")+`","planVersion":"1","steps":[
		{"stepId":"long","executor":{"type":"command","argv":["sleep","3"]}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["long"]}]}`)
	started := submit(t, p, pl, "req-1")
	sidecartest.WaitFor(t, "long to start", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "long", 0) >= 0
	})
	p.stop(syscall.SIGKILL)

	other := t.TempDir()
	cmd := exec.Command(sidecartest.Binary(t), append([]string{"serve", "--conductor-url", conductortest.URL(t), "--data-dir", other,
		"--listen", sidecartest.FreeAddr(t)}, same...)...)
	done := make(chan []byte, 1)
	go func() { out, _ := proctest.CombinedOutput(cmd); done <- out }()
	select {
	case out := <-done:
		if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), "STORE_DAMAGED: this database was used with other NATS state") ||
			!strings.Contains(string(out), "--accept-new-nats-state") {
			t.Fatalf("serve on another data dir: exit %d\n%s", code, out)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("serve on another data dir with the same database kept running:\n%s", <-done)
	}

	p2 := startServe(t, dataDir, addr, same...)
	if v := waitTerminal(t, p2, started.RunID, 60*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run ended %s on the original data dir, want COMPLETED", v.Status)
	}
	p2.stop(syscall.SIGTERM)

	// The operator accepts the loss: the other data dir starts and is the
	// database's pair from then on; the old one is refused.
	p3 := startServe(t, other, sidecartest.FreeAddr(t), append(same, "--accept-new-nats-state")...)
	p3.stop(syscall.SIGTERM)
	out, err := proctest.CombinedOutput(exec.Command(sidecartest.Binary(t), append([]string{"serve", "--conductor-url", conductortest.URL(t), "--data-dir", dataDir,
		"--listen", sidecartest.FreeAddr(t)}, same...)...))
	if err == nil || !strings.Contains(string(out), "this database was used with other NATS state") {
		t.Fatalf("the old data dir after re-pairing: %v\n%s", err, out)
	}
}

// TestE2E_PostgresRestartMidRun: the database stops while a step runs
// and the step ends while it is down; /readyz says so; once the database is
// back the run completes with every step started and completed once and
// no event twice.
func TestE2E_PostgresRestartMidRun(t *testing.T) {
	t.Parallel() // its own serve and data dir
	cl := pgtest.Own(t)
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--store", cl.URL)
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-pgrestart")+`","planVersion":"1","steps":[
		{"stepId":"first","executor":{"type":"command","argv":["sleep","2"]}},
		{"stepId":"second","executor":{"type":"command","argv":["sleep","1"]},"dependsOn":["first"]},
		{"stepId":"last","executor":{"type":"noop"},"dependsOn":["second"]}]}`)
	started := submit(t, p, pl, "req-1")
	sidecartest.WaitFor(t, "first to start", 30*time.Second, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "first", 0) >= 0
	})
	cl.Stop(t)
	if code, body := readyz(t, p); code != http.StatusServiceUnavailable || !strings.Contains(body, "STORE_UNAVAILABLE") {
		t.Errorf("/readyz with the database down: %d %s", code, body)
	}
	time.Sleep(4 * time.Second) // first ends while the database is down
	cl.Start(t)
	v := waitTerminal(t, p, started.RunID, 90*time.Second)
	evs := allEvents(t, p, started.RunID)
	if v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run %s after the database restart, want COMPLETED: %v", v.Status, types(evs))
	}
	seen := map[string]bool{}
	for _, e := range evs {
		if seen[e.IdempotencyKey] {
			t.Fatalf("event %s %s twice: %v", e.EventType, e.StepID, types(evs))
		}
		seen[e.IdempotencyKey] = true
	}
	for _, s := range []string{"first", "second", "last"} {
		if count(evs, statestore.StepStarted, s) != 1 || count(evs, statestore.StepCompleted, s) != 1 {
			t.Fatalf("step %s did not run exactly once: %v", s, types(evs))
		}
	}
	if code, body := readyz(t, p); code != http.StatusOK {
		t.Fatalf("/readyz after the restart: %d %s", code, body)
	}
}
