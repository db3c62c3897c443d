package httpapi_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/httpapi/console"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
)

// consoleReq sends a request as the console's script would: same origin,
// the session cookie (when set) and the CSRF token (when set).
func (e *secEnv) consoleReq(t *testing.T, method, path, cookie, csrf, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.Header.Set("Origin", e.url)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: httpapi.SessionCookie, Value: cookie})
	}
	if csrf != "" {
		req.Header.Set(httpapi.CSRFHeader, csrf)
	}
	return doReply(t, req)
}

// login opens a console session with token and returns its cookie value
// and CSRF token.
func (e *secEnv) login(t *testing.T, token string) (cookie, csrf string) {
	t.Helper()
	rep := e.consoleReq(t, "POST", "/ui/login", "", "", `{"token":"`+token+`"}`)
	if rep.status != http.StatusOK {
		t.Fatalf("login: %d %s", rep.status, rep.body)
	}
	resp := http.Response{Header: rep.header}
	for _, c := range resp.Cookies() {
		if c.Name == httpapi.SessionCookie {
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.Secure {
				t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/, not Secure over plain HTTP", c)
			}
			if strings.Contains(rep.body, c.Value) {
				t.Fatal("the login answer's body holds the session id: a script could read it")
			}
			cookie = c.Value
		}
	}
	sess := e.consoleReq(t, "GET", "/ui/session", cookie, "", "")
	var s struct {
		Name, CSRFToken string
		Roles           []string
	}
	if err := json.Unmarshal([]byte(sess.body), &s); err != nil || s.CSRFToken == "" || cookie == "" {
		t.Fatalf("session: cookie %q, %d %s", cookie, sess.status, sess.body)
	}
	return cookie, s.CSRFToken
}

