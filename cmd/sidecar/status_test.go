package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// TestStatus_IdleStep: a step whose try ended (its outside worker died)
// shows IDLE with why; while the run runs it waits for its next try, and
// once the run ended (Conductor failed the workflow: no try was left) it
// says so instead of promising a next try.
func TestStatus_IdleStep(t *testing.T) {
	for _, ended := range []bool{false, true} {
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
		out := statusOf(t, runID, evs)
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

// TestStatus_HeldStepRetryCommandIsQuoted: the retry command status
// suggests for a held step is safe to paste into a shell whatever the
// step id a plan's author chose: quoted as one word, and after -- when it
// starts with a dash.
func TestStatus_HeldStepRetryCommandIsQuoted(t *testing.T) {
	for step, want := range map[string]string{
		"build":                 "sidecar retry run-held build",
		"x; touch /tmp/PWNED #": `sidecar retry run-held 'x; touch /tmp/PWNED #'`,
		`it's`:                  `sidecar retry run-held 'it'\''s'`,
		"-rf":                   "sidecar retry -- run-held -rf",
	} {
		const runID = "run-held"
		out := statusOf(t, runID, []*statestore.RunEventWrite{
			storetest.Event(runID, statestore.RunStarted, ""),
			storetest.Event(runID, statestore.StepStarted, step),
			storetest.WithPayload(storetest.Event(runID, statestore.StepFailed, step),
				map[string]any{"error": map[string]any{"code": "COMMAND_FAILED", "message": "exit status 1"}, "onStepFailure": "pause"}),
		})
		if !strings.Contains(out, "(retry it: "+want+")") {
			t.Fatalf("step %q: status printed\n%s\nwant the command %s", step, out, want)
		}
	}
}

// statusOf runs "sidecar status runID" against an API over a log holding evs.
func statusOf(t *testing.T, runID string, evs []*statestore.RunEventWrite) string {
	t.Helper()
	mem := memstore.New(statestore.ProjectorOptions{})
	for _, w := range evs {
		if _, err := mem.Append(context.Background(), w); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: mem}).Handler())
	defer srv.Close()
	code, out, errOut := run(t, "status", runID, "--server", srv.URL)
	if code != 0 {
		t.Fatalf("status: %d %s", code, errOut)
	}
	return out
}

// TestStatus_ArchivedRunIsMarked: the text status of a run read from the
// archive (it left hot state) says so, as -o json does with "archived".
func TestStatus_ArchivedRunIsMarked(t *testing.T) {
	ctx := context.Background()
	_, dir, r, _ := writeArchive(t)
	a, err := archive.Open(ctx, archive.NewDir(dir), archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: memstore.New(statestore.ProjectorOptions{}), Archive: a}).Handler())
	defer srv.Close()
	code, out, errOut := run(t, "status", r.ID, "--server", srv.URL)
	if code != 0 {
		t.Fatalf("status: %d %s", code, errOut)
	}
	if !strings.Contains(out, "status    COMPLETED (archived") {
		t.Fatalf("status of an archived run printed\n%s\nwant it marked archived", out)
	}
}

// TestMain_APIFailuresExitByKind: a command the API refused exits with the
// kind of the answer (not found 4, unavailable 6), and with -o json writes
// the failure as one JSON object, the API's code in it; a sidecar that
// does not answer is unavailable too.
func TestMain_APIFailuresExitByKind(t *testing.T) {
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: memstore.New(statestore.ProjectorOptions{})}).Handler())
	defer srv.Close()
	// Another server (Conductor's, say) at --server: its 404 is not the
	// sidecar's "no such run", and a script must not take it for one.
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"status":404,"message":"No static resource v1/runs/x."}`))
	}))
	defer other.Close()
	for _, tc := range []struct {
		args     []string
		code     int
		jsonCode string
	}{
		{[]string{"status", "no-such-run", "--server", srv.URL}, exitNotFound, "RUN_NOT_FOUND"},
		{[]string{"pause", "no-such-run", "--reason", "x", "--server", srv.URL}, exitUnavailable, "NOT_READY"},
		{[]string{"status", "r1", "--server", "http://127.0.0.1:1"}, exitUnavailable, "SIDECAR_UNAVAILABLE"},
		{[]string{"status", "r1", "--server", other.URL}, exitError, "HTTP_404"},
	} {
		code, out, errOut := run(t, tc.args...)
		if code != tc.code || out != "" {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q; want exit %d", tc.args, code, out, errOut, tc.code)
		}
		code, out, errOut = run(t, append(tc.args, "-o", "json")...)
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(errOut), &e); err != nil || code != tc.code || out != "" || e.Error.Code != tc.jsonCode || e.Error.Message == "" {
			t.Fatalf("%v -o json: exit %d, stdout %q, stderr %q (%v); want exit %d and {\"error\": {\"code\": %q, ...}}", tc.args, code, out, errOut, err, tc.code, tc.jsonCode)
		}
	}
}

// TestRuns_UnreadableManifestsWarn: a listing of archived runs that passed
// over manifests it could not read says so on stderr, whatever the output
// format, so that a script does not take the listing for complete.
func TestRuns_UnreadableManifestsWarn(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		l := httpapi.RunList{Runs: []httpapi.ListedRun{}, Unreadable: []httpapi.UnreadableManifest{{From: 2, Through: 2, Code: "ARCHIVE_CORRUPT"}, {From: 4, Through: 9, Code: "ARCHIVE_MANIFEST_MISSING"}}}
		_ = json.NewEncoder(w).Encode(l)
	}))
	defer srv.Close()
	for _, args := range [][]string{{"runs", "--archived", "--server", srv.URL}, {"runs", "--archived", "--server", srv.URL, "-o", "json"}} {
		code, _, errOut := run(t, args...)
		if code != 0 || !strings.Contains(errOut, "manifest 2 could not be read (ARCHIVE_CORRUPT)") || !strings.Contains(errOut, "manifests 4 to 9 could not be read (ARCHIVE_MANIFEST_MISSING)") {
			t.Fatalf("%v: exit %d, stderr %q; want a warning naming each", args, code, errOut)
		}
	}
}

// TestRuns_ArchiveDownKeepsTheHotRuns: while the archive cannot be read, a
// listing with --archived prints the runs in hot state the API gave before
// the archive's page failed, then the failure (exit 6); before, it printed
// no run at all.
func TestRuns_ArchiveDownKeepsTheHotRuns(t *testing.T) {
	ctx := context.Background()
	_, dir, _, _ := writeArchive(t)
	a, err := archive.Open(ctx, archive.NewDir(dir), archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := natstest.Start(t)
	store, err := natsstore.Open(ctx, js, natsstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	for _, w := range []*statestore.RunEventWrite{storetest.Event("run-hot-1", statestore.RunStarted, ""), storetest.Event("run-hot-1", statestore.RunCompleted, "")} {
		if _, err := store.Append(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	list, err := runlist.Open(ctx, js, runlist.Options{Log: store, Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = list.Close(ctx) })
	if _, err := list.WaitIndexed(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: store, List: list, Archive: a}).Handler())
	defer srv.Close()
	if err := os.Rename(dir, dir+".away"); err != nil { // the volume is not mounted
		t.Fatal(err)
	}
	code, out, errOut := run(t, "runs", "--archived", "--server", srv.URL)
	if code != exitUnavailable || !strings.Contains(out, "run-hot-1") || !strings.Contains(errOut, archive.CodeUnavailable) {
		t.Fatalf("exit %d\nstdout %q\nstderr %q\nwant exit %d, the hot run listed and the archive's failure", code, out, errOut, exitUnavailable)
	}
}
