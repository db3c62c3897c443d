package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_ConductorStatusNotifications: a Conductor whose workflow status
// listener posts to the sidecar (deploy/local/conductor.sh with
// CONDUCTOR_NOTIFY_URL and CONDUCTOR_NOTIFY_SECRET_FILE; the sidecar with
// --conductor-notify-secret-file). A pause, a resume and a terminate made
// in Conductor's own API are recorded as the watcher records them; on a
// Conductor that notifies them (3.32: all three; 3.21: the terminate
// only) within a few seconds, the others by the watcher's pass. The test
// logs each delay (BENCHMARKS.md). It starts its own Conductor
// (CONDUCTOR_VERSION, memory store) and runs when
// SIDECAR_TEST_CONDUCTOR_NOTIFY=1.
func TestE2E_ConductorStatusNotifications(t *testing.T) {
	t.Parallel() // its own serve and data dir
	if os.Getenv("SIDECAR_TEST_CONDUCTOR_NOTIFY") != "1" {
		t.Skip("SIDECAR_TEST_CONDUCTOR_NOTIFY=1 starts a Conductor that notifies status changes (deploy/local/conductor.sh)")
	}
	version := os.Getenv("CONDUCTOR_VERSION")
	if version == "" {
		version = "3.21.14"
	}
	pausesNotified := !strings.HasPrefix(version, "3.21.")
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "notify-secret")
	if err := os.WriteFile(secretFile, []byte("e2e-notify-secret-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := sidecartest.FreeAddr(t)
	conductorURL := startNotifyingConductor(t, "http://"+addr, secretFile)
	p := newProc(sidecartest.Start(t, sidecartest.Options{ConductorURL: conductorURL, Addr: addr,
		Args: []string{"--conductor-notify-secret-file", secretFile}}))

	pl := mustPlan(t, `{"planId":"`+uniq("e2e-notify")+`","planVersion":"1","steps":[
		{"stepId":"long","executor":{"type":"command","argv":["sleep","600"]}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["long"]}]}`)
	// A Conductor that has just started may not answer in time on a
	// loaded machine; a start is idempotent on its request id.
	var started *httpapi.Started
	sidecartest.WaitFor(t, "the run to start", 2*time.Minute, func() bool {
		var err error
		started, err = p.client.Start(context.Background(), httpapi.StartRequest{
			TenantID: "t-e2e", ProjectID: "p-e2e", EnvironmentID: "test", RunRequestID: "req-1", Plan: pl,
		})
		if err != nil && errcode.CodeOf(err) != adapter.CodeEngineUnavailable {
			t.Fatal(err)
		}
		return err == nil
	})
	sidecartest.WaitFor(t, "long to start", 60*time.Second, func() bool {
		return eventIndex(allEvents(t, p, started.RunID), statestore.StepStarted, "long", 0) >= 0
	})
	call := func(method, path string) {
		t.Helper()
		req, err := http.NewRequest(method, conductorURL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, body)
		}
	}
	// recorded waits for the n-th eventType after the action made at
	// began, and returns the delay.
	recorded := func(what, eventType string, n int, began time.Time, notified bool) time.Duration {
		t.Helper()
		within := 60 * time.Second // the watcher's pass: 2 s scans, one run read in turn at 20 a second
		if notified {
			within = 10 * time.Second // a generous bound: the notification arrives in well under a second
		}
		for {
			evs := allEvents(t, p, started.RunID)
			if count(evs, eventType, "") >= n {
				d := time.Since(began)
				for _, e := range evs {
					if e.EventType == eventType && eventType != statestore.RunFailed && !strings.Contains(string(e.Payload), `"requestedBy":"conductor"`) {
						t.Fatalf("%s payload %s, want requestedBy conductor", eventType, e.Payload)
					}
				}
				return d
			}
			if time.Since(began) > within {
				t.Fatalf("Conductor %s: %s made in Conductor not recorded as %s within %s; log %v", version, what, eventType, within, types(evs))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	by := map[bool]string{true: "notified", false: "the watcher's pass"}
	report := func(what string, ds []time.Duration, notified bool) {
		slices.Sort(ds)
		t.Logf("Conductor %s: %s made in Conductor recorded after median %s, min %s, max %s over %d (%s)", version, what,
			ds[len(ds)/2].Round(time.Millisecond), ds[0].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), len(ds), by[notified])
	}
	wf := "/workflow/" + started.WorkflowID
	const cycles = 5
	var pauses, resumes []time.Duration
	for i := 1; i <= cycles; i++ {
		began := time.Now()
		call("PUT", wf+"/pause")
		pauses = append(pauses, recorded("pause", statestore.RunPaused, i, began, pausesNotified))
		began = time.Now()
		call("PUT", wf+"/resume")
		resumes = append(resumes, recorded("resume", statestore.RunResumed, i, began, pausesNotified))
	}
	report("a pause", pauses, pausesNotified)
	report("a resume", resumes, pausesNotified)
	began := time.Now()
	call("DELETE", wf+"?reason=e2e+terminate")
	report("a terminate", []time.Duration{recorded("terminate", statestore.RunFailed, 1, began, true)}, true)
	// Every notification answered, by code: 3.32's three (pause, resume,
	// terminate) at least. An answer is counted once the handler has
	// returned, which may be after the watcher it woke recorded the
	// event (and a notification Conductor sent late, after the watcher's
	// scan recorded the action, is counted when it comes): waited for.
	answered := notificationAnswers(t, p)
	if pausesNotified {
		deadline := time.Now().Add(15 * time.Second)
		for answered["202"] < 2*cycles+1 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			answered = notificationAnswers(t, p)
		}
	}
	t.Logf("notifications answered: %v", answered)
	if pausesNotified && answered["202"] < 2*cycles+1 {
		t.Fatalf("notifications answered %v, want %d or more 202s", answered, 2*cycles+1)
	}
	for code := range answered {
		if code != "202" {
			t.Fatalf("notifications answered %v, want 202 only", answered)
		}
	}
}

// startNotifyingConductor starts a Conductor of its own (startConductor)
// whose status listener posts to the sidecar at sidecarURL with the
// secret in secretFile, and returns its API URL.
func startNotifyingConductor(t *testing.T, sidecarURL, secretFile string) string {
	t.Helper()
	return startConductor(t, "CONDUCTOR_NOTIFY_URL="+sidecarURL, "CONDUCTOR_NOTIFY_SECRET_FILE="+secretFile)
}

// startConductor starts a Conductor (deploy/local/conductor.sh,
// CONDUCTOR_VERSION, memory store) in a directory and on a port of its
// own, with env added to conductor.sh's environment, and returns its API
// URL; it stops with t.
func startConductor(t *testing.T, env ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "conductor-own-")
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	env = append(append(os.Environ(), "CONDUCTOR_STORE=memory", "CONDUCTOR_STATE_DIR="+dir, "CONDUCTOR_PORT="+strconv.Itoa(port)), env...)
	run := func(command string) {
		cmd := exec.Command(filepath.Join("..", "deploy", "local", "conductor.sh"), command)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("conductor.sh %s: %v\n%s", command, err, out)
		}
	}
	t.Cleanup(func() {
		run("stop")
		_ = os.RemoveAll(dir)
	})
	run("start")
	return "http://127.0.0.1:" + strconv.Itoa(port) + "/api"
}

// notificationAnswers is sidecar_api_requests_total{route="conductor_status"}
// by code.
func notificationAnswers(t *testing.T, p *proc) map[string]int {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := map[string]int{}
	for _, l := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(l, `sidecar_api_requests_total{code="`)
		if !ok || !strings.Contains(l, `route="conductor_status"`) {
			continue
		}
		code, _, _ := strings.Cut(rest, `"`)
		n, _ := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		out[code] += int(n)
	}
	return out
}
