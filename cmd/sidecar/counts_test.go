package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

func TestCountOf(t *testing.T) {
	for n, want := range map[int]string{0: "0 runs", 1: "1 run", 2: "2 runs", 10000: "10000 runs"} {
		if got := countOf(n, "run"); got != want {
			t.Errorf("countOf(%d, run) = %q, want %q", n, got, want)
		}
	}
}

// A bulk action's summary line counts its runs as English does.
func TestPrintBulk_OneRun(t *testing.T) {
	var out bytes.Buffer
	printBulk(&Main{Stdout: &out, Stderr: &out}, &httpapi.BulkResult{Action: "pause",
		Runs:   []httpapi.BulkRun{{RunID: "r1", PlanID: "p", Outcome: "paused", Status: "RUNNING"}},
		Counts: map[string]int{"paused": 1}})
	if !strings.Contains(out.String(), "pause: 1 run: paused 1\n") {
		t.Fatalf("got\n%s\nwant the line \"pause: 1 run: paused 1\"", out.String())
	}
}
