package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// apiWithRun serves the API over a log holding one started run.
func apiWithRun(t *testing.T, runID string) string {
	t.Helper()
	mem := memstore.New(statestore.ProjectorOptions{})
	if _, err := mem.Append(context.Background(), storetest.Event(runID, statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: mem}).Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestCLI_FlagsAnywhere: flags may come before, between or after the
// positional arguments, as kubectl takes them; after "--" an argument is
// positional even when it starts with a dash.
func TestCLI_FlagsAnywhere(t *testing.T) {
	const runID = "run-flags-anywhere"
	url := apiWithRun(t, runID)
	var outs []string
	for _, args := range [][]string{
		{"status", runID, "-o", "json", "--server", url},
		{"status", "-o", "json", runID, "--server", url},
		{"status", "-o", "json", "--server", url, runID},
		{"status", "-o", "json", "--server", url, "--", runID},
	} {
		code, out, errOut := run(t, args...)
		if code != exitOK || !strings.Contains(out, `"runId": "`+runID+`"`) {
			t.Fatalf("%v: exit %d stdout %q stderr %q; want the run as JSON", args, code, out, errOut)
		}
		outs = append(outs, out)
	}
	for _, o := range outs[1:] {
		if o != outs[0] {
			t.Fatalf("outputs differ by where the flags are:\n%s\n%s", outs[0], o)
		}
	}
	// audit takes a RUN_ID after its flags too (it used to read it as
	// the many-runs form).
	if code, out, errOut := run(t, "audit", "-o", "json", "--server", url, runID); code != exitOK || strings.TrimSpace(out) != "[]" {
		t.Fatalf("audit -o json ... RUN_ID: exit %d stdout %q stderr %q", code, out, errOut)
	}
	// A second positional is still refused.
	if code, _, errOut := run(t, "status", runID, "extra", "--server", url); code != exitUsage || !strings.Contains(errOut, `unexpected argument "extra"`) {
		t.Fatalf("status RUN extra: exit %d stderr %q; want exit 2 naming extra", code, errOut)
	}
}

// TestCLI_OutputYAMLAndName: -o yaml prints the resource as YAML in the
// JSON's field order, -o name its id alone.
func TestCLI_OutputYAMLAndName(t *testing.T) {
	const runID = "run-output-formats"
	url := apiWithRun(t, runID)
	code, out, errOut := run(t, "status", runID, "-o", "yaml", "--server", url)
	if code != exitOK || !strings.HasPrefix(out, "runId: "+runID+"\n") || !strings.Contains(out, "\nstatus: RUNNING\n") {
		t.Fatalf("-o yaml: exit %d stdout %q stderr %q", code, out, errOut)
	}
	code, out, errOut = run(t, "status", runID, "-o", "name", "--server", url)
	if code != exitOK || out != runID+"\n" {
		t.Fatalf("-o name: exit %d stdout %q stderr %q; want the run id alone", code, out, errOut)
	}
	// events prints records, not named resources: -o name is refused.
	if code, _, errOut := run(t, "events", runID, "-o", "name", "--server", url); code != exitUsage || !strings.Contains(errOut, "-o must be one of text, json") {
		t.Fatalf("events -o name: exit %d stderr %q; want exit 2", code, errOut)
	}
}

// TestCLI_ServerWithoutScheme: SIDECAR_SERVER=host:port works, as kubectl
// takes --server; a nonsense address is a usage error naming --server.
func TestCLI_ServerWithoutScheme(t *testing.T) {
	const runID = "run-server-no-scheme"
	url := apiWithRun(t, runID)
	t.Setenv("SIDECAR_SERVER", strings.TrimPrefix(url, "http://"))
	if code, out, errOut := run(t, "status", runID, "-o", "name"); code != exitOK || out != runID+"\n" {
		t.Fatalf("SIDECAR_SERVER without scheme: exit %d stdout %q stderr %q", code, out, errOut)
	}
	t.Setenv("SIDECAR_SERVER", "ftp://127.0.0.1:1")
	if code, _, errOut := run(t, "status", runID); code != exitUsage || !strings.Contains(errOut, "--server") {
		t.Fatalf("ftp server: exit %d stderr %q; want exit 2 naming --server", code, errOut)
	}
}

// TestCLI_BusWithoutSinks: a sidecar without an event bus says so, not
// "no such endpoint".
func TestCLI_BusWithoutSinks(t *testing.T) {
	url := apiWithRun(t, "run-bus")
	code, out, errOut := run(t, "bus", "--server", url)
	if code != exitOK || out != "" || !strings.Contains(errOut, "no event bus") || strings.Contains(errOut, "no such endpoint") {
		t.Fatalf("bus: exit %d stdout %q stderr %q; want exit 0 and a note that there is no bus", code, out, errOut)
	}
	code, _, errOut = run(t, "bus", "deadletters", "--server", url)
	if code != exitError || !strings.Contains(errOut, "no event bus") {
		t.Fatalf("bus deadletters: exit %d stderr %q", code, errOut)
	}
}

// TestControl_HelpShowsBothForms: "pause -h" shows the single run's flags
// and the bulk form's (-l, --dry-run), and exits 0.
func TestControl_HelpShowsBothForms(t *testing.T) {
	for _, action := range []string{"pause", "resume", "cancel"} {
		code, out, _ := run(t, action, "-h")
		if code != exitOK {
			t.Fatalf("%s -h: exit %d", action, code)
		}
		for _, want := range []string{"Usage: sidecar " + action + " RUN_ID", "-reason", "-l string", "-dry-run", "Examples:"} {
			if !strings.Contains(out, want) {
				t.Fatalf("%s -h lacks %q:\n%s", action, want, out)
			}
		}
	}
}

// TestBulk_DryRunNeedsNoReason: a preview changes nothing and needs no
// --reason; the action itself does.
func TestBulk_DryRunNeedsNoReason(t *testing.T) {
	url := apiWithRun(t, "run-bulk")
	code, _, errOut := run(t, "pause", "-l", "team=data", "--server", url)
	if code != exitUsage || !strings.Contains(errOut, "--reason is required") {
		t.Fatalf("bulk pause without --reason: exit %d stderr %q; want exit 2", code, errOut)
	}
	// Past the flags' checks, the request reaches the server (which has no
	// run list here: exit 1, not a usage error).
	code, _, errOut = run(t, "pause", "-l", "team=data", "--dry-run", "--server", url)
	if code == exitUsage || strings.Contains(errOut, "--reason") {
		t.Fatalf("bulk pause --dry-run without --reason: exit %d stderr %q; want it sent", code, errOut)
	}
	// A RUN_ID after the flags is the single form: sent to the run's
	// endpoint (which this server, without a drain controller, refuses).
	if code, _, errOut := run(t, "pause", "--reason", "x", "run-bulk", "--server", url); code != exitUnavailable || !strings.Contains(errOut, "does not control runs") {
		t.Fatalf("pause --reason x RUN_ID: exit %d stderr %q; want the single form sent", code, errOut)
	}
}

// TestRunSubmit_CommaLabels: -l takes kubectl's comma list as well as
// repeated flags.
func TestRunSubmit_CommaLabels(t *testing.T) {
	l := labelFlag{}
	for _, v := range []string{"team=data,tier=gold", "zone=eu"} {
		if err := l.Set(v); err != nil {
			t.Fatalf("Set(%q): %v", v, err)
		}
	}
	if got := labelString(l); got != "team=data,tier=gold,zone=eu" {
		t.Fatalf("labels %s", got)
	}
	for _, bad := range []string{"team=data,tier", "team=a,team=b", ",x=1"} {
		if err := (labelFlag{}).Set(bad); err == nil {
			t.Fatalf("Set(%q) accepted", bad)
		}
	}
}

// TestToken_UnknownRole: token new refuses a role serve would refuse, and
// prints no token.
func TestToken_UnknownRole(t *testing.T) {
	code, out, errOut := run(t, "token", "new", "--name", "n", "--roles", "operator,superuser")
	if code != exitUsage || out != "" || !strings.Contains(errOut, `unknown role "superuser"`) {
		t.Fatalf("exit %d stdout %q stderr %q; want exit 2, no token", code, out, errOut)
	}
	code, out, _ = run(t, "token", "new", "--name", "n", "--roles", "viewer, operator")
	if code != exitOK || !strings.Contains(out, "roles: [viewer, operator]") {
		t.Fatalf("exit %d stdout %q", code, out)
	}
}

// TestToken_EntryServeTakes: the entry token new prints, pasted under
// principals:, is one serve loads, and its token authenticates as the
// principal with the scope asked for (a field not asked for matches any).
func TestToken_EntryServeTakes(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  httpapi.Scope
	}{
		{nil, httpapi.Scope{}},
		{[]string{"--tenant-id", "acme"}, httpapi.Scope{TenantID: "acme"}},
		{[]string{"--tenant-id", "acme", "--project-id", "p"}, httpapi.Scope{TenantID: "acme", ProjectID: "p"}},
		{[]string{"--environment-id", "prod"}, httpapi.Scope{EnvironmentID: "prod"}},
		{[]string{"--tenant-id", "a b\"c", "--project-id", "p", "--environment-id", "e"}, httpapi.Scope{TenantID: "a b\"c", ProjectID: "p", EnvironmentID: "e"}},
	} {
		t.Run(strings.Join(tc.flags, " "), func(t *testing.T) {
			code, out, errOut := run(t, append([]string{"token", "new", "--name", "ops", "--roles", "operator"}, tc.flags...)...)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			token, entry, _ := strings.Cut(out, "\n")
			path := filepath.Join(t.TempDir(), "tokens.yaml")
			if err := os.WriteFile(path, []byte("principals:\n"+entry), 0o600); err != nil {
				t.Fatal(err)
			}
			creds, err := httpapi.LoadCredentials(path)
			if err != nil {
				t.Fatalf("serve refuses the printed entry:\n%s\n%v", entry, err)
			}
			r := httptest.NewRequest(http.MethodGet, "/v1/runs", nil)
			r.Header.Set("Authorization", "Bearer "+token)
			p, err := creds.Authenticate(r)
			if err != nil || p.Name != "ops" || p.Scope != tc.want {
				t.Fatalf("the printed token authenticates as %+v, %v; want ops with scope %+v", p, err, tc.want)
			}
		})
	}
}