// TestConsole_Sessions: a token opens a cookie session; the session reads
// like its token; a change needs the session's CSRF token and the role; a
// viewer's forged control request is 403 and changes nothing; cross-site
// requests stay refused; logout and a removed token end the session.
func TestConsole_Sessions(t *testing.T) {
	dir := t.TempDir()
	path := writeTokens(t, dir, tokensYAML(principal("alice", "tok-ops", "operator, viewer", ""), principal("vic", "tok-viewer", "viewer", "")))
	creds, err := httpapi.LoadCredentials(path)
	if err != nil {
		t.Fatal(err)
	}
	e := newSecEnv(t, creds)
	pause := `{"reason":"incident 7"}`

	if rep := e.consoleReq(t, "POST", "/ui/login", "", "", `{"token":"wrong"}`); rep.status != 401 || rep.Code != httpapi.CodeUnauthenticated {
		t.Fatalf("login with an unknown token: %d %s", rep.status, rep.body)
	}
	if rep := e.consoleReq(t, "GET", "/v1/runs/run-t1", "forged-session", "", ""); rep.status != 401 {
		t.Fatalf("unknown session: %d %s", rep.status, rep.body)
	}

	vc, vcsrf := e.login(t, "tok-viewer")
	if rep := e.consoleReq(t, "GET", "/v1/runs/run-t1", vc, "", ""); rep.status != 200 {
		t.Fatalf("viewer session reads a run: %d %s", rep.status, rep.body)
	}
	if rep := e.consoleReq(t, "POST", "/v1/runs/run-t1/pause", vc, vcsrf, pause); rep.status != 403 || rep.Code != httpapi.CodeForbidden {
		t.Fatalf("viewer session's pause with its CSRF token: %d %s, want 403 FORBIDDEN", rep.status, rep.body)
	}

	oc, ocsrf := e.login(t, "tok-ops")
	for _, tc := range []struct {
		name, csrf string
		header     map[string]string
		code       string
	}{
		{"NoCSRF", "", nil, httpapi.CodeCSRF},
		{"OtherSessionsCSRF", vcsrf, nil, httpapi.CodeCSRF},
		{"CrossSite", ocsrf, map[string]string{"Sec-Fetch-Site": "cross-site"}, httpapi.CodeCrossOrigin},
		{"OtherOrigin", ocsrf, map[string]string{"Origin": "https://evil.example"}, httpapi.CodeCrossOrigin},
		{"FormPost", ocsrf, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, httpapi.CodeBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", e.url+"/v1/runs/run-t1/pause", strings.NewReader(pause))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Sec-Fetch-Site", "same-origin")
			req.AddCookie(&http.Cookie{Name: httpapi.SessionCookie, Value: oc})
			if tc.csrf != "" {
				req.Header.Set(httpapi.CSRFHeader, tc.csrf)
			}
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			if rep := doReply(t, req); rep.status < 400 || rep.Code != tc.code {
				t.Fatalf("%d %s, want code %s", rep.status, rep.body, tc.code)
			}
		})
	}
	if calls := e.control.taken(); len(calls) != 0 {
		t.Fatalf("refused requests reached the control: %v", calls)
	}
	if rep := e.consoleReq(t, "POST", "/v1/runs/run-t1/pause", oc, ocsrf, pause); rep.status != 200 {
		t.Fatalf("operator session's pause: %d %s", rep.status, rep.body)
	}
	if calls := e.control.taken(); !slices.Equal(calls, []string{"pause run-t1 alice incident 7"}) {
		t.Fatalf("control calls %v, want the pause requested by alice", calls)
	}

	// Logout needs the CSRF token, then the session is gone.
	if rep := e.consoleReq(t, "POST", "/ui/logout", oc, "", ""); rep.status != 403 || rep.Code != httpapi.CodeCSRF {
		t.Fatalf("logout without CSRF: %d %s", rep.status, rep.body)
	}
	if rep := e.consoleReq(t, "POST", "/ui/logout", oc, ocsrf, ""); rep.status != 204 {
		t.Fatalf("logout: %d %s", rep.status, rep.body)
	}
	if rep := e.consoleReq(t, "GET", "/v1/runs/run-t1", oc, "", ""); rep.status != 401 {
		t.Fatalf("after logout: %d %s", rep.status, rep.body)
	}

	// The viewer's token is removed: its sessions end with the reload.
	vc2, _ := e.login(t, "tok-viewer")
	if err := os.WriteFile(path, []byte(tokensYAML(principal("alice", "tok-ops", "operator, viewer", ""))), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := creds.Reload(); err != nil {
		t.Fatal(err)
	}
	if rep := e.consoleReq(t, "GET", "/v1/runs/run-t1", vc, "", ""); rep.status != 401 {
		t.Fatalf("session of a removed token: %d %s", rep.status, rep.body)
	}
	if rep := e.consoleReq(t, "GET", "/ui/session", vc, "", ""); rep.status != 401 {
		t.Fatalf("session endpoint of a removed token: %d %s", rep.status, rep.body)
	}
	if rep := e.consoleReq(t, "GET", "/v1/runs/run-t1", vc2, "", ""); rep.status != 401 {
		t.Fatalf("another session of a removed token: %d %s", rep.status, rep.body)
	}
	// Ended, not suspended: the token put back does not bring the
	// session back (a new sign-in opens a new one).
	if err := os.WriteFile(path, []byte(tokensYAML(principal("alice", "tok-ops", "operator, viewer", ""), principal("vic", "tok-viewer", "viewer", ""))), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := creds.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{vc, vc2} {
		if rep := e.consoleReq(t, "GET", "/v1/runs/run-t1", c, "", ""); rep.status != 401 {
			t.Fatalf("a session of a token removed and put back: %d %s, want it ended (401)", rep.status, rep.body)
		}
	}
}

// TestConsole_Page: every /ui path answers the page with a strict CSP; the
// assets are served as files; without authentication the session says so.
func TestConsole_Page(t *testing.T) {
	e := newSecEnv(t, nil)
	for _, p := range []string{"/ui/runs", "/ui/runs/run-t1", "/ui/bulk?labelSelector=team%3Ddata", "/ui/audit"} {
		rep := e.consoleReq(t, "GET", p, "", "", "")
		csp := rep.header.Get("Content-Security-Policy")
		if rep.status != 200 || !strings.Contains(rep.body, `<script type="module" src="/ui/assets/app.js">`) ||
			!strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "unsafe") || rep.header.Get("X-Frame-Options") != "DENY" {
			t.Fatalf("GET %s: %d CSP %q\n%s", p, rep.status, csp, rep.body)
		}
		if strings.Contains(rep.body, "<script>") || strings.Contains(rep.body, " style=") || strings.Contains(rep.body, " onclick=") {
			t.Fatalf("GET %s: inline script or style", p)
		}
	}
	if rep := e.consoleReq(t, "GET", "/ui/assets/app.js", "", "", ""); rep.status != 200 || !strings.HasPrefix(rep.header.Get("Content-Type"), "text/javascript") {
		t.Fatalf("app.js: %d %q", rep.status, rep.header.Get("Content-Type"))
	}
	if rep := e.consoleReq(t, "GET", "/ui/session", "", "", ""); rep.status != 200 || !strings.Contains(rep.body, `"auth":false`) {
		t.Fatalf("session without authentication: %d %s", rep.status, rep.body)
	}
	if rep := e.consoleReq(t, "POST", "/ui/login", "", "", `{"token":"x"}`); rep.status != 400 {
		t.Fatalf("login without authentication: %d %s", rep.status, rep.body)
	}
}

