package exec_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

func TestCommand_DefaultEnvironmentIsClean(t *testing.T) {
	t.Setenv("BB2_SECRET_TOKEN", "worker-only-value")
	t.Setenv("LC_TESTTRUST", "kept")
	e := startStore(t)
	reg := newRegistry(t, e.store, exec.Options{})
	res, err := reg.Execute(context.Background(), execution(t, cmd("env")))
	wantOK(t, res, err)
	out := string(artifact(t, e.store, res, exec.KindStdout))
	if strings.Contains(out, "BB2_SECRET_TOKEN") || strings.Contains(out, "worker-only-value") {
		t.Errorf("the command saw the worker's BB2_SECRET_TOKEN:\n%s", out)
	}
	for _, want := range []string{"PATH=", "LC_TESTTRUST=kept"} {
		if !strings.Contains(out, want) {
			t.Errorf("the command's environment lacks %s (default allowlist):\n%s", want, out)
		}
	}
}

func TestHTTP_LoopbackRefusedByDefault(t *testing.T) {
	srv, rec := testServer(t)
	reg := newRegistry(t, nil, exec.Options{})
	res, err := reg.Execute(context.Background(), execution(t, httpSpec("GET", srv.URL+"/ok")))
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, res, "HTTP_DESTINATION_FORBIDDEN", false)
	if rec.get().method != "" {
		t.Error("the server got the request")
	}
}

func TestParseDestination(t *testing.T) {
	tests := []struct {
		in   string
		want exec.Destination
		str  string
	}{
		{"127.0.0.1/32", exec.Destination{Prefix: netip.MustParsePrefix("127.0.0.1/32")}, "127.0.0.1/32"},
		{"10.1.2.3/8", exec.Destination{Prefix: netip.MustParsePrefix("10.0.0.0/8")}, "10.0.0.0/8"},
		{"fd00::/8", exec.Destination{Prefix: netip.MustParsePrefix("fd00::/8")}, "fd00::/8"},
		{" 127.0.0.1 ", exec.Destination{Host: "127.0.0.1"}, "127.0.0.1"},
		{"127.0.0.1:9000", exec.Destination{Host: "127.0.0.1", Port: 9000}, "127.0.0.1:9000"},
		{"::1", exec.Destination{Host: "::1"}, "::1"},
		{"[::1]", exec.Destination{Host: "::1"}, "::1"},
		{"[::1]:9000", exec.Destination{Host: "::1", Port: 9000}, "[::1]:9000"},
		{"::ffff:10.0.0.1", exec.Destination{Host: "10.0.0.1"}, "10.0.0.1"},
		{"API.Internal.", exec.Destination{Host: "api.internal"}, "api.internal"},
		{"api.internal:8443", exec.Destination{Host: "api.internal", Port: 8443}, "api.internal:8443"},
		{"my_host", exec.Destination{Host: "my_host"}, "my_host"},
	}
	for _, tt := range tests {
		got, err := exec.ParseDestination(tt.in)
		if err != nil || got != tt.want || got.String() != tt.str {
			t.Errorf("ParseDestination(%q) = %+v (%q), %v; want %+v (%q)", tt.in, got, got.String(), err, tt.want, tt.str)
		}
	}
	for _, bad := range []string{"", "10.0.0.0/33", "1.2.3.4/x", "host:0", "host:70000", "host:x", "http://host", "a b", "ho*st", "host/"} {
		if d, err := exec.ParseDestination(bad); err == nil {
			t.Errorf("ParseDestination(%q) = %+v, want an error", bad, d)
		}
	}
}

func TestFilterEnv(t *testing.T) {
	environ := []string{"PATH=/bin", "HOME=/root", "LC_ALL=C", "LC_CTYPE=UTF-8", "LCX=1", "SECRET=x", "PATHX=y", "=weird", "NOEQUALS", "TZ="}
	tests := []struct {
		name     string
		patterns []string
		want     []string
	}{
		{"Default", exec.DefaultEnvAllow, []string{"PATH=/bin", "HOME=/root", "LC_ALL=C", "LC_CTYPE=UTF-8", "TZ="}},
		{"Exact", []string{"SECRET"}, []string{"SECRET=x"}},
		{"Prefix", []string{"PATH*"}, []string{"PATH=/bin", "PATHX=y"}},
		{"None", nil, []string{}},
		{"InvalidMatchNothing", []string{"P*TH", "", "A=B"}, []string{}},
		{"All", []string{"*"}, []string{"PATH=/bin", "HOME=/root", "LC_ALL=C", "LC_CTYPE=UTF-8", "LCX=1", "SECRET=x", "PATHX=y", "TZ="}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := exec.FilterEnv(environ, tt.patterns); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
	for _, p := range []string{"", "A=B", "A*B", "**", "A\x00"} {
		if exec.CheckEnvPattern(p) == nil {
			t.Errorf("CheckEnvPattern(%q) accepted", p)
		}
	}
	for _, p := range []string{"PATH", "LC_*", "*"} {
		if err := exec.CheckEnvPattern(p); err != nil {
			t.Errorf("CheckEnvPattern(%q): %v", p, err)
		}
	}
}

func TestCommand_AllowEnv(t *testing.T) {
	t.Setenv("TRUST_KEEP_ME", "kept")
	t.Setenv("TRUST_DROP_ME", "dropped")
	e := startStore(t)
	reg := newRegistry(t, e.store, exec.Options{BaseEnv: exec.AllowEnv([]string{"PATH", "TRUST_KEEP_*"})})
	spec := cmd("env")
	spec.Env = map[string]string{"FROM_SPEC": "spec"}
	x := execution(t, spec)
	x.Secrets = map[string]string{"FROM_SECRET": "secret-value"}
	res, err := reg.Execute(context.Background(), x)
	wantOK(t, res, err)
	got := strings.Fields(string(artifact(t, e.store, res, exec.KindStdout)))
	slices.Sort(got)
	want := []string{"FROM_SECRET=[REDACTED]", "FROM_SPEC=spec", "PATH=" + os.Getenv("PATH"), "TRUST_KEEP_ME=kept"}
	if !slices.Equal(got, want) {
		t.Errorf("environment %q, want %q", got, want)
	}
}

// guardServers starts two servers on 127.0.0.1: target answers "target",
// redirector redirects every request to target.
func guardServers(t *testing.T) (target, redirector *httptest.Server, hits *atomic.Int64) {
	hits = &atomic.Int64{}
	target = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "target")
	}))
	t.Cleanup(target.Close)
	redirector = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/after-redirect", http.StatusFound)
	}))
	t.Cleanup(redirector.Close)
	return target, redirector, hits
}

