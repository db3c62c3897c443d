package e2e

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// hostileReason holds what a terminal obeys: an OSC title change ended by
// BEL, a screen clear, a C1 CSI, DEL, a carriage return and a newline that
// would forge a line of the table.
const hostileReason = "maint \x1b]0;pwned\x07\x1b[2J\u009b31m\x7f\rFORGED\nFORGED LINE"

// checkTerminalSafe fails when out has a control character other than
// newline and tab (C0, DEL, C1), or a line that starts with FORGED.
func checkTerminalSafe(t *testing.T, what, out string) {
	t.Helper()
	for i, r := range out {
		if (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r <= 0x9f) || (r == utf8.RuneError) {
			t.Fatalf("%s: control character %U at byte %d:\n%q", what, r, i, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "FORGED") {
			t.Fatalf("%s: a reason forged a line:\n%s", what, out)
		}
	}
}

// TestE2E_CLIEscapesControlCharacters: a pause reason with terminal escape
// sequences and a newline reaches `sidecar status`, `sidecar audit` and
// `sidecar runs -o wide` escaped (\u001b, \n), never raw; -o json keeps
// the reason exact.
func TestE2E_CLIEscapesControlCharacters(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	ctx := context.Background()
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-escape")+`","planVersion":"1","steps":[
		{"stepId":"slow","executor":{"type":"sleep","seconds":60}}]}`)
	started := submit(t, p, pl, uniq("req"))
	defer func() { _, _ = p.client.Cancel(ctx, started.RunID, "test over") }()
	sidecartest.WaitFor(t, "slow to start", 2*time.Minute, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "slow", 0) >= 0
	})
	if _, err := p.client.Pause(ctx, started.RunID, 600, hostileReason); err != nil {
		t.Fatal(err)
	}
	server := "http://" + p.addr
	// The run list follows the log: wait until it shows the pause.
	sidecartest.WaitFor(t, "the run list to show the pause", 2*time.Minute, func() bool {
		_, out, _ := sidecartest.Run(t, "runs", "--plan", pl.PlanID, "-o", "json", "--server", server)
		return strings.Contains(out, "pwned")
	})
	for _, args := range [][]string{
		{"status", started.RunID}, {"audit", started.RunID}, {"runs", "--plan", pl.PlanID, "-o", "wide"},
	} {
		code, out, errOut := sidecartest.Run(t, append(args, "--server", server)...)
		if code != 0 || !strings.Contains(out, `\u001b]0;pwned\u0007`) || !strings.Contains(out, `\nFORGED LINE`) {
			t.Fatalf("sidecar %s: exit %d, stderr %q; want the reason escaped in:\n%s", args[0], code, errOut, out)
		}
		checkTerminalSafe(t, "sidecar "+args[0], out)
	}
	v, err := p.client.Run(ctx, started.RunID)
	if err != nil || v.Pause == nil || v.Pause.Reason != hostileReason {
		t.Fatalf("the API's reason %+v (%v), want it exact", v.Pause, err)
	}
}
