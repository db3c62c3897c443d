package monitoring_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestMonitoring_Live runs the sidecar binary against the real Conductor,
// scraped by a real Prometheus that loads deploy/prometheus/alerts.yml, and
// drives a pause/drain scenario. Then it checks:
//
//   - promtool check metrics finds nothing to lint in a live /metrics,
//     before and after the scenario;
//   - every target of every dashboard panel, with the Grafana variables
//     substituted as Grafana would, returns data over the scenario's time
//     range (a range query, as a panel does), with at least one value
//     that is not NaN: a misspelt metric or label, or a histogram that
//     never observed anything, fails;
//   - the dashboard's template variables find the sidecar's job and
//     instances;
//   - every alert expression's series exist (below), PAUSE_DRAIN_TIMEOUT
//     fires, and the alerts that should not be active are not.
//
// Two sidecars are scraped. "healthy" talks to the real Conductor and runs
// the scenario. "down" is given a Conductor URL where nothing listens, so
// its polls and Conductor calls fail: the series of WORKER_POLL_ERRORS and
// ENGINE_UNAVAILABLE then exist with real values, and their conditions are
// true on "down" (pending, since their `for` outlasts the test) and false on
// "healthy".
//
// Alert expressions are checked honestly like this: each expression is
// evaluated with every comparison against a number replaced by `>= -Inf`
// (true for every real value), which keeps the selectors, aggregations
// and vector matching (`and on (job, instance)`) of the rule but not its
// threshold; that must return a series for each instance. Then the
// unchanged expression must return data exactly where the alert should be
// active: PAUSE_DRAIN_TIMEOUT on "healthy", ENGINE_UNAVAILABLE and
// WORKER_POLL_ERRORS on "down", PROJECTOR_LAG_HIGH and INVALID_TRANSITION
// nowhere. An absent(v) expression has no threshold: v must return a
// series for each instance and absent(v) none. Finally /api/v1/alerts must
// show PAUSE_DRAIN_TIMEOUT firing.
//
// It runs only when SIDECAR_TEST_MONITORING_LIVE=1 too (.ci/run runs it on
// its own after go test ./...). Each sidecar polls a task domain of its own,
// so tasks of other sidecars on the same Conductor never reach it, and its
// own never reach them.
func TestMonitoring_Live(t *testing.T) {
	conductor := conductortest.URL(t)
	if os.Getenv("SIDECAR_TEST_MONITORING_LIVE") != "1" {
		t.Skip("set SIDECAR_TEST_MONITORING_LIVE=1 (with SIDECAR_TEST_CONDUCTOR_URL) to run the live monitoring test " +
			"(go test -run TestMonitoring_Live ./deploy/monitoring/)")
	}
	promBin, promtoolBin := tool(t, "prometheus"), tool(t, "promtool")

	// Both sidecars run admission control (one active run per plan: the
	// scenario's last plan queues a run) and an event
	// bus sink: a webhook that takes every event but the RunPaused ones,
	// which it refuses for good (dead letters, EVENT_BUS_DELIVERY_FAILED).
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Sidecar-Event-Type") == "RunPaused" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(hook.Close)
	secret := filepath.Join(t.TempDir(), "hook.key")
	if err := os.WriteFile(secret, []byte("monitoring-live-test-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	extra := []string{"--max-active-runs-per-plan", "1", "--bus-sink", "webhook:name=audit,url=" + hook.URL + ",secret-file=" + secret}
	// The healthy sidecar also serves the task proxy and adopts a
	// definition whose one SIMPLE task the scenario's worker runs through
	// it: the "Task proxy" row.
	adopted := adoptedDefinition(t, conductor)
	proxyAddr := sidecartest.FreeAddr(t)
	healthy := startSidecar(t, conductor, "healthy", append([]string{"--conductor-proxy-listen", proxyAddr, "--adopt", adopted}, extra...)...)
	down := startSidecar(t, "http://"+sidecartest.FreeAddr(t)+"/api", "down", extra...)

	for _, s := range []*sidecarProc{healthy, down} {
		checkMetricsLint(t, promtoolBin, s)
	}

	prom := startPrometheus(t, promBin, healthy.addr, down.addr)
	began := time.Now()
	prom.waitTargetsUp(t, 2)

	runScenario(t, healthy)
	runProxyScenario(t, healthy, conductor, proxyAddr, adopted)

	// The scenario's last changes must be scraped (1s) and evaluated (1s);
	// PAUSE_DRAIN_TIMEOUT firing shows the rules have seen the timeout.
	sidecartest.WaitFor(t, "PAUSE_DRAIN_TIMEOUT to fire in Prometheus", 60*time.Second, func() bool {
		return prom.alertState(t, "PAUSE_DRAIN_TIMEOUT", healthy.addr) == "firing"
	})
	sidecartest.WaitFor(t, "ENGINE_UNAVAILABLE and WORKER_POLL_ERRORS to be pending for the sidecar without Conductor", 60*time.Second, func() bool {
		return prom.alertState(t, "ENGINE_UNAVAILABLE", down.addr) != "" && prom.alertState(t, "WORKER_POLL_ERRORS", down.addr) != ""
	})
	time.Sleep(3 * time.Second) // a few more scrapes after the last change
	end := time.Now()

	// Lint again now that the scenario has created the series that appear
	// only with use (labelled counters, observed histograms).
	for _, s := range []*sidecarProc{healthy, down} {
		checkMetricsLint(t, promtoolBin, s)
	}

	t.Run("NoRequestTextInLabels", func(t *testing.T) {
		checkLabelValues(t, httpGet(t, "http://"+healthy.addr+"/metrics"))
	})
	t.Run("DashboardTargets", func(t *testing.T) {
		checkDashboard(t, prom, began, end)
	})
	t.Run("AlertExpressions", func(t *testing.T) {
		checkAlertExprs(t, prom, healthy.addr, down.addr)
	})
	t.Run("ActiveAlerts", func(t *testing.T) {
		want := map[[2]string]bool{
			{"PAUSE_DRAIN_TIMEOUT", healthy.addr}:       true,
			{"ENGINE_UNAVAILABLE", down.addr}:           true,
			{"WORKER_POLL_ERRORS", down.addr}:           true,
			{"EVENT_BUS_DELIVERY_FAILED", healthy.addr}: true,
		}
		for _, a := range prom.alerts(t) {
			k := [2]string{a.Labels["alertname"], a.Labels["instance"]}
			if !want[k] {
				t.Errorf("unexpected alert %s on %s (%s): %v", k[0], k[1], a.State, a.Annotations["description"])
			}
		}
		if s := prom.alertState(t, "PAUSE_DRAIN_TIMEOUT", healthy.addr); s != "firing" {
			t.Errorf("PAUSE_DRAIN_TIMEOUT on %s: state %q, want firing", healthy.addr, s)
		}
	})
}

// ---------------------------------------------------------------- scenario

// runScenario drives the healthy sidecar through what the dashboard and the
// alerts show: one pause that drains, one that times out
// (PAUSE_DRAIN_TIMEOUT), resumes that complete both runs, a cancel, and
// refused control requests (409 and 404).
//
// The steps that must still be running when their run is paused or
// cancelled wait for a gate file the test creates when it is done with
// them, so how long anything takes on a busy machine changes nothing.
func runScenario(t *testing.T, s *sidecarProc) {
	ctx := context.Background()
	server := "http://" + s.addr
	gates := t.TempDir()
	gate := func(name string) (argv, path string) {
		path = filepath.Join(gates, name)
		js, _ := json.Marshal([]string{"sh", "-c", "while [ ! -e '" + path + "' ]; do sleep 0.1; done"})
		return string(js), path
	}
	release := func(path string) {
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	drainArgv, drainGate := gate("drain")
	slowArgv, slowGate := gate("slow")
	neverArgv, _ := gate("never")
	// drains: parallel steps that end once the run is paused, within the
	// pause's own drain timeout (1m).
	drains := submitPlan(t, s, `{"planId":"`+uniq("mon-drain")+`","planVersion":"1","steps":[
		{"stepId":"p1","executor":{"type":"command","argv":`+drainArgv+`}},
		{"stepId":"p2","executor":{"type":"command","argv":`+drainArgv+`}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["p1","p2"]}]}`)
	// times out: parallel steps that run until the 3s drain timeout has
	// passed.
	slow := submitPlan(t, s, `{"planId":"`+uniq("mon-timeout")+`","planVersion":"1","steps":[
		{"stepId":"s1","executor":{"type":"command","argv":`+slowArgv+`}},
		{"stepId":"s2","executor":{"type":"command","argv":`+slowArgv+`}},
		{"stepId":"after","executor":{"type":"sleep","seconds":0.2},"dependsOn":["s1","s2"]}]}`)
	// cancelled while running.
	doomed := submitPlan(t, s, `{"planId":"`+uniq("mon-cancel")+`","planVersion":"1","steps":[
		{"stepId":"long","executor":{"type":"command","argv":`+neverArgv+`}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["long"]}]}`)

	// held: a step fails for good under onStepFailure "pause": the run is
	// paused and the worker holds the task (hands it back to Conductor).
	held := submitPlan(t, s, `{"planId":"`+uniq("mon-held")+`","planVersion":"1","onStepFailure":"pause","steps":[
		{"stepId":"fails","executor":{"type":"command","argv":["sh","-c","exit 4"]}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["fails"]}]}`)

	started := func(id string, steps ...string) {
		sidecartest.WaitFor(t, "the first steps of "+id+" to start", 60*time.Second, func() bool {
			evs := events(t, s, id)
			for _, st := range steps {
				if !hasEvent(evs, statestore.StepStarted, st) {
					return false
				}
			}
			return true
		})
	}
	// Only the runs about to be paused are waited for here: doomed's
	// command may need a slot that p1 or p2 frees (sidecar_command runs 4
	// at a time), and drains must still be running when it is paused.
	started(drains, "p1", "p2")
	started(slow, "s1", "s2")

	// Both pauses wait (sidecar pause --wait): 0 when drained, 3 on
	// PAUSE_DRAIN_TIMEOUT. drains' steps end once its pause is recorded.
	var wg sync.WaitGroup
	codes := make([]int, 2)
	outs := make([]string, 2)
	for i, args := range [][]string{{drains, "--timeout", "1m"}, {slow}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], outs[i] = runCLI(append(append([]string{"pause"}, args...), "--wait", "--server", server)...)
		}()
	}
	sidecartest.WaitFor(t, "the pause of "+drains+" to be recorded", 2*time.Minute, func() bool {
		return hasEvent(events(t, s, drains), statestore.RunPaused, "")
	})
	release(drainGate)
	wg.Wait()
	if codes[0] != 0 {
		t.Fatalf("pause --wait of the run whose steps end after the pause: exit %d, want 0 (drained)\n%s", codes[0], outs[0])
	}
	if codes[1] != 3 || !strings.Contains(outs[1], "PAUSE_DRAIN_TIMEOUT") {
		t.Fatalf("pause --wait of the run whose steps outlast its 3s drain timeout: exit %d, want 3 (PAUSE_DRAIN_TIMEOUT)\n%s", codes[1], outs[1])
	}
	release(slowGate)

	started(doomed, "long")

	// Refused: resume of a running run is an invalid transition (409), a
	// pause of an unknown run is not found (404).
	var apiErr *httpapi.Error
	if _, err := s.client.Resume(ctx, doomed); !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict {
		t.Fatalf("resume of a running run: %v, want HTTP 409", err)
	}
	if _, err := s.client.Pause(ctx, "no-such-run-"+uniq("x"), 0, ""); !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
		t.Fatalf("pause of an unknown run: %v, want HTTP 404", err)
	}
	if v, err := s.client.Cancel(ctx, doomed, "monitoring test"); err != nil || v.Status != statestore.RunStatusCancelled {
		t.Fatalf("cancel: %v %v", v, err)
	}
	sidecartest.WaitFor(t, "the failed step's task to be held (handed back)", 60*time.Second, func() bool {
		return strings.Contains(httpGet(t, server+"/metrics"), "sidecar_worker_tasks_handed_back_total{")
	})
	if v, err := s.client.Cancel(ctx, held, "monitoring test"); err != nil || v.Status != statestore.RunStatusCancelled {
		t.Fatalf("cancel of the held run: %v %v", v, err)
	}

	// The timed-out run's steps keep running and complete; then both runs
	// resume and complete.
	sidecartest.WaitFor(t, "the timed-out run's steps to complete", 60*time.Second, func() bool {
		evs := events(t, s, slow)
		return hasEvent(evs, statestore.StepCompleted, "s1") && hasEvent(evs, statestore.StepCompleted, "s2")
	})
	for _, id := range []string{drains, slow} {
		if code, out := runCLI("resume", id, "--server", server); code != 0 {
			t.Fatalf("resume %s: exit %d\n%s", id, code, out)
		}
	}
	for _, id := range []string{drains, slow} {
		sidecartest.WaitFor(t, "run "+id+" to complete", 60*time.Second, func() bool {
			v, err := s.client.Run(ctx, id)
			return err == nil && v.Status == statestore.RunStatusCompleted
		})
	}

	// Admission control: two runs of one plan under one active run per
	// plan; the second is QUEUED and starts when the first ends.
	queued := `{"planId":"` + uniq("mon-queue") + `","planVersion":"1","steps":[{"stepId":"s","executor":{"type":"sleep","seconds":1}}]}`
	first := submitPlan(t, s, queued)
	second := submitPlan(t, s, queued)
	for _, id := range []string{first, second} {
		sidecartest.WaitFor(t, "run "+id+" to complete", 60*time.Second, func() bool {
			v, err := s.client.Run(ctx, id)
			return err == nil && v.Status == statestore.RunStatusCompleted
		})
	}
	if evs := events(t, s, second); len(evs) == 0 || evs[0].EventType != statestore.RunQueued {
		t.Fatalf("the second run of the plan was not queued: %v", evs)
	}
}