func dests(t *testing.T, ss ...string) []exec.Destination {
	t.Helper()
	var out []exec.Destination
	for _, s := range ss {
		d, err := exec.ParseDestination(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

func TestHTTP_DestinationGuard(t *testing.T) {
	target, redirector, hits := guardServers(t)
	tu, _ := url.Parse(target.URL)
	ru, _ := url.Parse(redirector.URL)
	port := tu.Port()
	tests := []struct {
		name        string
		allow, deny []string
		url         string
		ok          bool
	}{
		{"LoopbackRefused", nil, nil, target.URL, false},
		{"LoopbackAllowedByCIDR", []string{"127.0.0.1/32"}, nil, target.URL, true},
		{"LoopbackAllowedByHostPort", []string{tu.Host}, nil, target.URL, true},
		{"OtherPortNotAllowed", []string{"127.0.0.1:1"}, nil, target.URL, false},
		{"OtherCIDRNotAllowed", []string{"10.0.0.0/8"}, nil, target.URL, false},
		{"LocalhostRefused", nil, nil, "http://localhost:" + port + "/", false},
		{"LocalhostAllowedByCIDR", []string{"127.0.0.1/32"}, nil, "http://localhost:" + port + "/", true},
		{"LocalhostAllowedByName", []string{"localhost"}, nil, "http://localhost:" + port + "/", true},
		{"MappedIPv6Refused", nil, nil, "http://[::ffff:127.0.0.1]:" + port + "/", false},
		{"APIAlwaysDenied", []string{"127.0.0.1/32"}, []string{tu.Host}, target.URL, false},
		{"APIAlwaysDeniedByHostEntry", []string{tu.Host}, []string{tu.Host}, target.URL, false},
		{"APIDeniedViaLocalhost", []string{"127.0.0.1/32", "localhost"}, []string{tu.Host}, "http://localhost:" + port + "/", false},
		{"APIDeniedOnOtherLoopback", []string{"127.0.0.0/8"}, []string{tu.Host}, "http://127.0.0.2:" + port + "/", false},
		{"ConductorNameDeniedViaIP", []string{"127.0.0.1/32"}, []string{"localhost:" + port}, target.URL, false},
		{"DenyOtherPortAllows", []string{"127.0.0.1/32"}, []string{"127.0.0.1:1"}, target.URL, true},
		{"RedirectToForbidden", []string{ru.Host}, nil, redirector.URL, false},
		{"RedirectToDenied", []string{"127.0.0.1/32"}, []string{tu.Host}, redirector.URL, false},
		{"RedirectToAllowed", []string{ru.Host, tu.Host}, nil, redirector.URL, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newRegistry(t, nil, exec.Options{HTTPAllow: dests(t, tt.allow...), HTTPDeny: dests(t, tt.deny...)})
			before := hits.Load()
			res, err := reg.Execute(context.Background(), execution(t, httpSpec("GET", tt.url)))
			if err != nil {
				t.Fatal(err)
			}
			if tt.ok {
				wantOK(t, res, nil)
				if hits.Load() != before+1 {
					t.Error("the target did not get the request")
				}
				return
			}
			se := wantErr(t, res, exec.CodeHTTPDestinationForbidden, false)
			if hits.Load() != before {
				t.Error("the target got the request")
			}
			if len(tt.deny) > 0 && !strings.Contains(se.Message, "never allowed") {
				t.Errorf("message %q does not say the address is never allowed", se.Message)
			}
		})
	}
}

// TestHTTP_ProxyIgnored: a proxy from the environment would carry a
// request to a forbidden address past the guard (the guard would only
// see the proxy's address), so the executor uses none.
func TestHTTP_ProxyIgnored(t *testing.T) {
	var proxied atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		fmt.Fprint(w, "via proxy")
	}))
	defer proxy.Close()
	t.Setenv("HTTP_PROXY", proxy.URL)
	t.Setenv("http_proxy", proxy.URL)
	t.Setenv("NO_PROXY", "")
	// 10.255.255.1 is private: refused, unless a proxy carried it.
	reg := newRegistry(t, nil, exec.Options{HTTPAllow: allowLoopback})
	res, err := reg.Execute(context.Background(), execution(t, httpSpec("GET", "http://10.255.255.1/x")))
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, res, exec.CodeHTTPDestinationForbidden, false)
	if proxied.Load() != 0 {
		t.Error("the request went through HTTP_PROXY")
	}
}

func TestDestinationError_Is(t *testing.T) {
	var err error = &exec.DestinationError{Host: "h", Reason: "loopback"}
	if !errors.Is(fmt.Errorf("dial: %w", err), exec.ErrDestinationForbidden) {
		t.Error("errors.Is(wrapped DestinationError, ErrDestinationForbidden) is false")
	}
	if errors.Is(errors.New("other"), exec.ErrDestinationForbidden) {
		t.Error("an unrelated error matched")
	}
}
