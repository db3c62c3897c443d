package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// The web console in a real browser: Debian's headless Chromium
// (deploy/local/chromium.sh installs it), driven with chromedp.

// browser starts a headless Chromium with a fresh profile and returns a
// tab's context. Without Chromium the test is skipped, except under CI,
// where it fails.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := os.Getenv("SIDECAR_TEST_CHROMIUM")
	if path == "" {
		for _, name := range []string{"chromium", "chromium-browser"} {
			if p, err := exec.LookPath(name); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no chromium: CI runs the console's browser test (deploy/local/chromium.sh installs Debian's package)")
		}
		t.Skip("no chromium on PATH: deploy/local/chromium.sh installs Debian's package (SIDECAR_TEST_CHROMIUM names another)")
	}
	// The profile is removed after the browser: a helper process of
	// Chromium can still write into it for a moment after the browser
	// exits, which t.TempDir's removal reports as a failure.
	profile, err := os.MkdirTemp("", "sidecar-console-profile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 20 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile), chromedp.WindowSize(1280, 800),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start chromium %s: %v", path, err)
	}
	return ctx
}

// screenshotDir is where the console test saves its screenshots
// (SIDECAR_CONSOLE_SCREENSHOTS, else a directory under the temp dir).
func screenshotDir(t *testing.T) string {
	dir := os.Getenv("SIDECAR_CONSOLE_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "sidecar-console-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	var png []byte
	act(t, ctx, "screenshot "+name, chromedp.FullScreenshot(&png, 100))
	path := filepath.Join(screenshotDir(t), name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", path)
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	var v T
	if err := chromedp.Run(ctx, chromedp.Evaluate(js, &v, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) })); err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// waitPage waits until the page says it has rendered view (its
// data-ready attribute).
func waitPage(t *testing.T, ctx context.Context, view string) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Run(tctx, chromedp.WaitVisible(`html[data-ready="`+view+`"]`, chromedp.ByQuery)); err != nil {
		var body string
		_ = chromedp.Run(ctx, chromedp.Evaluate(`document.body.innerText`, &body))
		t.Fatalf("page %s not rendered: %v\n%s", view, err, body)
	}
}

// act runs actions within 30 s; on failure it shows the page's text.
func act(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Run(tctx, actions...); err != nil {
		var body string
		_ = chromedp.Run(ctx, chromedp.Evaluate(`document.body.innerText`, &body))
		t.Fatalf("%s: %v\npage:\n%s", what, err, body)
	}
}

func navigate(t *testing.T, ctx context.Context, url, view string) {
	t.Helper()
	if err := chromedp.Run(ctx, chromedp.Evaluate(`delete document.documentElement.dataset.ready`, nil), chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, view)
}

func login(t *testing.T, ctx context.Context, base, token string) {
	t.Helper()
	act(t, ctx, "login", chromedp.Navigate(base+"/ui/runs"), chromedp.WaitVisible(`#token`, chromedp.ByID),
		chromedp.SendKeys(`#token`, token, chromedp.ByID), chromedp.Click(`.login button[type=submit]`, chromedp.ByQuery))
	waitPage(t, ctx, "runs")
}

