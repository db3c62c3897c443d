package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
)

// TestE2E_PostgresStoreFailsClosed: with --store postgres://..., a
// database that does not answer stops serve at start with one line naming
// it (password redacted), a URL of another scheme is a configuration
// error, and a table dropped under a running sidecar turns /readyz 503
// with STORE_DAMAGED.
func TestE2E_PostgresStoreFailsClosed(t *testing.T) {
	url := pgtest.URL(t)
	down := fmt.Sprintf("postgres://sidecar:hunter2@%s/sidecar?connect_timeout=2", freeAddr(t))
	out, err := exec.Command(sidecarBinary(t), "serve", "--conductor-url", "http://127.0.0.1:1/api", "--store", down,
		"--data-dir", t.TempDir(), "--listen", freeAddr(t)).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "STORE_UNAVAILABLE: cannot reach PostgreSQL at 127.0.0.1:") ||
		!strings.Contains(string(out), ": connection refused: check --store") || strings.Contains(string(out), "hunter2") {
		t.Fatalf("a database that does not answer: %v\n%s", err, out)
	}
	out, err = exec.Command(sidecarBinary(t), "serve", "--store", "mysql://sidecar:hunter2@db/sidecar", "--data-dir", t.TempDir()).CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "--store mysql://sidecar:xxxxx@db/sidecar: want nats or a PostgreSQL URL") {
		t.Fatalf("--store mysql://: exit %d\n%s", code, out)
	}

	p := startServe(t, t.TempDir(), freeAddr(t), "--store", url)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP TABLE control_replies"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + p.addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "STORE_DAMAGED") || !strings.Contains(string(body), "control_replies") {
		t.Fatalf("/readyz after a dropped table: %d %s", resp.StatusCode, body)
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
