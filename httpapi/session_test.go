package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
	"go.uber.org/zap/zaptest"
)

// sessionEnv serves the API with the tokens of principals (name: token)
// and the given session bounds (0: the defaults).
func sessionEnv(t *testing.T, total, perPrincipal int, principals ...string) *secEnv {
	t.Helper()
	var entries []string
	for i := 0; i+1 < len(principals); i += 2 {
		entries = append(entries, principal(principals[i], principals[i+1], "viewer", ""))
	}
	creds, err := httpapi.LoadCredentials(writeTokens(t, t.TempDir(), tokensYAML(entries...)))
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(statestore.ProjectorOptions{})
	if _, err := store.Append(context.Background(), storetest.Event("run-t1", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	api := httpapi.NewServer(httpapi.Options{Log: store, Control: &recordingControl{}, Auth: creds, Logger: zaptest.NewLogger(t)})
	if total > 0 {
		api.SetSessionLimits(total, perPrincipal)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return &secEnv{url: srv.URL, control: &recordingControl{}}
}

// TestSessions_PerPrincipalBound: one principal signing in again and again
// ends its own oldest sessions, never another principal's, and never fills
// the table for others.
func TestSessions_PerPrincipalBound(t *testing.T) {
	e := sessionEnv(t, 0, 0, "vic", "tok-viewer", "bob", "tok-bob")
	bob, _ := e.login(t, "tok-bob")
	const extra = 4
	var vic []string
	for i := 0; i < httpapi.MaxSessionsPerPrincipal+extra; i++ {
		c, _ := e.login(t, "tok-viewer")
		vic = append(vic, c)
	}
	for i, c := range vic {
		rep := e.consoleReq(t, "GET", "/v1/runs/run-t1", c, "", "")
		if want := i >= extra; (rep.status == http.StatusOK) != want {
			t.Fatalf("vic's session #%d of %d: %d %s; want only the newest %d alive", i+1, len(vic), rep.status, rep.body, httpapi.MaxSessionsPerPrincipal)
		}
	}
	if rep := e.consoleReq(t, "GET", "/v1/runs/run-t1", bob, "", ""); rep.status != http.StatusOK {
		t.Fatalf("bob's session after vic's %d logins: %d %s", len(vic), rep.status, rep.body)
	}
	e.login(t, "tok-bob")
}

// TestSessions_TableFull: when every place of the table is taken by other
// principals, a login is refused with SESSIONS_FULL (not /readyz's
// NOT_READY); a principal at its own bound still signs in, ending its
// oldest session.
func TestSessions_TableFull(t *testing.T) {
	e := sessionEnv(t, 4, 2, "alice", "tok-a", "bob", "tok-b", "carol", "tok-c")
	a1, _ := e.login(t, "tok-a")
	a2, a2csrf := e.login(t, "tok-a")
	e.login(t, "tok-b")
	e.login(t, "tok-b")
	rep := e.consoleReq(t, "POST", "/ui/login", "", "", `{"token":"tok-c"}`)
	if rep.status != http.StatusServiceUnavailable || rep.Code != httpapi.CodeSessionsFull {
		t.Fatalf("carol's login into a full table: %d %s, want 503 %s", rep.status, rep.body, httpapi.CodeSessionsFull)
	}
	a3, _ := e.login(t, "tok-a")
	if rep := e.consoleReq(t, "GET", "/v1/runs/run-t1", a1, "", ""); rep.status != http.StatusUnauthorized {
		t.Fatalf("alice's oldest session after her third login: %d %s, want 401", rep.status, rep.body)
	}
	// A session signed out leaves its principal's count: two logins
	// later, alice again holds her newest two, no more.
	if rep := e.consoleReq(t, "POST", "/ui/logout", a2, a2csrf, ""); rep.status != http.StatusNoContent {
		t.Fatalf("logout: %d %s", rep.status, rep.body)
	}
	a4, _ := e.login(t, "tok-a")
	a5, _ := e.login(t, "tok-a")
	for _, tc := range []struct {
		name, cookie string
		want         int
	}{{"third", a3, http.StatusUnauthorized}, {"fourth", a4, http.StatusOK}, {"fifth", a5, http.StatusOK}} {
		if rep := e.consoleReq(t, "GET", "/v1/runs/run-t1", tc.cookie, "", ""); rep.status != tc.want {
			t.Fatalf("alice's %s session after a logout and two logins: %d %s, want %d", tc.name, rep.status, rep.body, tc.want)
		}
	}
}
