package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// recordingControl is a Control that records what it was asked, so that a
// test sees both "nothing was changed" and the requestedBy of a call.
type recordingControl struct {
	mu     sync.Mutex
	calls  []string // action runId requestedBy reason
	err    error    // returned by every call
	notice string   // State.Notice of every call
	// callers are the callers of Conductor calls each pause's context
	// names (adapter.CallerOf).
	callers []string
}

func (c *recordingControl) record(action, runID, by, reason string) (*drain.State, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, strings.Join([]string{action, runID, by, reason}, " "))
	return &drain.State{RunID: runID, Notice: c.notice}, c.err
}

func (c *recordingControl) Pause(ctx context.Context, runID string, req drain.PauseRequest) (*drain.State, error) {
	c.mu.Lock()
	c.callers = append(c.callers, adapter.CallerOf(ctx))
	c.mu.Unlock()
	return c.record("pause", runID, req.RequestedBy, req.Reason)
}
func (c *recordingControl) Resume(_ context.Context, runID string, req drain.ResumeRequest) (*drain.State, error) {
	return c.record("resume", runID, req.RequestedBy, req.Reason)
}
func (c *recordingControl) Cancel(_ context.Context, runID, reason, by string) (*drain.State, error) {
	return c.record("cancel", runID, by, reason)
}
func (c *recordingControl) RetryStep(_ context.Context, runID, stepID string, req drain.RetryRequest) (*drain.State, error) {
	return c.record("retry", runID, req.RequestedBy, req.Reason)
}
func (c *recordingControl) ResumeLater(_ context.Context, runID string, _ time.Time, req drain.ResumeRequest) (*drain.State, error) {
	return c.record("resume-later", runID, req.RequestedBy, req.Reason)
}

func (c *recordingControl) taken() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls...)
}

// secEnv is an API over a memstore with runs run-t1 (tenant t1) and run-t2
// (tenant t2), a recording Control and, when auth is set, authentication.
type secEnv struct {
	url     string
	control *recordingControl
}

func newSecEnv(t *testing.T, auth httpapi.Authenticator) *secEnv {
	t.Helper()
	store := memstore.New(statestore.ProjectorOptions{})
	for run, tenant := range map[string]string{"run-t1": "t1", "run-t2": "t2"} {
		w := storetest.Event(run, statestore.RunStarted, "")
		w.TenantID = tenant
		if _, err := store.Append(context.Background(), w); err != nil {
			t.Fatal(err)
		}
	}
	rc := &recordingControl{}
	api := httpapi.NewServer(httpapi.Options{Log: store, Control: rc, Auth: auth, Logger: zaptest.NewLogger(t), Gatherer: prometheus.NewRegistry()})
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return &secEnv{url: srv.URL, control: rc}
}

type reply struct {
	status int
	header http.Header
	body   string
	Code   string                        `json:"code"`
	Probs  []struct{ Code, Path string } `json:"problems"`
}

func (e *secEnv) do(t *testing.T, method, path, token, contentType, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return doReply(t, req)
}

// doReply sends req and reads the answer (its JSON error fields, if any).
func doReply(t *testing.T, req *http.Request) reply {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
	_ = json.Unmarshal(b, &r)
	return r
}

