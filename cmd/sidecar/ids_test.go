package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestClient_BadIDsAreLocalErrors: a run id or step id that breaks the
// contract's id rule (statestore.CheckID) is a usage error (exit 2) naming
// it, and no request reaches the server.
func TestClient_BadIDsAreLocalErrors(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Error(w, `{"code":"NOT_FOUND","message":"no"}`, http.StatusNotFound)
	}))
	defer srv.Close()
	bad := map[string]string{
		"pipe":     "a|b",
		"too long": strings.Repeat("r", statestore.MaxIDBytes+1),
		"not utf8": "r\xff",
		"nul":      "r\x00",
	}
	for name, id := range bad {
		for _, args := range [][]string{
			{"status", id}, {"events", id}, {"audit", id}, {"pause", id}, {"resume", id}, {"cancel", id},
			{"retry", id, "s1"}, {"retry", "r1", id},
		} {
			t.Run(name+"/"+args[0], func(t *testing.T) {
				code, out, errOut := run(t, append(args, "--server", srv.URL)...)
				if code != exitUsage || out != "" || !strings.Contains(errOut, "_ID") {
					t.Fatalf("sidecar %s: exit %d stdout %q stderr %q; want exit 2 naming the id", args[0], code, out, errOut)
				}
				if n := requests.Load(); n != 0 {
					t.Fatalf("sidecar %s sent %d requests with a bad id", args[0], n)
				}
			})
		}
	}
	// A good id reaches the server.
	if code, _, errOut := run(t, "status", "r1", "--server", srv.URL); code != exitNotFound || requests.Load() != 1 {
		t.Fatalf("status r1: exit %d, %d requests, stderr %q; want exit 4 (not found) after one request", code, requests.Load(), errOut)
	}
}
