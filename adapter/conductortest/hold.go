package conductortest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path"
	"sync"
	"testing"
)

// Holding is the real Conductor behind a reverse proxy that can hold the
// next pause, resume or terminate of a workflow (PUT /workflow/{id}/pause,
// /resume, and the bulk forms; DELETE /workflow/{id}) until the test lets
// it through, and Conductor's
// answer to it: the order in which concurrent calls reach Conductor,
// chosen by the test. Every call reaches the real server unchanged.
type Holding struct {
	mu   sync.Mutex
	next map[string]*Held // "pause" or "resume": the next such call to hold
	all  []*Held
}

// Held is one call a Holding holds.
type Held struct {
	// Entered is closed when the call reached the proxy.
	Entered chan struct{}
	// Done is closed once Conductor answered it (it landed).
	Done    chan struct{}
	release chan struct{}
	answer  chan struct{} // nil: the answer is not held
	once    sync.Once
	aonce   sync.Once
}

// Let lets the call go on to Conductor.
func (h *Held) Let() { h.once.Do(func() { close(h.release) }) }

// LetAnswer lets Conductor's answer go back to the caller (HoldNextAndAnswer).
func (h *Held) LetAnswer() {
	if h.answer != nil {
		h.aonce.Do(func() { close(h.answer) })
	}
}

// NewHolding serves a Holding in front of the test Conductor (URL) and
// returns it with its API base URL; it ends with tb, letting every held
// call through.
func NewHolding(tb testing.TB) (*Holding, string) {
	tb.Helper()
	target, err := url.Parse(URL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	h := &Holding{next: map[string]*Held{}}
	proxy := ReverseProxy(tb, target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var held *Held
		if action := holdable(r); action != "" {
			h.mu.Lock()
			if held = h.next[action]; held != nil {
				delete(h.next, action)
			}
			h.mu.Unlock()
		}
		switch {
		case held == nil:
			proxy.ServeHTTP(w, r)
		case held.answer != nil:
			close(held.Entered)
			<-held.release
			rec := httptest.NewRecorder()
			proxy.ServeHTTP(rec, r)
			close(held.Done)
			<-held.answer
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
		default:
			close(held.Entered)
			<-held.release
			proxy.ServeHTTP(w, r)
			close(held.Done)
		}
	}))
	tb.Cleanup(func() {
		h.mu.Lock()
		for _, c := range h.all {
			c.Let() // a test that failed midway leaves no call hanging
			c.LetAnswer()
		}
		h.mu.Unlock()
		srv.Close()
	})
	return h, srv.URL + target.Path
}

// holdable is the action a Holding can hold r as: "pause" or "resume" for
// PUT /workflow/{id}/{action} (and the bulk forms), "terminate" for a
// workflow's terminate (DELETE /workflow/{id}); "" for anything else.
func holdable(r *http.Request) string {
	switch {
	case r.Method == http.MethodPut:
		return path.Base(r.URL.Path)
	case r.Method == http.MethodDelete && path.Base(path.Dir(r.URL.Path)) == "workflow":
		return "terminate"
	}
	return ""
}

// HoldNext holds the next PUT /workflow/{id}/{action} (action "pause" or
// "resume"), or the next terminate (action "terminate"), until Let.
func (h *Holding) HoldNext(action string) *Held { return h.hold(action, false) }

// HoldNextAndAnswer holds the next PUT /workflow/{id}/{action} until Let
// and then, once it has landed, Conductor's answer to it until LetAnswer:
// its caller does not know yet.
func (h *Holding) HoldNextAndAnswer(action string) *Held { return h.hold(action, true) }

func (h *Holding) hold(action string, answer bool) *Held {
	c := &Held{Entered: make(chan struct{}), Done: make(chan struct{}), release: make(chan struct{})}
	if answer {
		c.answer = make(chan struct{})
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next[action] = c
	h.all = append(h.all, c)
	return c
}

// ReverseProxy is a reverse proxy to target's scheme and host for a test's
// front of Conductor, with a transport of its own whose connections close
// at the end of tb. Not http.DefaultTransport: every httptest.Server's
// Close closes that transport's idle connections, and a parallel test's
// cleanup closed one while a proxy read an answer on it ("use of closed
// network connection": the call through the proxy failed).
//
// The body it forwards keeps answering EOF once it has: Go's HTTP/1
// server closes a request's body when its handler starts writing the
// answer, and the transport reads the body once more after its
// Content-Length (to see nothing follows); a read landing after the close
// failed the write, and the transport dropped the connection with
// Conductor's answer half read ("unexpected EOF" at the caller).
func ReverseProxy(tb testing.TB, target *url.URL) *httputil.ReverseProxy {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tb.Cleanup(tr.CloseIdleConnections)
	p := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	p.Transport = tr
	direct := p.Director
	p.Director = func(r *http.Request) {
		direct(r)
		r.Body = EndedBody(r.Body)
	}
	return p
}

// EndedBody is body (a request body a proxy forwards) answering EOF,
// without reading, once it has answered it (see ReverseProxy); nil stays
// nil.
func EndedBody(body io.ReadCloser) io.ReadCloser {
	if body == nil {
		return nil
	}
	return &endedBody{ReadCloser: body}
}

type endedBody struct {
	io.ReadCloser
	ended bool
}

func (b *endedBody) Read(p []byte) (int, error) {
	if b.ended {
		return 0, io.EOF
	}
	n, err := b.ReadCloser.Read(p)
	b.ended = err == io.EOF
	return n, err
}
