package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
)

// TestAPIConfig_AllowedHosts: --api-allowed-hosts reaches the API (a Host
// it names is answered, another is refused), and a value with a port is
// a problem of the configuration.
func TestAPIConfig_AllowedHosts(t *testing.T) {
	var cfg apiConfig
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.registerFlags(fs, &envSettings{})
	if err := fs.Parse([]string{"--api-allowed-hosts", "sidecar.jobs.svc, sidecar"}); err != nil {
		t.Fatal(err)
	}
	if p := cfg.validate("127.0.0.1:8787"); len(p) != 0 {
		t.Fatalf("validate: %v", p)
	}
	opts := httpapi.Options{Log: memstore.New(statestore.ProjectorOptions{}), Logger: zaptest.NewLogger(t)}
	if err := cfg.apply(&opts, zaptest.NewLogger(t)); err != nil {
		t.Fatal(err)
	}
	h := httpapi.NewServer(opts).Handler()
	for host, want := range map[string]int{"sidecar.jobs.svc:8787": http.StatusNotFound, "sidecar": http.StatusNotFound, "evil.example": http.StatusForbidden} {
		req := httptest.NewRequest("GET", "/v1/runs/none", nil)
		req.Host = host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != want {
			t.Errorf("Host %s: %d %s, want %d", host, w.Code, w.Body, want)
		}
	}
	bad := apiConfig{AllowedHosts: "sidecar:8787"}
	if p := bad.validate("127.0.0.1:8787"); len(p) != 1 || !strings.Contains(p[0], "--api-allowed-hosts") {
		t.Fatalf("a host with a port: %v, want one problem naming --api-allowed-hosts", p)
	}
}

// TestAPIConfig_ReloadRefusesAReadableTokensFile: a tokens file that
// became readable by others is not reloaded on SIGHUP (the previous
// principals stay, one error line says why), as it would be refused at
// start; once its mode is fixed, the next reload takes it.
func TestAPIConfig_ReloadRefusesAReadableTokensFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	principal := func(name, token string) string {
		sum := sha256.Sum256([]byte(token))
		return "  - name: " + name + "\n    tokenSha256: " + hex.EncodeToString(sum[:]) + "\n    roles: [viewer]\n"
	}
	one := "principals:\n" + principal("a", "tok-a")
	if err := os.WriteFile(path, []byte(one), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := apiConfig{TokensFile: path}
	opts := httpapi.Options{Log: memstore.New(statestore.ProjectorOptions{}), Logger: zaptest.NewLogger(t)}
	if err := cfg.apply(&opts, zaptest.NewLogger(t)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(one+principal("b", "tok-b")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.ErrorLevel)
	cfg.reload(zap.New(core))
	if n := cfg.creds.Len(); n != 1 {
		t.Fatalf("a tokens file readable by others was reloaded: %d principals, want the previous 1", n)
	}
	if logs.Len() != 1 || !strings.Contains(logs.All()[0].ContextMap()["error"].(string), "chmod 600") {
		t.Fatalf("want one error line naming the fix, got %v", logs.All())
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.reload(zaptest.NewLogger(t))
	if n := cfg.creds.Len(); n != 2 {
		t.Fatalf("after chmod 600 the reload took %d principals, want 2", n)
	}
}

// TestAPIConfig_NotifySecret: the notification secret file gives the API
// its secret without surrounding white space; a secret too short, or one
// an HTTP header cannot carry, is refused before serve starts.
func TestAPIConfig_NotifySecret(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, content, want, problem string
	}{
		{"OK", "0123456789abcdef0123\n", "0123456789abcdef0123", ""},
		{"Short", "0123456789abcde\n", "", "holds 15 characters"},
		{"Space", "0123456789 abcdef0123", "", "visible ASCII"},
		{"NotASCII", "0123456789abcdefé", "", "visible ASCII"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, tt.name)
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			c := apiConfig{NotifySecretFile: path}
			problems := strings.Join(c.validate("127.0.0.1:8787"), "\n")
			var o httpapi.Options
			err := c.apply(&o, zap.NewNop())
			if tt.problem == "" {
				if problems != "" || err != nil || string(o.NotifySecret) != tt.want {
					t.Fatalf("problems %q, apply %v, secret %q; want none and %q", problems, err, o.NotifySecret, tt.want)
				}
				return
			}
			if !strings.Contains(problems, tt.problem) || err == nil || o.NotifySecret != nil {
				t.Fatalf("problems %q, apply %v, secret %q; want %q and no secret", problems, err, o.NotifySecret, tt.problem)
			}
		})
	}
}