// TestE2E_Console drives the console in headless Chromium against the
// real sidecar and Conductor: sign in with a token (a cookie session),
// pause a run from its page with a reason (RunPaused requestedBy is the
// principal), watch it in the run list go DRAINING -> PAUSED with its
// in-flight count falling, run a bulk dry run and confirm it, read the
// audit; a viewer sees no control and a forged control POST from its
// session is 403. One screenshot per page.
func TestE2E_Console(t *testing.T) {
	t.Parallel() // its own serve and data dir
	ctx := browser(t)
	dir := t.TempDir()
	opsToken, opsEntry := newToken(t, "oncall-alice", "operator,viewer,submitter")
	viewToken, viewEntry := newToken(t, "vic-viewer", "viewer")
	tokens := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokens, []byte("principals:\n"+opsEntry+viewEntry), 0o600); err != nil {
		t.Fatal(err)
	}
	// Four 10-minute steps of the bulk runs and one of the late run run at once.
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--tokens-file", tokens, "--concurrency", "command=8")
	p.client.Token = opsToken
	base := "http://" + p.addr
	team := uniq("console")
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-console")+`","planVersion":"1","steps":[
		{"stepId":"prepare","executor":{"type":"noop"}},
		{"stepId":"extract-a","executor":{"type":"command","argv":["sleep","5"]},"dependsOn":["prepare"]},
		{"stepId":"extract-b","executor":{"type":"command","argv":["sleep","8"]},"dependsOn":["prepare"]},
		{"stepId":"extract-c","executor":{"type":"command","argv":["sleep","11"]},"dependsOn":["prepare"]},
		{"stepId":"publish","executor":{"type":"noop"},"dependsOn":["extract-a","extract-b","extract-c"]}]}`)
	long := mustPlan(t, `{"planId":"`+uniq("e2e-console-long")+`","planVersion":"1","steps":[
		{"stepId":"load-a","executor":{"type":"command","argv":["sleep","600"]}},
		{"stepId":"load-b","executor":{"type":"command","argv":["sleep","600"]}},
		{"stepId":"report","executor":{"type":"noop"},"dependsOn":["load-a","load-b"]}]}`)
	startPlan := func(pl *plan.Plan, labels map[string]string) string {
		started, err := p.client.Start(context.Background(), httpapi.StartRequest{TenantID: "acme", ProjectID: "data", EnvironmentID: "prod",
			RunRequestID: uniq("req"), Plan: pl, Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		return started.RunID
	}
	start := func(labels map[string]string) string { return startPlan(pl, labels) }
	inFlight := func(runID string, n int) {
		sidecartest.WaitFor(t, fmt.Sprintf("%d steps of %s in flight", n, runID), 60*time.Second, func() bool {
			v, err := p.client.Run(context.Background(), runID)
			return err == nil && len(v.InFlight()) >= n
		})
	}

	login(t, ctx, base, opsToken)
	if cookies := eval[string](t, ctx, `document.cookie`); strings.Contains(cookies, httpapi.SessionCookie) {
		t.Fatalf("the session cookie is readable by script: %q", cookies)
	}
	runID := start(map[string]string{"team": team, "tier": "gold"})
	inFlight(runID, 3)

	// The run's page: graph, timeline; pause with a reason.
	navigate(t, ctx, base+"/ui/runs/"+runID, "run")
	if n := eval[int](t, ctx, `document.querySelectorAll("svg.graph g[aria-label]").length`); n != 5 {
		t.Fatalf("step graph has %d steps, want the plan's 5", n)
	}
	screenshot(t, ctx, "run-running")
	act(t, ctx, "pause from the run's page",
		chromedp.Click(`//summary[text()="Pause"]`, chromedp.BySearch),
		chromedp.SendKeys(`details[open] input[name=reason]`, "disk pressure on db-7", chromedp.ByQuery),
		chromedp.Click(`details[open] button[type=submit]`, chromedp.ByQuery))
	sidecartest.WaitFor(t, "the run page to show DRAINING", 20*time.Second, func() bool {
		return eval[string](t, ctx, `document.documentElement.dataset.runStatus || ""`) == "PAUSED/DRAINING"
	})
	// What the operator reads (Execution Semantics §6.5): PAUSED with the
	// DRAINING substatus and the message.
	if text := eval[string](t, ctx, `document.querySelector("main").innerText`); !strings.Contains(text, "PAUSED (DRAINING)") ||
		!regexp.MustCompile(`Workflow paused\. Waiting for \d+ in-flight tasks? to complete\.`).MatchString(text) {
		t.Fatalf("the draining run's page does not show PAUSED (DRAINING) and the message:\n%s", text)
	}
	screenshot(t, ctx, "run-draining")
	var paused *statestore.RunEventRecord
	for _, ev := range allEvents(t, p, runID) {
		if ev.EventType == statestore.RunPaused {
			paused = &ev
		}
	}
	var pay struct{ RequestedBy, Reason string }
	if paused != nil {
		_ = json.Unmarshal(paused.Payload, &pay)
	}
	if paused == nil || pay.RequestedBy != "oncall-alice" || pay.Reason != "disk pressure on db-7" {
		t.Fatalf("RunPaused %+v, want requestedBy oncall-alice and the reason typed", pay)
	}

	// The run list, filtered by label (the URL carries the filter): the
	// row goes DRAINING -> PAUSED and its in-flight count falls; its steps
	// are counted against the plan's.
	navigate(t, ctx, base+"/ui/runs?labelSelector=team%3D"+team, "runs")
	screenshot(t, ctx, "runs-draining")
	row := `(() => { const r = document.querySelector('tr[data-run="` + runID + `"]'); return r ? r.cells[2].innerText + "|" + r.cells[4].innerText : ""; })()`
	var seen []string
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) {
		s := eval[string](t, ctx, row)
		if len(seen) == 0 || seen[len(seen)-1] != s {
			seen = append(seen, s)
		}
		if strings.HasPrefix(s, "PAUSED|") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The list follows the log within its documented lag (a poll
	// interval, docs/operations.md): the row may still say RUNNING when
	// the page first loads after the pause.
	for len(seen) > 0 && strings.HasPrefix(seen[0], "RUNNING|") {
		seen = seen[1:]
	}
	if len(seen) < 3 || seen[len(seen)-1] != "PAUSED|0" || !strings.Contains(seen[0], "DRAINING") {
		t.Fatalf("the list row went %q; want DRAINING with a falling in-flight count, then PAUSED|0", seen)
	}
	t.Logf("run list row over the drain: %q", seen)
	// Steps done of the plan's 5 (not of the 4 the log has seen): prepare
	// and the three extracts the drain waited for; publish waits for the
	// resume.
	steps := `document.querySelector('tr[data-run="` + runID + `"]').cells[3].innerText`
	if got := eval[string](t, ctx, steps); got != "4/5" {
		t.Fatalf("the paused run's steps read %q, want 4/5 (done of the plan's steps)", got)
	}
	screenshot(t, ctx, "runs")

	// Bulk: two more runs, a dry run listing them and their in-flight
	// steps, then the action. Before them, a run paused at once.
	early := startPlan(long, map[string]string{"team": team})
	inFlight(early, 1)
	if _, err := p.client.Pause(context.Background(), early, 60, "held back"); err != nil {
		t.Fatal(err)
	}
	batch := uniq("batch")
	bulkRuns := []string{startPlan(long, map[string]string{"team": team, "batch": batch}), startPlan(long, map[string]string{"team": team, "batch": batch})}
	for _, id := range bulkRuns {
		inFlight(id, 1)
	}
	// The running runs, live: the early run, resumed, joins them in its
	// place, newest first (below the two started after it), not on top.
	navigate(t, ctx, base+"/ui/runs?labelSelector=team%3D"+team+"&status=RUNNING", "runs")
	eval[bool](t, ctx, `(() => { window.placed = ""; const tb = document.querySelector("#runs tbody");
		new MutationObserver(() => { const rows = [...tb.children]; const i = rows.findIndex((r) => r.dataset.run === "`+early+`");
			if (i >= 0 && !window.placed) window.placed = (i + 1) + "/" + rows.length; }).observe(tb, {childList: true}); return true; })()`)
	if _, err := p.client.Resume(context.Background(), early); err != nil {
		t.Fatal(err)
	}
	sidecartest.WaitFor(t, "the resumed run in the live list", 20*time.Second, func() bool { return eval[string](t, ctx, `window.placed`) != "" })
	if placed := eval[string](t, ctx, `window.placed`); placed != "3/3" {
		t.Fatalf("the resumed early run was placed at row %s of the live list, want 3/3 (newest first)", placed)
	}
	if _, err := p.client.Cancel(context.Background(), early, "test over"); err != nil {
		t.Fatal(err)
	}
	navigate(t, ctx, base+"/ui/runs?labelSelector=batch%3D"+batch, "runs")
	act(t, ctx, "bulk dry run", chromedp.Navigate(base+"/ui/bulk?action=pause&labelSelector=batch%3D"+batch),
		chromedp.WaitVisible(`input[name=reason]`, chromedp.ByQuery),
		chromedp.SendKeys(`input[name=reason]`, "maintenance window", chromedp.ByQuery),
		chromedp.Click(`//button[text()="Dry run"]`, chromedp.BySearch),
		chromedp.WaitVisible(`#bulk-confirm`, chromedp.ByID))
	dry := eval[string](t, ctx, `document.getElementById("bulk-result").innerText`)
	for _, want := range append(bulkRuns, "Dry run: pause would touch 2 runs", "load-") {
		if !strings.Contains(dry, want) {
			t.Fatalf("dry run does not show %q:\n%s", want, dry)
		}
	}
	for _, id := range bulkRuns {
		if v, _ := p.client.Run(context.Background(), id); v.Status != "RUNNING" {
			t.Fatalf("the dry run changed run %s: %s", id, v.Status)
		}
	}
	screenshot(t, ctx, "bulk-dry-run")
	// A run that begins to match after the dry run is not one the
	// operator confirmed: it is not touched.
	late := startPlan(long, map[string]string{"team": team, "batch": batch})
	inFlight(late, 1)
	act(t, ctx, "bulk confirm", chromedp.Click(`#bulk-confirm`, chromedp.ByID),
		chromedp.WaitVisible(`//h2[text()="pause: done"]`, chromedp.BySearch))
	for _, id := range bulkRuns {
		if v, _ := p.client.Run(context.Background(), id); v.Status != "PAUSED" {
			t.Fatalf("bulk pause: run %s is %s", id, v.Status)
		}
	}
	if v, _ := p.client.Run(context.Background(), late); v.Status != "RUNNING" {
		t.Fatalf("bulk pause confirmed for the dry run's 2 runs: the run started after it is %s, want RUNNING", v.Status)
	}
	time.Sleep(2 * time.Second) // one round of the progress box
	screenshot(t, ctx, "bulk")

	navigate(t, ctx, base+"/ui/audit?labelSelector=team%3D"+team, "audit")
	audit := eval[string](t, ctx, `document.getElementById("audit").innerText`)
	if strings.Count(audit, "oncall-alice") < 3 || !strings.Contains(audit, "disk pressure on db-7") || !strings.Contains(audit, "maintenance window") {
		t.Fatalf("audit does not show the three pauses by oncall-alice with their reasons:\n%s", audit)
	}
	screenshot(t, ctx, "audit")
	navigate(t, ctx, base+"/ui/bus", "bus")
	screenshot(t, ctx, "bus")

	// Back works: the browser's history returns to the audit view.
	act(t, ctx, "back", chromedp.NavigateBack())
	waitPage(t, ctx, "audit")

	// A viewer: no control on the run's page; a forged POST from its
	// session (with its CSRF token, or without) is 403 and changes nothing.
	act(t, ctx, "sign out", chromedp.Click(`#logout`, chromedp.ByID), chromedp.WaitVisible(`#token`, chromedp.ByID))
	login(t, ctx, base, viewToken)
	navigate(t, ctx, base+"/ui/runs/"+runID, "run")
	if n := eval[int](t, ctx, `document.querySelectorAll("details.action").length`); n != 0 {
		t.Fatalf("the viewer sees %d control forms", n)
	}
	screenshot(t, ctx, "run-viewer")
	// Nor a bulk action: no link to it, and its page has no form (the API
	// refuses a viewer's dry run too).
	if hidden := eval[bool](t, ctx, `document.querySelector('nav a[data-view="bulk"]').hidden`); !hidden {
		t.Fatal("the viewer's navigation links to the bulk actions")
	}
	navigate(t, ctx, base+"/ui/bulk?action=pause", "bulk")
	if n := eval[int](t, ctx, `document.querySelectorAll("input[name=reason]").length`); n != 0 {
		t.Fatalf("the viewer's bulk page has %d forms", n)
	}
	navigate(t, ctx, base+"/ui/runs/"+runID, "run")
	forged := eval[string](t, ctx, `(async () => {
		const s = await (await fetch("/ui/session")).json();
		const post = (h) => fetch("/v1/runs/`+runID+`/resume", {method: "POST", headers: {"Content-Type": "application/json", ...h}, body: '{"reason":"x"}'});
		const a = await post({"X-CSRF-Token": s.csrfToken}), b = await post({});
		return a.status + " " + (await a.json()).code + "|" + b.status + " " + (await b.json()).code;
	})()`)
	if forged != "403 FORBIDDEN|403 CSRF_TOKEN_INVALID" {
		t.Fatalf("forged POSTs of a viewer's session: %s, want 403 FORBIDDEN|403 CSRF_TOKEN_INVALID", forged)
	}
	if v, _ := p.client.Run(context.Background(), runID); v.Status != "PAUSED" {
		t.Fatalf("after the forged resume the run is %s", v.Status)
	}

	// A phone-sized viewport renders the list.
	if err := chromedp.Run(ctx, chromedp.EmulateViewport(390, 844)); err != nil {
		t.Fatal(err)
	}
	navigate(t, ctx, base+"/ui/runs?labelSelector=team%3D"+team, "runs")
	screenshot(t, ctx, "runs-phone")
	if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); w > 400 {
		t.Fatalf("the run list is %d px wide on a 390 px viewport", w)
	}
}