// adoptedDefinition registers a workflow definition of one SIMPLE task,
// of a task type of the same name, and returns the name.
func adoptedDefinition(t *testing.T, conductor string) string {
	t.Helper()
	name := uniq("mon_adopted")
	def, _ := json.Marshal(map[string]any{"name": name, "version": 1, "schemaVersion": 2, "ownerEmail": "monitoring@example.com",
		"tasks": []map[string]any{{"name": name, "taskReferenceName": "work", "type": "SIMPLE",
			"taskDefinition": map[string]any{"name": name, "retryCount": 0, "timeoutSeconds": 0, "responseTimeoutSeconds": 60}}}})
	conductorCall(t, http.MethodPost, conductor+"/metadata/workflow", def)
	return name
}

// runProxyScenario starts a workflow of the adopted definition in
// Conductor and runs its task as an outside worker would, through the
// task proxy: polled (StepStarted appended before the worker has it) and
// completed; the run completes in the log.
func runProxyScenario(t *testing.T, s *sidecarProc, conductor, proxyAddr, name string) {
	body, _ := json.Marshal(map[string]any{"name": name, "version": 1, "input": map[string]any{}})
	runID := strings.TrimSpace(conductorCall(t, http.MethodPost, conductor+"/workflow", body))
	var task struct {
		TaskID             string `json:"taskId"`
		WorkflowInstanceID string `json:"workflowInstanceId"`
	}
	sidecartest.WaitFor(t, "the adopted workflow's task through the task proxy", 60*time.Second, func() bool {
		out := conductorCall(t, http.MethodGet, "http://"+proxyAddr+"/api/tasks/poll/batch/"+name+"?count=1&timeout=500&workerid=monitoring", nil)
		var tasks []json.RawMessage
		if json.Unmarshal([]byte(out), &tasks) != nil || len(tasks) == 0 {
			return false
		}
		if err := json.Unmarshal(tasks[0], &task); err != nil {
			t.Fatal(err)
		}
		return true
	})
	update, _ := json.Marshal(map[string]any{"taskId": task.TaskID, "workflowInstanceId": task.WorkflowInstanceID, "status": "COMPLETED", "workerId": "monitoring"})
	conductorCall(t, http.MethodPost, "http://"+proxyAddr+"/api/tasks", update)
	sidecartest.WaitFor(t, "the adopted run "+runID+" to complete", 60*time.Second, func() bool {
		v, err := s.client.Run(context.Background(), runID)
		return err == nil && v.Status == statestore.RunStatusCompleted
	})
}