// TestRunTable_WatchLinesAligned: rows a watch prints later line up with
// the header and the first rows; --no-headers leaves the header out.
func TestRunTable_WatchLinesAligned(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	row := func(id, plan, status string) httpapi.ListedRun {
		var r httpapi.ListedRun
		r.RunID, r.PlanID, r.Status, r.CreatedAt = id, plan, status, now.Format(time.RFC3339)
		return r
	}
	var b bytes.Buffer
	tbl := runTable{out: &b, output: "text", now: func() time.Time { return now }}
	tbl.print([]httpapi.ListedRun{row("run-a", "etl", "RUNNING")}, true)
	tbl.print([]httpapi.ListedRun{row("r", "p", "PAUSED")}, false)
	tbl.print([]httpapi.ListedRun{row("run-b", "etl-nightly", "COMPLETED")}, false)
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("lines %q", lines)
	}
	col := func(line string, n int) int { // start of the n-th column
		fields := strings.Fields(line)
		return strings.Index(line, " "+fields[n]) + 1
	}
	for _, l := range lines[1:3] {
		if col(l, 2) != col(lines[0], 2) {
			t.Fatalf("STATUS column not aligned with the header:\n%s", b.String())
		}
	}
	b.Reset()
	tbl = runTable{out: &b, output: "text", header: true, now: func() time.Time { return now }}
	tbl.print([]httpapi.ListedRun{row("run-a", "etl", "RUNNING")}, true)
	if strings.Contains(b.String(), "RUN ") {
		t.Fatalf("--no-headers printed the header: %q", b.String())
	}
}