// TestServer_StrictInput: each malformed request below (trailing data,
// case-variant or duplicate keys, invalid UTF-8, out-of-range numbers, null
// steps, wrong media type or method, unknown fields) is a 4xx with a
// machine code, and nothing reaches the engine.
func TestServer_StrictInput(t *testing.T) {
	e := newSecEnv(t, nil)
	start := func(s string) string { return s }
	good := `{"planId":"p1","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`
	for _, tc := range []struct {
		name, method, path, ctype, body string
		status                          int
		code                            string
	}{
		{"TrailingData", "POST", "/v1/runs", "application/json", start(`{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":` + good + `} x`), 400, "BAD_REQUEST"},
		{"TrailingDocument", "POST", "/v1/runs", "application/json", `{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":` + good + `}{}`, 400, "BAD_REQUEST"},
		{"CaseVariantKey", "POST", "/v1/runs", "application/json", `{"tenantID":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":` + good + `}`, 400, "BAD_REQUEST"},
		{"DuplicateKey", "POST", "/v1/runs", "application/json", `{"tenantId":"t","tenantId":"u","projectId":"p","environmentId":"e","runRequestId":"r","plan":` + good + `}`, 400, "BAD_REQUEST"},
		{"InvalidUTF8", "POST", "/v1/runs", "application/json", "{\"tenantId\":\"t\",\"projectId\":\"p\",\"environmentId\":\"e\",\"runRequestId\":\"r\xff\",\"plan\":" + good + "}", 400, "BAD_REQUEST"},
		{"PlanNumberOverflow", "POST", "/v1/runs", "application/json", `{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":{"planId":"p1","planVersion":"1","steps":[{"stepId":"a","timeoutSeconds":99999999999999999999,"executor":{"type":"noop"}}]}}`, 400, "PLAN_INVALID"},
		{"PlanNullSteps", "POST", "/v1/runs", "application/json", `{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":{"planId":"p1","planVersion":"1","steps":null}}`, 400, "PLAN_INVALID"},
		{"PlanNullStep", "POST", "/v1/runs", "application/json", `{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":{"planId":"p1","planVersion":"1","steps":[null]}}`, 400, "PLAN_INVALID"},
		{"MediaTypeJSONP", "POST", "/v1/runs", "application/jsonp", `{}`, 415, "BAD_REQUEST"},
		{"WrongMethod", "DELETE", "/v1/runs/run-t1", "", "", 405, "METHOD_NOT_ALLOWED"},
		{"WrongMethodControl", "GET", "/v1/runs/run-t1/pause", "", "", 405, "METHOD_NOT_ALLOWED"},
		{"EventsAfterSeqUnknownRun", "GET", "/v1/runs/no-such-run/events?afterSeq=5", "", "", 404, "RUN_NOT_FOUND"},
		{"PauseUnknownField", "POST", "/v1/runs/run-t1/pause", "application/json", `{"stepId":"a"}`, 400, "BAD_REQUEST"},
		{"PauseTimeoutHuge", "POST", "/v1/runs/run-t1/pause", "application/json", `{"timeoutSeconds":9300000000}`, 400, "BAD_REQUEST"},
		{"PauseTimeoutMaxInt", "POST", "/v1/runs/run-t1/pause", "application/json", `{"timeoutSeconds":9223372036854775807}`, 400, "BAD_REQUEST"},
		{"PauseTimeoutNegative", "POST", "/v1/runs/run-t1/pause", "application/json", `{"timeoutSeconds":-1}`, 400, "BAD_REQUEST"},
		{"ResumeTrailing", "POST", "/v1/runs/run-t1/resume", "application/json", `{"reason":"x"} {}`, 400, "BAD_REQUEST"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(t, tc.method, tc.path, "", tc.ctype, tc.body)
			if r.status != tc.status || r.Code != tc.code {
				t.Fatalf("got %d %s (%s), want %d %s", r.status, r.Code, r.body, tc.status, tc.code)
			}
			if tc.code == "PLAN_INVALID" && len(r.Probs) == 0 {
				t.Fatalf("PLAN_INVALID without problems: %s", r.body)
			}
			if tc.status == 405 && r.header.Get("Allow") == "" {
				t.Fatal("405 without Allow")
			}
		})
	}
	if calls := e.control.taken(); len(calls) != 0 {
		t.Fatalf("bad input reached the engine: %v", calls)
	}
	t.Run("MediaTypeCase", func(t *testing.T) {
		r := e.do(t, "POST", "/v1/runs/run-t1/pause", "", "APPLICATION/JSON; charset=UTF-8", `{"timeoutSeconds":60}`)
		if r.status != 200 {
			t.Fatalf("APPLICATION/JSON: %d %s", r.status, r.body)
		}
	})
	t.Run("EventsAfterEndOfKnownRun", func(t *testing.T) {
		if r := e.do(t, "GET", "/v1/runs/run-t1/events?afterSeq=1000", "", "", ""); r.status != 200 {
			t.Fatalf("afterSeq past the end of a known run: %d %s", r.status, r.body)
		}
	})
	t.Run("ResumeReasonReachesEngine", func(t *testing.T) {
		e.do(t, "POST", "/v1/runs/run-t1/resume", "", "application/json", `{"reason":"dependency back","requestedBy":"alice"}`)
		calls := e.control.taken()
		if last := calls[len(calls)-1]; last != "resume run-t1 alice dependency back" {
			t.Fatalf("resume recorded as %q", last)
		}
	})
}