// conductorCall sends body (JSON, or nothing) to u and returns the
// answer; a status other than 200 or 204 fails the test.
func conductorCall(t *testing.T, method, u string, body []byte) string {
	t.Helper()
	req, err := http.NewRequest(method, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNoContent {
		t.Fatalf("%s %s: %s\n%s", method, u, resp.Status, b)
	}
	return string(b)
}

func submitPlan(t *testing.T, s *sidecarProc, js string) string {
	t.Helper()
	p, err := plan.Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	started, err := s.client.Start(context.Background(), httpapi.StartRequest{
		TenantID: "t-mon", ProjectID: "p-mon", EnvironmentID: "test", RunRequestID: uniq("req"), Plan: p,
	})
	if err != nil {
		t.Fatal(err)
	}
	return started.RunID
}

func events(t *testing.T, s *sidecarProc, runID string) []statestore.RunEventRecord {
	t.Helper()
	page, err := s.client.Events(context.Background(), runID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return page.Events
}

func hasEvent(evs []statestore.RunEventRecord, eventType, stepID string) bool {
	for _, e := range evs {
		if e.EventType == eventType && e.StepID == stepID {
			return true
		}
	}
	return false
}

// runCLI runs a client subcommand of the sidecar binary and returns its
// exit code and combined output.
func runCLI(args ...string) (int, string) {
	var out bytes.Buffer
	code := (&sidecartest.Main{Stdout: &out, Stderr: &out}).Run(context.Background(), args)
	return code, out.String()
}

func uniq(prefix string) string { return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()) }

// ---------------------------------------------------------------- checks

// checkMetricsLint runs promtool check metrics on a live scrape.
func checkMetricsLint(t *testing.T, promtoolBin string, s *sidecarProc) {
	t.Helper()
	body := httpGet(t, "http://"+s.addr+"/metrics")
	if !strings.Contains(body, "sidecar_conductor_requests_total") {
		t.Fatalf("/metrics of %s has no sidecar metrics:\n%.2000s", s.name, body)
	}
	cmd := exec.Command(promtoolBin, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Errorf("promtool check metrics on the %s sidecar's /metrics: %v\n%s", s.name, err, out)
	}
}

// requestText matches what the scenario's requests chose: run ids (UUIDs),
// its tenant, project and environment ids, plan ids and reasons.
var requestText = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|t-mon|p-mon|mon-(drain|timeout|cancel|held|queue)|monitoring test`)

// checkLabelValues: no label value of a scrape carries text a request
// chose (a run id, a tenant, a plan id, a reason): the metrics listener
// serves the metrics without a token (docs/operations.md, "Monitoring").
func checkLabelValues(t *testing.T, body string) {
	t.Helper()
	n := 0
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "#") || !strings.Contains(line, "{") {
			continue
		}
		n++
		labels := line[strings.Index(line, "{") : strings.LastIndex(line, "}")+1]
		if m := requestText.FindString(labels); m != "" {
			t.Errorf("a label value carries %q: %s", m, line)
		}
	}
	if n < 50 {
		t.Fatalf("only %d labelled samples in the scrape", n)
	}
}

// grafanaVars are the values Grafana gives the dashboard's variables here:
// the job of the scrape config, all instances (the variable's default,
// allValue .*), and the interval variables for a range of a few minutes
// on a data source with the default 15s scrape interval ($__rate_interval
// = 4 x 15s).
func grafanaVars(rng time.Duration) *strings.Replacer {
	return strings.NewReplacer(
		"${datasource}", "prom", "$datasource", "prom",
		"$__rate_interval", "1m", "${__rate_interval}", "1m",
		"$__interval", "15s", "${__interval}", "15s",
		"$__range", fmt.Sprintf("%ds", int(rng.Seconds())), "${__range}", fmt.Sprintf("%ds", int(rng.Seconds())),
		"$job", "sidecar", "${job}", "sidecar",
		"$instance", ".*", "${instance}", ".*",
	)
}

type dashboard struct {
	SchemaVersion int `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Panels     []panel         `json:"panels"`
	Targets    []struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T) *dashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/sidecar-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("sidecar-dashboard.json: %v", err)
	}
	return &d
}

