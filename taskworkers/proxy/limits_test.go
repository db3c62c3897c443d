package proxy_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/conductor-sidecar/sidecar/taskworkers/proxy"
)

// limitedEnv is newEnv with the proxy's limits set by limits and its
// metrics in reg.
func limitedEnv(t *testing.T, reg *prometheus.Registry, limits func(*proxy.Options), tokens ...string) *env {
	t.Helper()
	return newEnvOpts(t, envOpts{tokens: tokens, proxy: func(o *proxy.Options) {
		o.Metrics = proxy.NewMetrics(reg)
		limits(o)
	}})
}

// stalled sends a request's line and headers (Content-Length n) and
// prefix of its body, and no more.
func stalled(t *testing.T, e *env, path string, n int, prefix string, header ...string) net.Conn {
	t.Helper()
	u, _ := url.Parse(e.url)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := strings.Join(append(header, ""), "\r\n")
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s", path, u.Host, n, h, prefix); err != nil {
		t.Fatal(err)
	}
	return c
}

// answer reads the answer on c (within a safety net of minutes): its
// status and the proxy's error code, if any.
func answer(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct{ Code string }
	_ = json.Unmarshal(b, &e)
	return resp.StatusCode, e.Code
}

// held is sidecar_proxy_buffered_bytes in reg (-1: not there).
func held(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sidecar_proxy_buffered_bytes" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// TestProxy_UpdateOverItsBudgetIsRefused: an update whose body exceeds
// MaxUpdateBytes is answered 413 PROXY_UPDATE_TOO_LARGE, announced
// (Content-Length, refused before a byte of it is read) or not (chunked).
func TestProxy_UpdateOverItsBudgetIsRefused(t *testing.T) {
	const max = 1 << 20
	reg := prometheus.NewRegistry()
	e := limitedEnv(t, reg, func(o *proxy.Options) { o.MaxUpdateBytes, o.MaxBufferedBytes = max, 4*max })
	big := `{"taskId":"nope-1","workflowInstanceId":"nope-wf","status":"COMPLETED","outputData":{"k":"` + strings.Repeat("x", max) + `"}}`

	resp, body := call(t, http.MethodPost, e.url+"/tasks", json.RawMessage(big))
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), proxy.CodeUpdateTooLarge) {
		t.Fatalf("an update of %d bytes (bound %d): %d %s, want 413 %s", len(big), max, resp.StatusCode, body, proxy.CodeUpdateTooLarge)
	}
	// Announced: answered at once, with the body not sent.
	c := stalled(t, e, "/api/tasks/update-v2", max+1, "{")
	if st, code := answer(t, c); st != http.StatusRequestEntityTooLarge || code != proxy.CodeUpdateTooLarge {
		t.Fatalf("Content-Length %d, body not sent: %d %s, want 413 %s", max+1, st, code, proxy.CodeUpdateTooLarge)
	}
	// Not announced.
	req, _ := http.NewRequest(http.MethodPost, e.url+"/tasks", io.MultiReader(strings.NewReader(big)))
	req.ContentLength = -1
	req.Header.Set("Content-Type", "application/json")
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b2), proxy.CodeUpdateTooLarge) {
		t.Fatalf("a chunked update of %d bytes: %d %s, want 413 %s", len(big), r2.StatusCode, b2, proxy.CodeUpdateTooLarge)
	}
	// A forwarded call's body has the same bound.
	resp, body = call(t, http.MethodPost, e.url+"/metadata/taskdefs", json.RawMessage(`[{"name":"`+strings.Repeat("x", max)+`"}]`))
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a task definition of %d bytes: %d %s, want 413", max, resp.StatusCode, body)
	}
	if h := held(t, reg); h != 0 {
		t.Fatalf("%v bytes still held after the refused updates, want 0", h)
	}
}