// writeTokens writes a tokens file and returns its path.
func writeTokens(t *testing.T, dir, content string) string {
	t.Helper()
	path := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func tokensYAML(principals ...string) string {
	return "principals:\n" + strings.Join(principals, "")
}

func principal(name, token, roles, scope string) string {
	s := fmt.Sprintf("  - name: %s\n    tokenSha256: %s\n    roles: [%s]\n", name, httpapi.HashToken(token), roles)
	if scope != "" {
		s += "    scope: {" + scope + "}\n"
	}
	return s
}

// TestServer_Auth: roles, scopes (404 outside), requestedBy from the
// principal, probes open, SIGHUP-style reload.
func TestServer_Auth(t *testing.T) {
	dir := t.TempDir()
	path := writeTokens(t, dir, tokensYAML(
		principal("viewer-t1", "tok-viewer", "viewer", "tenantId: t1"),
		principal("ops", "tok-ops", "operator, viewer", ""),
		principal("ci", "tok-ci", "submitter", "tenantId: t1"),
		principal("root", "tok-admin", "admin", ""),
	))
	creds, err := httpapi.LoadCredentials(path)
	if err != nil {
		t.Fatal(err)
	}
	e := newSecEnv(t, creds)
	plan := `{"planId":"p1","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`
	startIn := func(tenant string) string {
		return `{"tenantId":"` + tenant + `","projectId":"p","environmentId":"e","runRequestId":"r","plan":` + plan + `}`
	}
	for _, tc := range []struct {
		name, method, path, token, body string
		status                          int
		code                            string
	}{
		{"NoToken", "GET", "/v1/runs/run-t1", "", "", 401, "UNAUTHENTICATED"},
		{"BadToken", "GET", "/v1/runs/run-t1", "nope", "", 401, "UNAUTHENTICATED"},
		{"ViewerInScope", "GET", "/v1/runs/run-t1", "tok-viewer", "", 200, ""},
		{"ViewerOutOfScope", "GET", "/v1/runs/run-t2", "tok-viewer", "", 404, "RUN_NOT_FOUND"},
		{"ViewerEventsOutOfScope", "GET", "/v1/runs/run-t2/events", "tok-viewer", "", 404, "RUN_NOT_FOUND"},
		{"ViewerCannotPause", "POST", "/v1/runs/run-t1/pause", "tok-viewer", "", 403, "FORBIDDEN"},
		{"SubmitterCannotRead", "GET", "/v1/runs/run-t1", "tok-ci", "", 403, "FORBIDDEN"},
		{"SubmitterOutOfScope", "POST", "/v1/runs", "tok-ci", startIn("t2"), 403, "FORBIDDEN"},
		{"OperatorCannotStart", "POST", "/v1/runs", "tok-ops", startIn("t1"), 403, "FORBIDDEN"},
		{"ClaimedRequestedBy", "POST", "/v1/runs/run-t2/cancel", "tok-ops", `{"requestedBy":"someone-else"}`, 400, "BAD_REQUEST"},
		{"MetricsNeedsToken", "GET", "/metrics", "", "", 401, "UNAUTHENTICATED"},
		// The totals cover every tenant: not for a scoped principal.
		{"MetricsScopedViewer", "GET", "/metrics", "tok-viewer", "", 403, "FORBIDDEN"},
		{"MetricsViewer", "GET", "/metrics", "tok-ops", "", 200, ""},
		{"Healthz", "GET", "/healthz", "", "", 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct := ""
			if tc.body != "" {
				ct = "application/json"
			}
			r := e.do(t, tc.method, tc.path, tc.token, ct, tc.body)
			if r.status != tc.status || r.Code != tc.code {
				t.Fatalf("got %d %s (%s), want %d %s", r.status, r.Code, r.body, tc.status, tc.code)
			}
			if r.status == 401 && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatal("401 without WWW-Authenticate: Bearer")
			}
			if r.header.Get("X-Content-Type-Options") != "nosniff" || r.header.Get("Cache-Control") != "no-store" {
				t.Fatalf("answer headers %v: want X-Content-Type-Options nosniff and Cache-Control no-store", r.header)
			}
		})
	}
	if calls := e.control.taken(); len(calls) != 0 {
		t.Fatalf("refused requests reached the engine: %v", calls)
	}
	t.Run("RequestedByIsThePrincipal", func(t *testing.T) {
		if r := e.do(t, "POST", "/v1/runs/run-t2/pause", "tok-ops", "application/json", `{"reason":"maintenance"}`); r.status != 200 {
			t.Fatalf("operator pause: %d %s", r.status, r.body)
		}
		if r := e.do(t, "POST", "/v1/runs/run-t2/cancel", "tok-admin", "", ""); r.status != 200 {
			t.Fatalf("admin cancel: %d %s", r.status, r.body)
		}
		want := []string{"pause run-t2 ops maintenance", "cancel run-t2 root "}
		if got := e.control.taken(); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("recorded %q, want %q", got, want)
		}
		// The principal is the caller of the calls to Conductor the
		// request makes (their places are handed out by caller in turn).
		e.control.mu.Lock()
		callers := append([]string(nil), e.control.callers...)
		e.control.mu.Unlock()
		if !slices.Equal(callers, []string{"ops"}) {
			t.Fatalf("the pause's calls to Conductor name callers %q, want the principal [ops]", callers)
		}
	})
	t.Run("Reload", func(t *testing.T) {
		writeTokens(t, dir, tokensYAML(principal("ops", "tok-ops-2", "operator, viewer", "")))
		if err := creds.Reload(); err != nil {
			t.Fatal(err)
		}
		if r := e.do(t, "GET", "/v1/runs/run-t1", "tok-ops", "", ""); r.status != 401 {
			t.Fatalf("old token after reload: %d", r.status)
		}
		if r := e.do(t, "GET", "/v1/runs/run-t1", "tok-ops-2", "", ""); r.status != 200 {
			t.Fatalf("new token after reload: %d", r.status)
		}
		writeTokens(t, dir, "principals:\n  - name: broken\n    roles: [wizard]\n")
		if err := creds.Reload(); err == nil {
			t.Fatal("a bad tokens file reloaded")
		}
		if r := e.do(t, "GET", "/v1/runs/run-t1", "tok-ops-2", "", ""); r.status != 200 {
			t.Fatalf("after a failed reload the previous principals must stay: %d", r.status)
		}
	})
}