// allPanels flattens rows (a collapsed row keeps its panels inside).
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

func checkDashboard(t *testing.T, prom *prometheus, from, to time.Time) {
	d := loadDashboard(t)
	vars := grafanaVars(to.Sub(from))
	n := 0
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			n++
			expr := vars.Replace(tg.Expr)
			if strings.Contains(expr, "$") {
				t.Errorf("panel %q %s: a variable is left after substitution: %s", p.Title, tg.RefID, expr)
				continue
			}
			res, err := prom.queryRange(expr, from, to, time.Second)
			if err != nil {
				t.Errorf("panel %q %s: %v\n  %s", p.Title, tg.RefID, err, expr)
				continue
			}
			if len(res) == 0 {
				t.Errorf("panel %q %s: no data\n  %s", p.Title, tg.RefID, expr)
				continue
			}
			if !anyNumber(res) {
				t.Errorf("panel %q %s: only NaN values (%d series)\n  %s", p.Title, tg.RefID, len(res), expr)
			}
		}
	}
	if n < 30 {
		t.Errorf("the dashboard has %d targets: the JSON did not decode as expected", n)
	}
	// The job and instance variables (label_values(metric{...}, label))
	// find the scraped sidecars.
	re := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: query %s: %v", v.Name, v.Query, err)
			continue
		}
		m := re.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: not a label_values query: %s", v.Name, q.Query)
			continue
		}
		values, err := prom.labelValues(m[2], vars.Replace(m[1]))
		if err != nil || len(values) == 0 {
			t.Errorf("variable %s (%s): values %v, %v", v.Name, q.Query, values, err)
		}
	}
}