// TestProxy_UpdateBodiesHeldAtOnceAreBounded: updates that would hold
// more than MaxBufferedBytes at once wait for room and, none freed within
// BufferWait, are answered 503 PROXY_BUSY unread; the bytes held never
// pass the bound, and are given back when the updates end.
func TestProxy_UpdateBodiesHeldAtOnceAreBounded(t *testing.T) {
	const max = 1 << 20
	reg := prometheus.NewRegistry()
	e := limitedEnv(t, reg, func(o *proxy.Options) {
		o.MaxUpdateBytes, o.MaxBufferedBytes, o.BufferWait = max, 2*max, 200*time.Millisecond
	})
	body := func(id string) string {
		s := `{"taskId":"` + id + `","workflowInstanceId":"nope-wf","status":"COMPLETED","outputData":{"k":"`
		return s + strings.Repeat("x", max-len(s)-3) + `"}}`
	}
	var conns []net.Conn
	for i := 1; i <= 2; i++ {
		b := body(fmt.Sprint("nope-", i))
		conns = append(conns, stalled(t, e, "/api/tasks", len(b), b[:10]))
		waitFor(t, fmt.Sprintf("%d stalled updates held", i), 2*time.Minute, func() bool { return held(t, reg) == float64(i*max) })
	}
	// No room: answered busy, not read.
	third := stalled(t, e, "/api/tasks", max, "{")
	if st, code := answer(t, third); st != http.StatusServiceUnavailable || code != proxy.CodeBusy {
		t.Fatalf("a third update of %d bytes with %d held (bound %d): %d %s, want 503 %s", max, 2*max, 2*max, st, code, proxy.CodeBusy)
	}
	if h := held(t, reg); h != 2*max {
		t.Fatalf("%v bytes held, want %d (the bound)", h, 2*max)
	}
	// The stalled ones end: Conductor answers them, the room is given back.
	for i, c := range conns {
		b := body(fmt.Sprint("nope-", i+1))
		if _, err := io.WriteString(c, b[10:]); err != nil {
			t.Fatal(err)
		}
		if st, code := answer(t, c); code != "" || st/100 == 2 {
			t.Fatalf("update %d: %d %s, want Conductor's refusal of an unknown task", i+1, st, code)
		}
	}
	waitFor(t, "the room given back", 2*time.Minute, func() bool { return held(t, reg) == 0 })
}

// TestProxy_TrickledBodyIsCut: a body that arrives a byte at a time is
// cut at the listener's read timeout, not read for as long as the client
// keeps sending.
func TestProxy_TrickledBodyIsCut(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := limitedEnv(t, reg, func(o *proxy.Options) { o.ReadTimeout = time.Second })
	const n = 40 // bytes, one per 250 ms: 10 s to send
	c := stalled(t, e, "/api/tasks", n, "")
	sent := make(chan int, 1)
	go func() {
		i := 0
		for ; i < n; i++ {
			if _, err := c.Write([]byte{' '}); err != nil {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		sent <- i
	}()
	st, code := answer(t, c)
	c.Close()
	if i := <-sent; i >= n {
		t.Fatalf("all %d bytes of the trickled body were sent before the proxy answered (%d %s): not cut at its 1s read timeout", n, st, code)
	}
	if st != http.StatusRequestTimeout || code != proxy.CodeRequestTimeout {
		t.Fatalf("trickled body: %d %s, want 408 %s", st, code, proxy.CodeRequestTimeout)
	}
}

// TestProxy_UnauthorizedBodyIsNotRead: without the proxy's token an
// update is answered 401 before its body is read or room is taken for it.
func TestProxy_UnauthorizedBodyIsNotRead(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := limitedEnv(t, reg, func(o *proxy.Options) {}, "s3cret")
	c := stalled(t, e, "/api/tasks", 1<<20, "{")
	if st, code := answer(t, c); st != http.StatusUnauthorized || code != proxy.CodeUnauthorized {
		t.Fatalf("no token, body not sent: %d %s, want 401 %s", st, code, proxy.CodeUnauthorized)
	}
	if h := held(t, reg); h != 0 {
		t.Fatalf("%v bytes held for an unauthorized update, want 0", h)
	}
}