// TestRunTable_StepsOfThePlan: STEPS is done of the plan's steps (a
// paused 5-step run with 4 done reads 4/5, not 4/4), done/? when the
// plan could not be read.
func TestRunTable_StepsOfThePlan(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		planSteps int
		want      string
	}{{5, " 4/5 "}, {0, " 4/? "}} {
		var r httpapi.ListedRun
		r.RunID, r.PlanID, r.Status, r.CreatedAt = "run-a", "etl", "PAUSED", now.Format(time.RFC3339)
		r.Steps, r.Done, r.PlanSteps = 4, 4, c.planSteps
		var b bytes.Buffer
		tbl := runTable{out: &b, output: "text", header: true, now: func() time.Time { return now }}
		tbl.print([]httpapi.ListedRun{r}, true)
		if !strings.Contains(b.String(), c.want) {
			t.Fatalf("planSteps %d: got %q, want STEPS %q", c.planSteps, b.String(), c.want)
		}
	}
}

// TestBulkWait_PrintsOnChange: the progress a bulk --wait prints changes
// only when a count does, not as the ETA's time left runs down.
func TestBulkWait_PrintsOnChange(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var r httpapi.ListedRun
	r.RunID, r.Status, r.Substatus, r.InFlight = "r1", "PAUSED", "DRAINING", 2
	r.DrainETA = &runlist.ETA{P50: now.Add(time.Minute).Format(time.RFC3339), P90: now.Add(2 * time.Minute).Format(time.RFC3339)}
	want := map[string]bool{"r1": true}
	a, b := progressOf(want, []httpapi.ListedRun{r}, now), progressOf(want, []httpapi.ListedRun{r}, now.Add(time.Second))
	if a.state != b.state || a.line == b.line {
		t.Fatalf("a second later: state %q -> %q (want the same), line %q -> %q (want the time left down)", a.state, b.state, a.line, b.line)
	}
	r.InFlight = 1
	if c := progressOf(want, []httpapi.ListedRun{r}, now.Add(time.Second)); c.state == b.state {
		t.Fatalf("a step drained, state unchanged: %q", c.state)
	}
}