// TestConsole_AssetBudget: the console's files, gzip-compressed, stay
// under 300 KB, and none names another origin to load from.
func TestConsole_AssetBudget(t *testing.T) {
	var total int
	err := fs.WalkDir(console.Assets(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(console.Assets(), p)
		if err != nil {
			return err
		}
		b = bytes.ReplaceAll(b, []byte(`"http://www.w3.org/2000/svg"`), nil) // the SVG namespace names, loads nothing
		for _, bad := range []string{"http://", "https://", "//cdn", "@import url("} {
			if bytes.Contains(b, []byte(bad)) && filepath.Ext(p) != ".md" {
				t.Errorf("%s names %q: the console loads nothing from elsewhere", p, bad)
			}
		}
		b, _ = fs.ReadFile(console.Assets(), p)
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		_, _ = io.Copy(zw, bytes.NewReader(b))
		_ = zw.Close()
		total += buf.Len()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("console assets: %d bytes gzip-compressed", total)
	if total > 300<<10 {
		t.Fatalf("console assets %d bytes compressed, budget 300 KB", total)
	}
}

// TestConsole_SecureCookieBehindATLSProxy: with SecureCookies (serve's
// --console-secure-cookie), the session cookie is Secure although the
// listener is plain HTTP (a proxy in front terminates TLS); without it,
// it is Secure over TLS only (TestConsole_Sessions' login).
func TestConsole_SecureCookieBehindATLSProxy(t *testing.T) {
	creds, err := httpapi.LoadCredentials(writeTokens(t, t.TempDir(), tokensYAML(principal("vic", "tok-viewer", "viewer", ""))))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: memstore.New(statestore.ProjectorOptions{}), Auth: creds, SecureCookies: true}).Handler())
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/ui/login", strings.NewReader(`{"token":"tok-viewer"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var found bool
	for _, c := range resp.Cookies() {
		if c.Name == httpapi.SessionCookie {
			found = true
			if !c.Secure || !c.HttpOnly {
				t.Fatalf("session cookie %+v: want Secure and HttpOnly", c)
			}
		}
	}
	if resp.StatusCode != http.StatusOK || !found {
		t.Fatalf("login: %d, session cookie %v", resp.StatusCode, found)
	}
}