func TestLoadCredentials_Problems(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"UnknownRole":  "principals:\n  - name: a\n    tokenSha256: " + httpapi.HashToken("x") + "\n    roles: [wizard]\n",
		"NoRoles":      "principals:\n  - name: a\n    tokenSha256: " + httpapi.HashToken("x") + "\n",
		"BadHash":      "principals:\n  - name: a\n    tokenSha256: abc\n    roles: [viewer]\n",
		"NoCredential": "principals:\n  - name: a\n    roles: [viewer]\n",
		"UnknownField": "principals:\n  - name: a\n    token: plain\n    roles: [viewer]\n",
		"Empty":        "principals: []\n",
		"EmptyFile":    "",
		"DupName":      tokensYAML(principal("a", "x", "viewer", ""), principal("a", "y", "viewer", "")),
		"DupToken":     tokensYAML(principal("a", "x", "viewer", ""), principal("b", "x", "admin", "")),
		// One certificate name for two principals: which one a client
		// with that certificate is would be the file's order.
		"DupCertCommonName": "principals:\n  - name: a\n    certCommonName: ops\n    roles: [viewer]\n  - name: b\n    certCommonName: ops\n    roles: [admin]\n",
		// A scope meant to restrict whose field came out empty (a
		// template's unset value) would otherwise grant every tenant.
		"NullScopeField":    scoped("{tenantId: null}"),
		"TildeScopeField":   scoped("{tenantId: ~}"),
		"EmptyScopeField":   scoped(`{tenantId: ""}`),
		"EmptyProjectField": scoped("{tenantId: acme, projectId: }"),
		"EmptyScope":        scoped("{}"),
		"NullScope":         scoped("~"),
		"BlankScope":        scoped(""),
		"UnknownScopeField": scoped("{tenant: acme}"),
		"ListScope":         scoped("[acme]"),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := httpapi.LoadCredentials(writeTokens(t, dir, content)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// TestLoadCredentials_NotAListSaysWhatIsWanted: a file that is not the
// tokens file's shape says what is wanted, not only the decoder's words
// (which name a Go type).
func TestLoadCredentials_NotAListSaysWhatIsWanted(t *testing.T) {
	_, err := httpapi.LoadCredentials(writeTokens(t, t.TempDir(), "garbage\n"))
	if err == nil || !strings.Contains(err.Error(), "want a list under principals:") {
		t.Fatalf("%v, want what the file should hold", err)
	}
}

// scoped is a tokens file of one viewer whose scope is given as yaml.
func scoped(yaml string) string {
	return "principals:\n  - name: a\n    tokenSha256: " + httpapi.HashToken("x") + "\n    roles: [viewer]\n    scope: " + yaml + "\n"
}

// TestLoadCredentials_Scopes: the scopes a tokens file may give, as
// read.
func TestLoadCredentials_Scopes(t *testing.T) {
	dir := t.TempDir()
	for yaml, want := range map[string]httpapi.Scope{
		"{tenantId: acme}":                                {TenantID: "acme"},
		"{tenantId: '007', projectId: p1}":                {TenantID: "007", ProjectID: "p1"},
		"{tenantId: 007}":                                 {TenantID: "007"},
		"{environmentId: prod}":                           {EnvironmentID: "prod"},
		"\n      tenantId: acme\n      environmentId: e1": {TenantID: "acme", EnvironmentID: "e1"},
	} {
		c, err := httpapi.LoadCredentials(writeTokens(t, dir, scoped(yaml)))
		if err != nil {
			t.Fatalf("scope %s: %v", yaml, err)
		}
		p := principalOf(t, c)
		if p.Scope != want {
			t.Fatalf("scope %s read as %+v, want %+v", yaml, p.Scope, want)
		}
	}
	// No scope at all: every tenant, as documented.
	c, err := httpapi.LoadCredentials(writeTokens(t, dir, "principals:\n  - name: a\n    tokenSha256: "+httpapi.HashToken("x")+"\n    roles: [viewer]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := principalOf(t, c); p.Scope != (httpapi.Scope{}) {
		t.Fatalf("no scope read as %+v", p.Scope)
	}
}

// principalOf is the principal of token "x" in c.
func principalOf(t *testing.T, c *httpapi.Credentials) *httpapi.Principal {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/v1/runs", nil)
	r.Header.Set("Authorization", "Bearer x")
	p, err := c.Authenticate(r)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServer_Timeouts: a body sent a byte at a time and an idle keep-alive
// are cut off by the server's timeouts (both were still open after 90 s
// before).
func TestServer_Timeouts(t *testing.T) {
	api := httpapi.NewServer(httpapi.Options{Log: memstore.New(statestore.ProjectorOptions{}), Control: &recordingControl{},
		ReadTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond, Logger: zaptest.NewLogger(t)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api.Open(ln)
	t.Cleanup(func() { _ = api.Close(context.Background()) })
	addr := ln.Addr().String()

	t.Run("SlowBody", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/runs/r/pause HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
		cut := false
		for i := 0; i < 50 && !cut; i++ { // 10 s at most
			if _, err := c.Write([]byte(" ")); err != nil {
				cut = true
				break
			}
			_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			// An answer before the body is complete, or a closed
			// connection: the server gave up on the body.
			if n, err := c.Read(make([]byte, 1)); n > 0 || (err != nil && !isTimeout(err)) {
				cut = true
			}
		}
		if !cut {
			t.Fatal("a body trickling in for 10 s was not cut off (ReadTimeout 300ms)")
		}
	})
	t.Run("IdleKeepAlive", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := br.ReadByte(); err == nil || isTimeout(err) {
			t.Fatalf("idle keep-alive still open after 10 s (IdleTimeout 300ms): %v", err)
		}
	})
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// fuzzHandler is the API over a memstore with a recording Control and no
// Starter: a start that passes decoding and validation answers 503
// NOT_READY, so any 500 is a decoding bug.
func fuzzHandler(f *testing.F) (http.Handler, *recordingControl) {
	store := memstore.New(statestore.ProjectorOptions{})
	if _, err := store.Append(context.Background(), storetest.Event("run-1", statestore.RunStarted, "")); err != nil {
		f.Fatal(err)
	}
	rc := &recordingControl{}
	return httpapi.NewServer(httpapi.Options{Log: store, Control: rc}).Handler(), rc
}

// FuzzDecodeStart feeds POST /v1/runs bodies through the real handler:
// never a panic or a 500, and a 4xx is one of the API's machine codes.
func FuzzDecodeStart(f *testing.F) {
	good := `{"planId":"p1","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`
	for _, seed := range []string{
		`{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":` + good + `}`,
		`{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":` + good + `} x`,
		`{"tenantID":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":` + good + `}`,
		`{"tenantId":"t","tenantId":"u","projectId":"p","environmentId":"e","runRequestId":"r","plan":` + good + `}`,
		"{\"tenantId\":\"t\",\"projectId\":\"p\",\"environmentId\":\"e\",\"runRequestId\":\"r\xff\",\"plan\":" + good + "}",
		`{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":{"planId":"p1","planVersion":"1","steps":null}}`,
		`{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":{"planId":"p1","planVersion":"1","steps":[{"stepId":"a","timeoutSeconds":1e999,"executor":{"type":"noop"}}]}}`,
		`{"plan":[]}`, `[]`, `null`, `{"tenantId":{}}`, ``,
	} {
		f.Add(seed)
	}
	h, _ := fuzzHandler(f)
	// The first seed passes decoding (no Starter: 503), so a refusal of
	// every request (a Host or Content-Type rule) would not go unseen.
	if w := serveFuzz(h, "POST", "/v1/runs", `{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":`+good+`}`); w.Code != http.StatusServiceUnavailable {
		f.Fatalf("a good start: %d %s, want 503 NOT_READY", w.Code, w.Body)
	}
	f.Fuzz(func(t *testing.T, body string) {
		req := httptest.NewRequest("POST", "/v1/runs", strings.NewReader(body))
		req.Host = "127.0.0.1:8787"
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		checkFuzzAnswer(t, w, body)
	})
}

// FuzzControlBody feeds pause and resume bodies through the real handler:
// never a panic or a 500; a refused body reaches no engine call.
func FuzzControlBody(f *testing.F) {
	for _, seed := range []string{`{}`, `{"timeoutSeconds":60,"reason":"x"}`, `{"timeoutSeconds":9300000000}`,
		`{"timeoutSeconds":9223372036854775807}`, `{"stepId":"a"}`, `{"reason":"a"} {}`, `{"requestedBy":"\u0000"}`, `{"timeoutSeconds":1.5}`} {
		f.Add("pause", seed)
		f.Add("resume", seed)
	}
	h, rc := fuzzHandler(f)
	if w := serveFuzz(h, "POST", "/v1/runs/run-1/pause", `{"reason":"x"}`); w.Code != http.StatusOK || len(rc.taken()) != 1 {
		f.Fatalf("a good pause: %d %s, want 200", w.Code, w.Body)
	}
	f.Fuzz(func(t *testing.T, action, body string) {
		if action != "pause" && action != "resume" {
			return
		}
		before := len(rc.taken())
		req := httptest.NewRequest("POST", "/v1/runs/run-1/"+action, strings.NewReader(body))
		req.Host = "127.0.0.1:8787"
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		checkFuzzAnswer(t, w, body)
		if w.Code >= 400 && len(rc.taken()) != before {
			t.Fatalf("refused body %q (%d) reached the engine", body, w.Code)
		}
	})
}

// serveFuzz serves one request as a local client sends it (a loopback
// Host; Content-Type application/json on a body).
func serveFuzz(h http.Handler, method, target, body string) *httptest.ResponseRecorder {
	path, query, _ := strings.Cut(target, "?")
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.URL.RawQuery = query // any bytes, as a raw request line may carry them
	req.Host = "127.0.0.1:8787"
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func checkFuzzAnswer(t *testing.T, w *httptest.ResponseRecorder, body string) {
	t.Helper()
	var a struct{ Code string }
	_ = json.Unmarshal(w.Body.Bytes(), &a)
	switch {
	case w.Code == 500:
		t.Fatalf("body %q: 500 %s", body, w.Body)
	case w.Code >= 400 && a.Code == "":
		t.Fatalf("body %q: %d without a machine code: %s", body, w.Code, w.Body)
	}
}

// TestServer_EngineRefusal: Conductor answering CONFLICT to a recorded
// resume is a 409 naming the workflow's status, not a 503 "did not answer"
// (concurrent pause/resume calls were told to retry before); Conductor
// answering 404 (its workflow gone) is a 409 too.
func TestServer_EngineRefusal(t *testing.T) {
	e := newSecEnv(t, nil)
	e.control.err = &drain.EngineError{Err: &adapter.Error{Code: adapter.CodeConflict, Op: "resume", Status: 500,
		Message: "workflow is not PAUSED so cannot resume", EngineStatus: "RUNNING"}}
	r := e.do(t, "POST", "/v1/runs/run-t1/resume", "", "", "")
	if r.status != 409 || r.Code != "ENGINE_CONFLICT" || !strings.Contains(r.body, "RUNNING") {
		t.Fatalf("got %d %s %s, want 409 ENGINE_CONFLICT naming RUNNING", r.status, r.Code, r.body)
	}
	// A start lease held by another attempt: 409 with Retry-After, the
	// seconds until the lease expires (a chaos-test client retried it blind).
	e.control.err = &adapter.Error{Code: adapter.CodeRunStartInProgress, Op: "start run", RetryAt: time.Now().Add(6500 * time.Millisecond)}
	if r := e.do(t, "POST", "/v1/runs/run-t1/resume", "", "", ""); r.status != 409 || r.Code != "RUN_START_IN_PROGRESS" || r.header.Get("Retry-After") != "7" {
		t.Fatalf("got %d %s Retry-After %q, want 409 RUN_START_IN_PROGRESS with Retry-After 7", r.status, r.Code, r.header.Get("Retry-After"))
	}
	// Conductor answered 404: the workflow was removed, or lost with a
	// memory store's restart. A retry cannot succeed: 409, not 503.
	e.control.err = &drain.EngineError{Err: &adapter.Error{Code: adapter.CodeNotFound, Op: "pause", Status: 404,
		Message: "No such workflow found by id: wf-1"}}
	if r := e.do(t, "POST", "/v1/runs/run-t1/pause", "", "", ""); r.status != 409 || r.Code != "ENGINE_CONFLICT" ||
		!strings.Contains(r.body, "no longer has the run's workflow") || strings.Contains(r.body, "retry") {
		t.Fatalf("got %d %s %s, want 409 ENGINE_CONFLICT saying Conductor no longer has the workflow, not to retry", r.status, r.Code, r.body)
	}
	e.control.err = &drain.EngineError{Err: &adapter.Error{Code: adapter.CodeEngineUnavailable, Op: "resume", Message: "connection refused"}}
	if r := e.do(t, "POST", "/v1/runs/run-t1/resume", "", "", ""); r.status != 503 || r.Code != "ENGINE_UNAVAILABLE" {
		t.Fatalf("got %d %s, want 503 ENGINE_UNAVAILABLE", r.status, r.Code)
	}
}

// TestServer_Notice: what the controller says it did not do reaches the
// answer (a second pause's timeout that is not applied).
func TestServer_Notice(t *testing.T) {
	e := newSecEnv(t, nil)
	e.control.notice = "the run was already paused (cycle 1); nothing was recorded"
	r := e.do(t, "POST", "/v1/runs/run-t1/pause", "", "application/json", `{"timeoutSeconds":600}`)
	var v struct{ Notice string }
	_ = json.Unmarshal([]byte(r.body), &v)
	if r.status != 200 || v.Notice != e.control.notice {
		t.Fatalf("got %d %s, want the notice", r.status, r.body)
	}
}

// TestServer_BrowserRequestsRefused: what a web page can make a browser
// send to the loopback no-auth API is refused before anything is done: a
// body without Content-Type application/json (415), a cross-origin
// request (Origin, Sec-Fetch-Site: 403 CROSS_ORIGIN_REFUSED) and, against
// DNS rebinding, a Host that is not a loopback name, an IP address or one
// of Options.AllowedHosts (403 HOST_NOT_ALLOWED).
func TestServer_BrowserRequestsRefused(t *testing.T) {
	store := memstore.New(statestore.ProjectorOptions{})
	if _, err := store.Append(context.Background(), storetest.Event("run-1", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	rc := &recordingControl{}
	serve := func(o httpapi.Options) *httptest.Server {
		o.Log, o.Control, o.Logger = store, rc, zaptest.NewLogger(t)
		srv := httptest.NewServer(httpapi.NewServer(o).Handler())
		t.Cleanup(srv.Close)
		return srv
	}
	open := serve(httpapi.Options{})
	pod := serve(httpapi.Options{AllowedHosts: []string{"sidecar.jobs.svc"}})
	do := func(srv *httptest.Server, method, path, body string, header map[string]string) reply {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			if k == "Host" {
				req.Host = v
				continue
			}
			req.Header.Set(k, v)
		}
		return doReply(t, req)
	}
	const js = "application/json"
	plan := `{"planId":"p1","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"command","argv":["id"]}}]}`
	start := `{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"r","plan":` + plan + `}`
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(open.URL, "http://"))
	for _, tc := range []struct {
		name         string
		srv          *httptest.Server
		method, path string
		body         string
		header       map[string]string
		status       int
		code         string
	}{
		{"StartCrossOrigin", open, "POST", "/v1/runs", start, map[string]string{"Origin": "https://evil.example"}, 403, "CROSS_ORIGIN_REFUSED"},
		{"StartNoContentType", open, "POST", "/v1/runs", start, nil, 415, "BAD_REQUEST"},
		{"CancelNoContentType", open, "POST", "/v1/runs/run-1/cancel", `{"reason":"x"}`, nil, 415, "BAD_REQUEST"},
		{"CancelTextPlain", open, "POST", "/v1/runs/run-1/cancel", `{"reason":"x"}`, map[string]string{"Content-Type": "text/plain"}, 415, "BAD_REQUEST"},
		{"CrossOriginJSON", open, "POST", "/v1/runs/run-1/pause", `{}`, map[string]string{"Content-Type": js, "Origin": "https://evil.example"}, 403, "CROSS_ORIGIN_REFUSED"},
		{"CrossOriginNoBody", open, "POST", "/v1/runs/run-1/cancel", "", map[string]string{"Origin": "https://evil.example"}, 403, "CROSS_ORIGIN_REFUSED"},
		{"NullOrigin", open, "POST", "/v1/runs/run-1/cancel", "", map[string]string{"Origin": "null"}, 403, "CROSS_ORIGIN_REFUSED"},
		{"SecFetchCrossSite", open, "GET", "/v1/runs/run-1", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "CROSS_ORIGIN_REFUSED"},
		{"SecFetchSameSite", open, "GET", "/v1/runs/run-1", "", map[string]string{"Sec-Fetch-Site": "same-site"}, 403, "CROSS_ORIGIN_REFUSED"},
		{"RebindHost", open, "GET", "/v1/runs/run-1", "", map[string]string{"Host": "rebind.evil.example:" + port}, 403, "HOST_NOT_ALLOWED"},
		{"RebindHostSameOrigin", open, "POST", "/v1/runs/run-1/cancel", "", map[string]string{"Host": "rebind.evil.example:" + port, "Origin": "http://rebind.evil.example:" + port}, 403, "HOST_NOT_ALLOWED"},
		{"PodNameNotAllowed", open, "GET", "/v1/runs/run-1", "", map[string]string{"Host": "sidecar.jobs.svc:8787"}, 403, "HOST_NOT_ALLOWED"},
		{"PodNameAllowed", pod, "GET", "/v1/runs/run-1", "", map[string]string{"Host": "sidecar.jobs.svc:8787"}, 200, ""},
		{"Localhost", open, "GET", "/v1/runs/run-1", "", map[string]string{"Host": "localhost:" + port}, 200, ""},
		{"LoopbackIPv6", open, "GET", "/v1/runs/run-1", "", map[string]string{"Host": "[::1]:" + port}, 200, ""},
		{"IPAddress", open, "GET", "/v1/runs/run-1", "", map[string]string{"Host": "10.1.2.3:8787"}, 200, ""},
		{"SameOrigin", open, "GET", "/v1/runs/run-1", "", map[string]string{"Origin": open.URL, "Sec-Fetch-Site": "same-origin"}, 200, ""},
		{"ProbeWithForeignHost", open, "GET", "/healthz", "", map[string]string{"Host": "rebind.evil.example"}, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(tc.srv, tc.method, tc.path, tc.body, tc.header)
			if r.status != tc.status || r.Code != tc.code {
				t.Fatalf("got %d %s (%s), want %d %s", r.status, r.Code, r.body, tc.status, tc.code)
			}
		})
	}
	if calls := rc.taken(); len(calls) != 0 {
		t.Fatalf("refused requests reached the control: %v", calls)
	}
	// The CLI's client sends what the API requires (Content-Type on a body).
	t.Run("Client", func(t *testing.T) {
		c := httpapi.NewClient(open.URL)
		ctx := context.Background()
		if _, err := c.Pause(ctx, "run-1", 60, "maintenance"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Cancel(ctx, "run-1", "done"); err != nil {
			t.Fatal(err)
		}
		if got := rc.taken(); len(got) != 2 {
			t.Fatalf("the client's requests reached the control as %v, want a pause and a cancel", got)
		}
	})
}

// TestServer_LoneSurrogatesRefused: a \u escape of a lone UTF-16
// surrogate is refused (JSON decoders turn it into U+FFFD, so "\ud800",
// "\udc00" and "\ufffd" would be one runRequestId: one run for three
// requests); a surrogate pair and U+FFFD itself are ids like any other.
func TestServer_LoneSurrogatesRefused(t *testing.T) {
	e := newSecEnv(t, nil)
	plan := `{"planId":"p1","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`
	start := func(id string) string {
		return `{"tenantId":"t","projectId":"p","environmentId":"e","runRequestId":"` + id + `","plan":` + plan + `}`
	}
	for _, id := range []string{`\ud800`, `\udc00`, `\uDBFF`, `x\ud800y`, `\ud800\u0041`, `\udc00\ud800`, `\\\ud800`} {
		r := e.do(t, "POST", "/v1/runs", "", "application/json", start(id))
		if r.status != 400 || r.Code != "BAD_REQUEST" {
			t.Errorf("runRequestId %s: got %d %s, want 400 BAD_REQUEST", id, r.status, r.body)
		}
	}
	if r := e.do(t, "POST", "/v1/runs/run-t1/pause", "", "application/json", `{"reason":"\udfff"}`); r.status != 400 {
		t.Errorf("a pause reason with a lone surrogate: got %d %s, want 400", r.status, r.body)
	}
	// Valid: a pair, U+FFFD itself, and an escaped backslash before "u".
	for _, id := range []string{`\ud83d\ude00`, `\ufffd`, `\\ud800`} {
		// No Starter: a start that passes decoding is 503 NOT_READY.
		if r := e.do(t, "POST", "/v1/runs", "", "application/json", start(id)); r.status != 503 {
			t.Errorf("runRequestId %s: got %d %s, want it past decoding (503 NOT_READY)", id, r.status, r.body)
		}
	}
	if calls := e.control.taken(); len(calls) != 0 {
		t.Fatalf("refused requests reached the control: %v", calls)
	}
}

// TestServer_HeaderBudget: the request line and headers of a request are
// at most httpapi.MaxHeaderBytes (net/http's default is 1 MB): a longer
// one is 431 before any handler runs.
func TestServer_HeaderBudget(t *testing.T) {
	rc := &recordingControl{}
	api := httpapi.NewServer(httpapi.Options{Log: memstore.New(statestore.ProjectorOptions{}), Control: rc, Logger: zaptest.NewLogger(t)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api.Open(ln)
	t.Cleanup(func() { _ = api.Close(context.Background()) })
	base := "http://" + ln.Addr().String()
	get := func(query string) int {
		resp, err := http.Get(base + "/v1/runs/run-1/events?afterSeq=" + query)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(strings.Repeat("0", 2*httpapi.MaxHeaderBytes)); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("a %d-byte request line: %d, want 431", 2*httpapi.MaxHeaderBytes, code)
	}
	if code := get(strings.Repeat("0", httpapi.MaxHeaderBytes/2)); code != http.StatusNotFound {
		t.Fatalf("a request line within the budget: %d, want 404 (no such run)", code)
	}
}