// TestPauseWait_TimeLeft: single pause --wait shows the time left to the
// drain's deadline, and a new line only when the run changes.
func TestPauseWait_TimeLeft(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v := &httpapi.RunView{RunSnapshot: &statestore.RunSnapshot{RunID: "r1", Status: "PAUSED", Substatus: "DRAINING"},
		Drain: &drain.DrainView{Draining: true, InFlightStepIDs: []string{"load"}, Deadline: now.Add(5 * time.Minute).Format(time.RFC3339)}}
	state, line := waitLine(v, now)
	if !strings.Contains(line, "deadline in 5m0s") || strings.Contains(line, "2026-") {
		t.Fatalf("line %q; want the time left, not the absolute deadline", line)
	}
	if state2, _ := waitLine(v, now.Add(time.Second)); state2 != state {
		t.Fatalf("state changed with the clock: %q -> %q", state, state2)
	}
}

// TestLogger_ConsoleNoStackOnWarn: --log-format console prints a warning
// as one line, without a stack trace.
func TestLogger_ConsoleNoStackOnWarn(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	log, err := newLogger(Config{LogFormat: "console", LogLevel: "info"})
	os.Stderr = saved
	if err != nil {
		t.Fatal(err)
	}
	log.Warn("Plaintext passwords detected")
	_ = log.Sync()
	_ = w.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(r)
	if out := strings.TrimSuffix(b.String(), "\n"); strings.Count(out, "\n") != 0 || !strings.Contains(out, "Plaintext passwords detected") {
		t.Fatalf("warning printed as %q; want one line without a stack trace", out)
	}
}

// TestCompletion_Scripts: the completion scripts parse in their shell and
// complete each command's flags as its -h lists them.
func TestCompletion_Scripts(t *testing.T) {
	for _, shell := range []string{"bash", "zsh"} {
		code, out, errOut := run(t, "completion", shell)
		if code != exitOK || !strings.Contains(out, "complete -o default -F _sidecar sidecar") {
			t.Fatalf("completion %s: exit %d stderr %q", shell, code, errOut)
		}
		for _, want := range []string{"pause) words=\"", "--dry-run", "--no-headers", "deadletters) words=\"", "submit) words=\""} {
			if !strings.Contains(out, want) {
				t.Fatalf("completion %s lacks %q", shell, want)
			}
		}
		if bash, err := exec.LookPath("bash"); err == nil && shell == "bash" {
			cmd := exec.Command(bash, "-n")
			cmd.Stdin = strings.NewReader(out)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("bash -n: %v: %s", err, b)
			}
		}
	}
	if code, _, _ := run(t, "completion", "fish"); code != exitUsage {
		t.Fatalf("completion fish: exit %d, want 2", code)
	}
}

