package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestAudit_WindowOnPersistedAt: an audit entry's time is when the log
// persisted the action (persistedAt, the store's clock), and --since
// selects on it, not on the producer's emittedAt. The producers' clocks
// here are three hours off the store's, one ahead and one behind, so the
// two windows would pick opposite actions.
func TestAudit_WindowOnPersistedAt(t *testing.T) {
	ctx := context.Background()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mem := memstore.New(statestore.ProjectorOptions{})
	var storeNow time.Time
	mem.Now = func() time.Time { return storeNow }
	appendAt := func(w *statestore.RunEventWrite, persisted, emitted time.Time) {
		t.Helper()
		storeNow = persisted
		w.EmittedAt = emitted.Format(time.RFC3339Nano)
		if _, err := mem.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	const runID = "run-audit-clocks"
	appendAt(storetest.Event(runID, statestore.RunStarted, ""), base.Add(9*time.Hour), base.Add(9*time.Hour))
	// The pause: persisted at 10:00, emitted by a clock 3 h ahead (13:00).
	appendAt(storetest.WithPayload(storetest.Event(runID, statestore.RunPaused, ""), map[string]any{"reason": "ahead", "requestedBy": "ops"}),
		base.Add(10*time.Hour), base.Add(13*time.Hour))
	// The resume: persisted at 12:00, emitted by a clock 3 h behind (09:00).
	appendAt(storetest.WithPayload(storetest.Event(runID, statestore.RunResumed, ""), map[string]any{"reason": "behind", "requestedBy": "ops"}),
		base.Add(12*time.Hour), base.Add(9*time.Hour))

	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: mem}).Handler())
	t.Cleanup(srv.Close)
	audit := func(args ...string) []auditEntry {
		t.Helper()
		code, out, errOut := run(t, append([]string{"audit", runID, "--server", srv.URL, "-o", "json"}, args...)...)
		if code != 0 {
			t.Fatalf("audit %v: exit %d: %s", args, code, errOut)
		}
		var es []auditEntry
		if err := json.Unmarshal([]byte(out), &es); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return es
	}
	all := audit()
	if len(all) != 2 || all[0].Action != "pause" || all[1].Action != "resume" {
		t.Fatalf("entries %+v, want pause then resume", all)
	}
	for i, want := range []time.Time{base.Add(10 * time.Hour), base.Add(12 * time.Hour)} {
		if at := all[i].at(); !at.Equal(want) {
			t.Fatalf("%s at %s, want its persistedAt %s", all[i].Action, all[i].At, want.Format(time.RFC3339))
		}
	}
	since := audit("--since", base.Add(11*time.Hour).Format(time.RFC3339))
	var got []string
	for _, e := range since {
		got = append(got, e.Action+" ("+e.Reason+")")
	}
	if strings.Join(got, ", ") != "resume (behind)" {
		t.Fatalf("--since 11:00: %v, want the resume alone (persisted 12:00; emitted 09:00)", got)
	}
}
