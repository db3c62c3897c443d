package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_PauseWaitWithoutViewerDoesNothing: an operator-only token may
// pause, but --wait follows the drain by reading the run, which needs
// viewer. The CLI refuses before acting (exit 7, nothing recorded), single
// and bulk: before, it paused the run and then exited 7 "denied", read as
// a pause refused. A bulk filter that matches no run exits 4 with a line
// that says so: before, it exited 0 with an empty table.
func TestE2E_PauseWaitWithoutViewerDoesNothing(t *testing.T) {
	t.Parallel() // its own serve and data dir
	adminToken, adminEntry := newToken(t, "root", "admin")
	opToken, opEntry := newToken(t, "alice", "operator")
	tokens := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(tokens, []byte("principals:\n"+adminEntry+opEntry), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--tokens-file", tokens)
	p.client.Token = adminToken
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-waitdenied")+`","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"sleep","seconds":30}}]}`)
	team := uniq("team")
	started, err := p.client.Start(context.Background(), httpapi.StartRequest{TenantID: "t-e2e", ProjectID: "p-e2e", EnvironmentID: "test",
		RunRequestID: uniq("waitdenied"), Plan: pl, Labels: map[string]string{"team": team}})
	if err != nil {
		t.Fatal(err)
	}
	server := "http://" + p.addr
	for _, args := range [][]string{
		{"pause", started.RunID, "--reason", "x", "--wait"},
		{"pause", "-l", "team=" + team, "--reason", "x", "--wait"},
	} {
		code, out, errOut := sidecartest.Run(t, append(args, "--server", server, "--token", opToken)...)
		if code != sidecartest.ExitDenied || !strings.Contains(errOut, "needs the viewer role; nothing was done") {
			t.Fatalf("%v as an operator: exit %d\n%s%s\nwant exit %d and why", args, code, out, errOut, sidecartest.ExitDenied)
		}
		if evs := allEvents(t, p, started.RunID); count(evs, statestore.RunPaused, "") != 0 {
			t.Fatalf("%v as an operator refused, yet the run was paused: %v", args, types(evs))
		}
	}
	code, out, errOut := sidecartest.Run(t, "pause", "-l", "team=no-such-"+team, "--reason", "x", "--server", server, "--token", adminToken)
	if code != sidecartest.ExitNotFound || !strings.Contains(errOut, "no run matches") {
		t.Fatalf("a filter that matches nothing: exit %d\n%s%s\nwant exit %d and a line saying so", code, out, errOut, sidecartest.ExitNotFound)
	}
}
