package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/proctest"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
)

// TestE2E_PostgresRuntimeRole: the database set up as docs/postgres.md
// says (deploy/postgres/roles.sql, sidecar migrate --runtime-role as the
// owner); serve as the owner is refused; serve as the runtime role runs a
// plan to the end; sidecar verify passes, then reports the run the owner
// rewrote (exit 1, the code in text and JSON); the restarted serve shows
// the run as the log now says, STALE, not its saved COMPLETED snapshot.
func TestE2E_PostgresRuntimeRole(t *testing.T) {
	r := pgtest.NewRoles(t)
	bin := sidecartest.Binary(t)
	out, err := exec.Command(bin, "migrate", "--store", r.OwnerURL, "--runtime-role", r.Runtime).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "runtime role "+r.Runtime+" granted") {
		t.Fatalf("sidecar migrate: %v\n%s", err, out)
	}
	out, err = proctest.CombinedOutput(exec.Command(bin, "serve", "--conductor-url", "http://127.0.0.1:1/api", "--store", r.OwnerURL,
		"--data-dir", t.TempDir(), "--listen", sidecartest.FreeAddr(t)))
	if exitCode(err) != 1 || !strings.Contains(string(out), "STORE_ROLE_REFUSED: connected as "+r.Owner) {
		t.Fatalf("serve as the owner: %v\n%s", err, out)
	}

	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	p := startServe(t, dataDir, addr, "--store", r.RuntimeURL)
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-runtime-role")+`","planVersion":"1","steps":[
		{"stepId":"a","executor":{"type":"noop"}},
		{"stepId":"b","executor":{"type":"noop"},"dependsOn":["a"]}]}`)
	started := submit(t, p, pl, "req-1")
	if v := waitTerminal(t, p, started.RunID, 90*time.Second); v.Status != statestore.RunStatusCompleted {
		t.Fatalf("run as the runtime role ended %s, want COMPLETED", v.Status)
	}
	p.stop(syscall.SIGTERM)

	out, err = exec.Command(bin, "verify", "--store", r.RuntimeURL).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "verified 1 run,") || !strings.Contains(string(out), ": 0 broken") {
		t.Fatalf("sidecar verify of the untouched log: %v\n%s", err, out)
	}

	ctx := context.Background()
	owner, err := pgx.Connect(ctx, r.OwnerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)
	for _, q := range []string{
		"ALTER TABLE run_events DISABLE TRIGGER USER",
		`UPDATE run_events SET event_type = 'RunFailed', body = replace(body, '"eventType":"RunCompleted"', '"eventType":"RunFailed"')
			WHERE event_type = 'RunCompleted'`,
		"ALTER TABLE run_events ENABLE TRIGGER USER",
	} {
		if _, err := owner.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	out, err = exec.Command(bin, "verify", "--store", r.RuntimeURL).CombinedOutput()
	if exitCode(err) != 1 || !strings.Contains(string(out), "BROKEN "+started.RunID+" "+pgstore.CodeChainBroken+" runSeq ") {
		t.Fatalf("sidecar verify of the rewritten log: exit %d\n%s", exitCode(err), out)
	}
	cmd := exec.Command(bin, "verify", "--store", r.RuntimeURL, "-o", "json", started.RunID)
	stdout, err := cmd.Output()
	var v pgstore.Verified
	if exitCode(err) != 1 || json.Unmarshal(stdout, &v) != nil || len(v.Broken) != 1 || v.Broken[0].RunID != started.RunID ||
		v.Broken[0].Code != pgstore.CodeChainBroken {
		t.Fatalf("sidecar verify -o json %s: exit %d\n%s", started.RunID, exitCode(err), stdout)
	}

	p = startServe(t, dataDir, addr, "--store", r.RuntimeURL)
	view, err := p.client.Run(ctx, started.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if !view.Stale || view.Status != statestore.RunStatusFailed {
		t.Fatalf("the rewritten run after a restart: %s, stale %v; want the log's FAILED, stale", view.Status, view.Stale)
	}
}
