package e2e

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
)

// condTimer is a pass-through in front of Conductor that times Conductor's
// answers to an SDK worker's task calls, the same way whether the worker
// calls it directly or through the sidecar's proxy (which then forwards to
// it): from the request's arrival to the answer's headers. A poll is a GET
// of /tasks/poll/... for the round's task type, an update a POST of
// /tasks/update-v2 (conductor-python 2.0.0's report); every other request
// (the sidecar's own client among them) is only counted.
type condTimer struct {
	URL string

	mu       sync.Mutex
	taskType string
	by       map[string][]time.Duration
}

func startCondTimer(t *testing.T, target string) *condTimer {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	ct := &condTimer{by: map[string][]time.Duration{}}
	rp := &httputil.ReverseProxy{
		// The same paths as asked (Conductor's /health is outside /api).
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(&url.URL{Scheme: u.Scheme, Host: u.Host})
			r.Out.Body = conductortest.EndedBody(r.Out.Body)
		},
		Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		rp.ServeHTTP(&timedWriter{ResponseWriter: w, done: func() { ct.note(r, time.Since(began)) }}, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	ct.URL = "http://" + ln.Addr().String() + "/api"
	return ct
}

// round starts a round of taskType: what was timed before is dropped.
func (c *condTimer) round(taskType string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.taskType, c.by = taskType, map[string][]time.Duration{}
}

func (c *condTimer) note(r *http.Request, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kind := "other"
	switch {
	case r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/tasks/poll/") && c.taskType != "" && strings.Contains(r.URL.Path, c.taskType):
		kind = "poll"
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/tasks/update-v2"):
		kind = "update"
	}
	c.by[kind] = append(c.by[kind], d)
}

// summary is the round's count, p50 and mean per kind, in ms, with the
// counts per task of n.
func (c *condTimer) summary(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	for _, kind := range []string{"poll", "update", "other"} {
		d := slices.Clone(c.by[kind])
		if len(d) == 0 {
			parts = append(parts, kind+" none")
			continue
		}
		slices.Sort(d)
		var sum time.Duration
		for _, x := range d {
			sum += x
		}
		parts = append(parts, fmt.Sprintf("%s %.2f/task p50 %.2f ms mean %.2f ms", kind, float64(len(d))/float64(n),
			float64(d[len(d)/2].Microseconds())/1000, float64(sum.Microseconds())/1000/float64(len(d))))
	}
	return strings.Join(parts, "; ")
}

// timedWriter calls done when the answer's headers are written.
type timedWriter struct {
	http.ResponseWriter
	done func()
	once sync.Once
}

func (w *timedWriter) WriteHeader(code int) {
	w.once.Do(w.done)
	w.ResponseWriter.WriteHeader(code)
}

func (w *timedWriter) Write(b []byte) (int, error) {
	w.once.Do(w.done)
	return w.ResponseWriter.Write(b)
}

func (w *timedWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