// absentArg returns v of an expression absent(v).
func absentArg(expr string) (string, bool) {
	inner, ok := strings.CutPrefix(strings.TrimSpace(expr), "absent(")
	if !ok || !strings.HasSuffix(inner, ")") {
		return "", false
	}
	return strings.TrimSuffix(inner, ")"), true
}

// thresholds matches a comparison with a number literal (never a label
// matcher, whose value is quoted).
var thresholds = regexp.MustCompile(`(>=|<=|==|!=|>|<)\s*(bool\s+)?[0-9][0-9.eE+-]*`)

func checkAlertExprs(t *testing.T, prom *prometheus, healthy, down string) {
	// Where each alert's unchanged expression must return data.
	activeOn := map[string][]string{
		"PAUSE_DRAIN_TIMEOUT": {healthy},
		"PROJECTOR_LAG_HIGH":  nil,
		"INVALID_TRANSITION":  nil,
		// Counters the projector exports from start; no hole and no
		// restored log in this test.
		"PROJECTOR_NON_CONTIGUOUS_FETCH_DETECTED": nil,
		"PROJECTOR_SNAPSHOT_MISMATCH":             nil,
		"ENGINE_UNAVAILABLE":                      {down},
		"WORKER_POLL_ERRORS":                      {down},
		// Nothing is stuck in this test; the gauge exists on both from start.
		"STUCK_WORKFLOW": nil,
		// No task waits 10 minutes for a worker in this test; the gauge
		// exists on both from start.
		"TASK_WAITING_FOR_WORKER": nil,
		// No run's workflow is lost in this test; the counter exists from start.
		"WORKFLOW_NOT_FOUND": nil,
		// The webhook refuses the healthy sidecar's RunPaused events.
		"EVENT_BUS_DELIVERY_FAILED": {healthy},
		// Both sidecars deliver their sink.
		"EVENT_BUS_STALLED": nil,
		// No retention configured: the gauge is 0 from start; the data
		// dir's free space is not falling 4 days' worth in this test.
		"ARCHIVE_FAILING":         nil,
		"DATA_DIR_FULL_PREDICTED": nil,
		// Both are scraped.
		"SIDECAR_DOWN":   nil,
		"SIDECAR_ABSENT": nil,
	}
	// Series that the sidecar creates at their first increment, not at
	// start: on a sidecar that never had a poll error they do not exist,
	// so the check of their existence is made on "down" only. (When
	// taskworkers creates them at start, as the adapter does for its
	// labels, remove the entry: the test then checks both instances.)
	firstEventOnly := map[string]bool{"WORKER_POLL_ERRORS": true}
	rules := loadAlertRules(t)
	for _, r := range rules {
		t.Run(r.Alert, func(t *testing.T) {
			want, ok := activeOn[r.Alert]
			if !ok {
				t.Fatalf("no expectation for alert %s: add it to this test", r.Alert)
			}
			if arg, ok := absentArg(r.Expr); ok {
				// absent(v) has no threshold: v itself must return a
				// series for each instance, and absent(v) nothing.
				res, err := prom.query(arg)
				if err != nil {
					t.Fatalf("%v\n  %s", err, arg)
				}
				for _, inst := range []string{healthy, down} {
					if !hasInstance(res, inst) {
						t.Errorf("%s returns nothing for %s\n  got %v", arg, inst, res)
					}
				}
				if res, err := prom.query(r.Expr); err != nil || len(res) != 0 || len(want) != 0 {
					t.Errorf("%s: %v %v, want no series (want %v)", r.Expr, res, err, want)
				}
				return
			}
			neutral := thresholds.ReplaceAllString(r.Expr, ">= -Inf")
			if neutral == r.Expr {
				t.Fatalf("no threshold found in %s", r.Expr)
			}
			res, err := prom.query(neutral)
			if err != nil {
				t.Fatalf("%v\n  %s", err, neutral)
			}
			for _, inst := range []string{healthy, down} {
				if firstEventOnly[r.Alert] && inst == healthy && !hasInstance(res, inst) {
					t.Logf("%s: no series on %s, which had no error (they appear at the first one)", r.Alert, inst)
					continue
				}
				if !hasInstance(res, inst) {
					t.Errorf("without its threshold the expression returns nothing for %s: its series do not exist\n  %s\n  got %v", inst, neutral, res)
				}
			}
			res, err = prom.query(r.Expr)
			if err != nil {
				t.Fatalf("%v\n  %s", err, r.Expr)
			}
			for _, inst := range []string{healthy, down} {
				should := false
				for _, w := range want {
					should = should || w == inst
				}
				if got := hasInstance(res, inst); got != should {
					t.Errorf("condition on %s: true=%v, want %v\n  %s\n  got %v", inst, got, should, r.Expr, res)
				}
			}
		})
	}
}

