package exec_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// seen is what the test server saw of the last request.
type seen struct {
	method string
	header http.Header
	body   string
	query  string
	host   string
}

type recorded struct {
	mu   sync.Mutex
	last seen
}

func (r *recorded) get() seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

func testServer(t *testing.T) (*httptest.Server, *recorded) {
	rec := &recorded{}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.last = seen{method: r.Method, header: r.Header.Clone(), body: string(b), query: r.URL.RawQuery, host: r.Host}
		rec.mu.Unlock()
		switch {
		case r.URL.Path == "/ok":
			fmt.Fprint(w, "hello")
		case r.URL.Path == "/echo":
			// Echoes what it got, secrets included: the executor must redact.
			fmt.Fprintf(w, "method=%s auth=%s query=%s body=%s", r.Method, r.Header.Get("Authorization"), r.URL.RawQuery, b)
		case strings.HasPrefix(r.URL.Path, "/status/"):
			code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
			w.WriteHeader(code)
			fmt.Fprintf(w, "status %d", code)
		case r.URL.Path == "/slow":
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		case r.URL.Path == "/big":
			fmt.Fprint(w, strings.Repeat("a", 3000)+strings.Repeat("z", 2000))
		case r.URL.Path == "/redirect":
			http.Redirect(w, r, "/ok", http.StatusTemporaryRedirect)
		default:
			http.NotFound(w, r)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, rec
}

func httpSpec(method, url string) plan.ExecutorSpec {
	return plan.ExecutorSpec{Type: plan.ExecutorHTTP, Method: method, URL: url}
}

func TestHTTP_Execute(t *testing.T) {
	e := startStore(t)
	srv, rec := testServer(t)
	reg := newRegistry(t, e.store, exec.Options{HTTPAllow: allowLoopback})
	ctx := context.Background()

	t.Run("OK", func(t *testing.T) {
		res, err := reg.Execute(ctx, execution(t, httpSpec("", srv.URL+"/ok")))
		wantOK(t, res, err)
		if got := string(artifact(t, e.store, res, exec.KindHTTPResponse)); got != "hello" {
			t.Errorf("body %q", got)
		}
		if res.Output["status"] != 200 || res.Output["responseBytes"] != int64(5) {
			t.Errorf("output %v", res.Output)
		}
		if got := rec.get().method; got != "GET" {
			t.Errorf("method %q want GET by default", got)
		}
	})
	t.Run("MethodHeadersBody", func(t *testing.T) {
		spec := httpSpec("post", srv.URL+"/echo?a=1")
		spec.Headers = map[string]string{"Content-Type": "application/json", "X-Custom": "v 1", "Host": "example.test"}
		spec.Body = `{"k":"v"}`
		res, err := reg.Execute(ctx, execution(t, spec))
		wantOK(t, res, err)
		got := rec.get()
		if got.method != "POST" || got.header.Get("Content-Type") != "application/json" || got.header.Get("X-Custom") != "v 1" ||
			got.body != `{"k":"v"}` || got.query != "a=1" || got.host != "example.test" {
			t.Errorf("server saw %+v", got)
		}
	})
	t.Run("Traceparent", func(t *testing.T) {
		const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		x := execution(t, httpSpec("GET", srv.URL+"/ok"))
		x.Traceparent = tp
		res, err := reg.Execute(ctx, x)
		wantOK(t, res, err)
		if got := rec.get().header.Get("traceparent"); got != tp {
			t.Errorf("traceparent header %q, want the step attempt's %q", got, tp)
		}
		res, err = reg.Execute(ctx, execution(t, httpSpec("GET", srv.URL+"/ok")))
		wantOK(t, res, err)
		if got := rec.get().header.Get("traceparent"); got != "" {
			t.Errorf("traceparent header %q while tracing is off", got)
		}
	})
	t.Run("Redirect", func(t *testing.T) {
		res, err := reg.Execute(ctx, execution(t, httpSpec("GET", srv.URL+"/redirect")))
		wantOK(t, res, err)
		if got := string(artifact(t, e.store, res, exec.KindHTTPResponse)); got != "hello" {
			t.Errorf("body %q", got)
		}
	})
	t.Run("Non2xx", func(t *testing.T) {
		for _, tc := range []struct {
			status    int
			retryable []int
			want      bool
		}{
			{404, nil, false}, {400, nil, false}, {503, nil, true}, {429, nil, true}, {408, nil, true},
			{500, nil, true}, {502, nil, true}, {504, nil, true}, {501, nil, false}, {304, nil, false},
			{404, []int{404}, true}, {503, []int{404}, false},
		} {
			t.Run(fmt.Sprintf("%d%v", tc.status, tc.retryable), func(t *testing.T) {
				spec := httpSpec("GET", fmt.Sprintf("%s/status/%d", srv.URL, tc.status))
				spec.RetryableStatus = tc.retryable
				res, err := reg.Execute(ctx, execution(t, spec))
				if err != nil {
					t.Fatal(err)
				}
				se := wantErr(t, res, fmt.Sprintf("HTTP_STATUS_%d", tc.status), tc.want)
				if !strings.Contains(se.Message, strconv.Itoa(tc.status)) {
					t.Errorf("message %q", se.Message)
				}
				if res.Output["status"] != tc.status {
					t.Errorf("output %v", res.Output)
				}
				if tc.status != 304 {
					if got := string(artifact(t, e.store, res, exec.KindHTTPResponse)); got != fmt.Sprintf("status %d", tc.status) {
						t.Errorf("body %q", got)
					}
				}
			})
		}
	})
	t.Run("TransportError", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		res, err := reg.Execute(ctx, execution(t, httpSpec("GET", "http://"+addr+"/")))
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, res, exec.CodeHTTPRequestFailed, true)
		if len(res.Artifacts) != 0 {
			t.Errorf("artifacts %v without a response", res.Artifacts)
		}
	})
	t.Run("TransportErrorRedactsEscapedSecret", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		const secret = "p@ss w/rd&x=é"
		x := execution(t, httpSpec("GET", "http://"+addr+"/a/${secret:S}?q=${secret:S}"))
		x.Secrets = map[string]string{"S": secret}
		res, err := reg.Execute(ctx, x)
		if err != nil {
			t.Fatal(err)
		}
		se := wantErr(t, res, exec.CodeHTTPRequestFailed, true)
		for _, form := range []string{secret, url.QueryEscape(secret), url.PathEscape(secret), "p@ss", "rd&x", "rd%26x", "%C3%A9"} {
			if strings.Contains(se.Message, form) {
				t.Errorf("message %q holds %q", se.Message, form)
			}
		}
	})
	t.Run("StepTimeout", func(t *testing.T) {
		tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		res, err := reg.Execute(tctx, execution(t, httpSpec("GET", srv.URL+"/slow")))
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, res, exec.CodeStepTimeout, true)
	})
	t.Run("Cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(200*time.Millisecond, cancel)
		res, err := reg.Execute(cctx, execution(t, httpSpec("GET", srv.URL+"/slow")))
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, res, exec.CodeStepInterrupted, false)
	})
	t.Run("DefaultTimeout", func(t *testing.T) {
		reg := newRegistry(t, e.store, exec.Options{HTTPTimeout: 200 * time.Millisecond, HTTPAllow: allowLoopback})
		start := time.Now()
		res, err := reg.Execute(ctx, execution(t, httpSpec("GET", srv.URL+"/slow")))
		if err != nil {
			t.Fatal(err)
		}
		se := wantErr(t, res, exec.CodeHTTPRequestFailed, true)
		if !strings.Contains(se.Message, "200ms") || time.Since(start) > 5*time.Second {
			t.Errorf("message %q after %s", se.Message, time.Since(start))
		}
	})
	t.Run("Truncated", func(t *testing.T) {
		reg := newRegistry(t, e.store, exec.Options{MaxCaptureBytes: 1000, HTTPAllow: allowLoopback})
		res, err := reg.Execute(ctx, execution(t, httpSpec("GET", srv.URL+"/big")))
		wantOK(t, res, err)
		got := string(artifact(t, e.store, res, exec.KindHTTPResponse))
		want := strings.Repeat("a", 500) + "\n[... 4000 bytes omitted ...]\n" + strings.Repeat("z", 500)
		if got != want || res.Output["responseTruncated"] != true || res.Output["responseBytes"] != int64(5000) {
			t.Errorf("got %d bytes, output %v", len(got), res.Output)
		}
	})
	t.Run("SecretSubstitution", func(t *testing.T) {
		spec := httpSpec("PUT", srv.URL+"/echo?token=${secret:TOKEN}&x=${other}")
		spec.Headers = map[string]string{"Authorization": "Bearer ${secret:TOKEN}"}
		spec.Body = `{"password":"${secret:PW}","n":"${secret:TOKEN}"}`
		x := execution(t, spec)
		x.Secrets = map[string]string{"TOKEN": "tok-12345", "PW": "pw-67890"}
		res, err := reg.Execute(ctx, x)
		wantOK(t, res, err)
		got := rec.get()
		if got.header.Get("Authorization") != "Bearer tok-12345" || got.query != "token=tok-12345&x=${other}" ||
			got.body != `{"password":"pw-67890","n":"tok-12345"}` {
			t.Errorf("server saw %+v", got)
		}
		body := string(artifact(t, e.store, res, exec.KindHTTPResponse))
		if strings.Contains(body, "tok-12345") || strings.Contains(body, "pw-67890") || !strings.Contains(body, "[REDACTED]") {
			t.Errorf("stored body not redacted: %q", body)
		}
	})
}