// TestConsole_TenThousandRunsFirstScreen measures (reports, does not
// assert) how long the run list takes to show its first screen in
// headless Chromium with 10,000 runs in the list: the API over the
// embedded JetStream store and the real run list (BENCHMARKS.md).
func TestConsole_TenThousandRunsFirstScreen(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: appends 10,000 runs")
	}
	ctx := browser(t)
	bg := context.Background()
	js, _ := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{})
	store, err := natsstore.Open(bg, js, natsstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := runlist.Open(bg, js, runlist.Options{Log: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = list.Close(context.Background()) })
	const runs = 10000
	began := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < runs; i += 8 {
				ev := storetest.WithPayload(storetest.Event(fmt.Sprintf("bench-run-%05d", i), statestore.RunStarted, ""),
					map[string]any{"engineType": "conductor", "labels": map[string]string{"team": []string{"data", "ml", "web"}[i%3]}})
				if _, err := store.Append(bg, ev); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(bg, 2*time.Minute)
	defer cancel()
	if _, err := list.WaitIndexed(wctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d runs appended and listed in %s", runs, time.Since(began).Round(time.Millisecond))
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: store, List: list}).Handler())
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() }) // the page's watch waits up to 30 s
	var firsts []string
	for i := 0; i < 5; i++ {
		navigate(t, ctx, srv.URL+"/ui/runs", "runs")
		firsts = append(firsts, eval[string](t, ctx, `document.documentElement.dataset.firstScreenMs + " ms (list request and render " + document.documentElement.dataset.listMs + " ms)"`))
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("#runs tbody tr").length`); n != 100 {
		t.Fatalf("first screen shows %d rows, want a page of 100", n)
	}
	t.Logf("run list with %d runs, first screen from navigation start (5 loads): %s", runs, strings.Join(firsts, "; "))
}