// ---------------------------------------------------------------- processes

type sidecarProc struct {
	name   string
	addr   string
	client *httpapi.Client
}

// startSidecar runs "sidecar serve" with a 3s drain timeout and a worker
// id and task domain of its own (package sidecartest stops it when the
// test ends). It waits for /readyz when Conductor should answer, for
// /healthz otherwise.
func startSidecar(t *testing.T, conductorURL, name string, extra ...string) *sidecarProc {
	t.Helper()
	probe := "/readyz"
	if name == "down" {
		probe = "/healthz"
	}
	s := sidecartest.Start(t, sidecartest.Options{
		ConductorURL: conductorURL,
		Name:         "mon-" + name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		Args:         append([]string{"--drain-timeout", "3s"}, extra...),
		Probe:        probe,
		ReadyWithin:  30 * time.Second,
	})
	return &sidecarProc{name: name, addr: s.Addr, client: httpapi.NewClient(s.URL())}
}

func httpGet(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", u, resp.Status, b)
	}
	return string(b)
}

// ---------------------------------------------------------------- Prometheus

type prometheus struct {
	base string
}

// startPrometheus runs a Prometheus on loopback that scrapes the targets
// every second and evaluates alerts.yml every second.
func startPrometheus(t *testing.T, bin string, targets ...string) *prometheus {
	t.Helper()
	rules, err := filepath.Abs(filepath.Join(repoRoot, "deploy/prometheus/alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = strconv.Quote(tg)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: sidecar
    static_configs:
      - targets: [%s]
`, strconv.Quote(rules), strings.Join(quoted, ", "))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := sidecartest.FreeAddr(t)
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	sidecartest.StartProcess(t, cmd, addr)
	p := &prometheus{base: "http://" + addr}
	sidecartest.WaitFor(t, "prometheus to be ready", 60*time.Second, func() bool {
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
	Values [][]any           `json:"values"`
}

type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
}

func (p *prometheus) api(path string, params url.Values, out any) error {
	resp, err := http.PostForm(p.base+path, params)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var env struct {
		Status    string          `json:"status"`
		Error     string          `json:"error"`
		ErrorType string          `json:"errorType"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, env.ErrorType, env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

func (p *prometheus) query(expr string) ([]promSeries, error) {
	var d struct {
		ResultType string       `json:"resultType"`
		Result     []promSeries `json:"result"`
	}
	err := p.api("/api/v1/query", url.Values{"query": {expr}}, &d)
	if err == nil && d.ResultType != "vector" {
		err = fmt.Errorf("result type %s, want vector", d.ResultType)
	}
	return d.Result, err
}

func (p *prometheus) queryRange(expr string, from, to time.Time, step time.Duration) ([]promSeries, error) {
	var d struct {
		Result []promSeries `json:"result"`
	}
	err := p.api("/api/v1/query_range", url.Values{
		"query": {expr},
		"start": {strconv.FormatInt(from.Unix(), 10)},
		"end":   {strconv.FormatInt(to.Unix(), 10)},
		"step":  {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)},
	}, &d)
	return d.Result, err
}

func (p *prometheus) labelValues(label, match string) ([]string, error) {
	var values []string
	resp, err := http.Get(p.base + "/api/v1/label/" + label + "/values?" + url.Values{"match[]": {match}}.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var env struct {
		Status string   `json:"status"`
		Error  string   `json:"error"`
		Data   []string `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return nil, err
	}
	if env.Status != "success" {
		return nil, errors.New(env.Error)
	}
	values = env.Data
	return values, nil
}

func (p *prometheus) alerts(t *testing.T) []promAlert {
	t.Helper()
	var d struct {
		Alerts []promAlert `json:"alerts"`
	}
	resp, err := http.Get(p.base + "/api/v1/alerts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(env.Data, &d); err != nil {
		t.Fatal(err)
	}
	return d.Alerts
}

// alertState returns the state (pending, firing) of an alert on an
// instance, or "" when it is not active.
func (p *prometheus) alertState(t *testing.T, name, instance string) string {
	t.Helper()
	for _, a := range p.alerts(t) {
		if a.Labels["alertname"] == name && a.Labels["instance"] == instance {
			return a.State
		}
	}
	return ""
}

// waitTargetsUp waits until n targets are scraped successfully.
func (p *prometheus) waitTargetsUp(t *testing.T, n int) {
	t.Helper()
	sidecartest.WaitFor(t, fmt.Sprintf("prometheus to scrape %d sidecars", n), 60*time.Second, func() bool {
		res, err := p.query(`up{job="sidecar"} == 1`)
		return err == nil && len(res) == n
	})
}

func hasInstance(res []promSeries, instance string) bool {
	for _, s := range res {
		if s.Metric["instance"] == instance {
			return true
		}
	}
	return false
}

// anyNumber reports whether a range result has a value that is not NaN.
func anyNumber(res []promSeries) bool {
	for _, s := range res {
		for _, v := range s.Values {
			if len(v) == 2 {
				if str, ok := v[1].(string); ok {
					if f, err := strconv.ParseFloat(str, 64); err == nil && !math.IsNaN(f) {
						return true
					}
				}
			}
		}
	}
	return false
}
