package main

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestStatus_IdleStep: a step whose try ended (its outside worker died)
// shows IDLE with why; while the run runs it waits for its next try, and
// once the run ended (Conductor failed the workflow: no try was left) it
// says so instead of promising a next try.
func TestStatus_IdleStep(t *testing.T) {
	for _, ended := range []bool{false, true} {
		mem := memstore.New(statestore.ProjectorOptions{})
		const runID = "run-idle"
		evs := []*statestore.RunEventWrite{
			storetest.Event(runID, statestore.RunStarted, ""),
			storetest.Event(runID, statestore.StepStarted, "x"),
			storetest.WithPayload(storetest.Event(runID, statestore.RunStepTryEnded, ""),
				map[string]any{"stepId": "x", "stepLogicalAttemptId": 1, "reason": statestore.TryEndedTaskTimedOut}),
		}
		if ended {
			evs = append(evs, storetest.Event(runID, statestore.RunFailed, ""))
		}
		for _, w := range evs {
			if _, err := mem.Append(context.Background(), w); err != nil {
				t.Fatal(err)
			}
		}
		srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: mem}).Handler())
		code, out, errOut := run(t, "status", runID, "--server", srv.URL)
		srv.Close()
		if code != 0 {
			t.Fatalf("status: %d %s", code, errOut)
		}
		var line string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "step") && strings.Contains(l, " x ") {
				line = l
			}
		}
		if !strings.Contains(line, "IDLE") || !strings.Contains(line, statestore.TryEndedTaskTimedOut) {
			t.Fatalf("ended=%v: step line %q, want IDLE with its try's end", ended, line)
		}
		if waits := strings.Contains(line, "waits for its next try"); waits == ended {
			t.Fatalf("ended=%v: step line %q", ended, line)
		}
	}
}