// TestExamplePlans_Parse: the example plans the README submits are valid.
func TestExamplePlans_Parse(t *testing.T) {
	files, err := filepath.Glob("../../deploy/local/plans/*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("plans %v: %v", files, err)
	}
	for _, f := range files {
		if _, err := plan.ParseFile(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestRunSubmit_FailureNamesTheRequestID: a submit that fails after it may
// have started the run (a 5xx answer, a connection cut) prints the
// runRequestId it sent, so that the retry gets that run instead of
// starting a second; a refusal (4xx) started nothing and says nothing of it.
func TestRunSubmit_FailureNamesTheRequestID(t *testing.T) {
	planFile := filepath.Join("..", "..", "deploy", "local", "plans", "diamond.yaml")
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter)
		hint   bool
	}{
		{"StoreUnavailable", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"code":"STORE_UNAVAILABLE","message":"registry: unavailable"}`))
		}, true},
		{"ConnectionCut", func(w http.ResponseWriter) {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		}, true},
		{"Refused", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"code":"PLAN_INVALID","message":"no steps"}`))
		}, false},
		// A serve not ready yet reads no request: nothing started.
		{"NotReady", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"code":"NOT_READY","message":"sidecar serve is starting"}`))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tc.answer(w) }))
			defer srv.Close()
			code, _, errOut := run(t, "run", "submit", planFile, "--server", srv.URL, "--run-request-id", "req-7f3a")
			want := exitUnavailable // the run may have started: retry with the same id
			if !tc.hint && tc.name == "Refused" {
				want = exitError
			}
			if code != want || strings.Contains(errOut, "--run-request-id req-7f3a") != tc.hint {
				t.Fatalf("exit %d stderr %q; want exit %d, the request id named: %v", code, errOut, want, tc.hint)
			}
			if !tc.hint {
				return
			}
			// A generated id is the one named.
			_, _, errOut = run(t, "run", "submit", planFile, "--server", srv.URL)
			if _, after, ok := strings.Cut(errOut, "--run-request-id "); !ok || len(strings.Fields(after)[0]) != 36 {
				t.Fatalf("stderr %q; want the generated UUID named", errOut)
			}
		})
	}
}

// TestEvents_TableNamesTheStepOfRunLevelEvents: a run-level event whose
// payload names a step (a try's end or start, a retry request) shows that
// step and its attempt (a try event's, with the try's engine attempt);
// its own number is shown as the per-run counter it is (a pause's as its
// cycle), not as an attempt.
func TestEvents_TableNamesTheStepOfRunLevelEvents(t *testing.T) {
	var out bytes.Buffer
	c := &EventsCommand{&Main{Stdout: &out}}
	for _, r := range []statestore.RunEventRecord{
		{RunSeq: 5, RunEventWrite: statestore.RunEventWrite{EventType: statestore.StepStarted, StepID: "extract-a", LogicalAttemptID: 1, EngineAttemptID: 2}},
		{RunSeq: 6, RunEventWrite: statestore.RunEventWrite{EventType: statestore.RunStepTryEnded, LogicalAttemptID: 3, Payload: []byte(`{"stepId":"extract-a","stepLogicalAttemptId":1,"engineAttemptId":2,"reason":"workerRestarted"}`)}},
		{RunSeq: 7, RunEventWrite: statestore.RunEventWrite{EventType: statestore.RunPaused, LogicalAttemptID: 2, Payload: []byte(`{"reason":"x"}`)}},
	} {
		if err := c.print("text", &r); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	for i, want := range [][]string{{"extract-a", "attempt 1.2"}, {"extract-a", "attempt 1.2, #3"}, {"cycle 2"}} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d %q lacks %q", i, lines[i], w)
			}
		}
	}
	if strings.Contains(lines[1], "attempt 3") || strings.Contains(lines[2], "attempt") {
		t.Errorf("a run-level event's number shown as an attempt:\n%s", out.String())
	}
}

// TestBusReplay_ExitStatus: a replay exits 0 only when every dead letter
// asked for was delivered; one not found (another tenant's, or no such
// key) or failed again exits 1, in text and in JSON.
func TestBusReplay_ExitStatus(t *testing.T) {
	for _, tc := range []struct {
		answer string
		want   int
	}{
		{`{"results":[{"key":"k1","outcome":"delivered"}],"counts":{"delivered":1}}`, exitOK},
		{`{"results":[{"key":"k1","outcome":"not_found"}],"counts":{"not_found":1}}`, exitError},
		{`{"results":[{"key":"k1","outcome":"failed","error":"500"}],"counts":{"failed":1}}`, exitError},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(tc.answer))
		}))
		for _, o := range []string{"text", "json"} {
			if code, out, errOut := run(t, "bus", "replay", "--sink", "hook", "--key", "k1", "--server", srv.URL, "-o", o); code != tc.want {
				t.Errorf("%s, -o %s: exit %d, want %d\n%s%s", tc.answer, o, code, tc.want, out, errOut)
			}
		}
		srv.Close()
	}
}
