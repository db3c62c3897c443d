package exec_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
)

// TestSecrets_NeverLeak resolves a secret with a unique random value, uses
// it in a command that prints it and in HTTP calls that send it, and checks
// that the value appears in no log line, no Result (output, error,
// artifact references) and no stored artifact, while the command and the
// server did get it.
func TestSecrets_NeverLeak(t *testing.T) {
	b := make([]byte, 16)
	rand.Read(b)
	value := "sv-" + hex.EncodeToString(b)
	t.Setenv("SIDECAR_TEST_SECRET_"+value[3:11], value)

	log, logs := testLogger(t)
	e := startStore(t)
	srv, rec := testServer(t)
	reg := exec.New(exec.Options{Artifacts: e.store, Logger: log, HTTPAllow: allowLoopback})
	resolver := &secrets.Resolver{Logger: log, EnvAllow: []string{"SIDECAR_TEST_SECRET_*"}}
	vals, err := resolver.Resolve(context.Background(), []plan.SecretRef{{Name: "API_TOKEN", Ref: "env:SIDECAR_TEST_SECRET_" + value[3:11]}})
	if err != nil {
		t.Fatal(err)
	}
	if vals["API_TOKEN"] != value {
		t.Fatal("resolver did not return the value")
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()

	type step struct {
		name string
		spec plan.ExecutorSpec
	}
	echoSpec := plan.ExecutorSpec{Type: plan.ExecutorHTTP, Method: "POST", URL: srv.URL + "/echo?t=${secret:API_TOKEN}",
		Headers: map[string]string{"Authorization": "Bearer ${secret:API_TOKEN}"}, Body: `{"token":"${secret:API_TOKEN}"}`}
	failSpec := echoSpec
	failSpec.URL = srv.URL + "/status/500?t=${secret:API_TOKEN}"
	steps := []step{
		// Prints it to stdout and stderr, in an error exit (stderr lands in
		// the error message) and on success.
		{"CommandFails", sh(`echo "token is $API_TOKEN"; echo "err $API_TOKEN" >&2; exit 2`)},
		{"CommandOK", sh(`printf '%s' "$API_TOKEN"; printf 'x%sy' "$API_TOKEN" >&2`)},
		{"HTTPEcho", echoSpec},
		{"HTTP500", failSpec},
		// A transport error quotes the URL, which holds the value.
		{"HTTPTransport", plan.ExecutorSpec{Type: plan.ExecutorHTTP, URL: "http://" + closed + "/p/${secret:API_TOKEN}?t=${secret:API_TOKEN}"}},
	}
	var results []taskworkers.Result
	for _, s := range steps {
		x := execution(t, s.spec)
		x.Secrets = vals
		res, err := reg.Execute(context.Background(), x)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		results = append(results, res)
		for _, ref := range res.Artifacts {
			data := artifact(t, e.store, res, ref.Kind)
			if strings.Contains(string(data), value) {
				t.Errorf("%s: artifact %s holds the secret: %q", s.name, ref.Kind, data)
			}
		}
		j, _ := json.Marshal(res)
		if strings.Contains(string(j), value) {
			t.Errorf("%s: result holds the secret: %s", s.name, j)
		}
		t.Logf("%s: %s", s.name, j)
	}
	// The secret did reach the command and the server.
	if got := string(artifact(t, e.store, results[1], exec.KindStdout)); got != secrets.Placeholder {
		t.Errorf("command stdout %q, want exactly the placeholder", got)
	}
	if got := string(artifact(t, e.store, results[1], exec.KindStderr)); got != "x"+secrets.Placeholder+"y" {
		t.Errorf("command stderr %q", got)
	}
	if results[0].Err == nil || !strings.Contains(results[0].Err.Message, "err "+secrets.Placeholder) {
		t.Errorf("error %+v should quote the redacted stderr", results[0].Err)
	}
	if results[4].Err == nil || results[4].Err.Code != exec.CodeHTTPRequestFailed {
		t.Errorf("transport step: %+v", results[4].Err)
	}
	if got := rec.get(); got.header.Get("Authorization") != "Bearer "+value {
		t.Errorf("server did not get the secret in the header: %v", got.header)
	}
	if out := logs.String(); strings.Contains(out, value) || !strings.Contains(out, "command finished") {
		t.Errorf("logs hold the secret, or logged nothing:\n%s", out)
	}
}
