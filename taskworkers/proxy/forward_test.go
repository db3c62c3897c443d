package proxy_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
)

// lateRead carries the proxy's forwarded calls to Conductor and, as
// net/http's transport may, reads a call's body once more after its
// Content-Length (to see nothing follows) while the answer is being
// copied to the worker: here always, once the proxy has written the
// answer's first bytes, when its HTTP server has drained and closed the
// call's body. late gets what that read answered.
type lateRead struct {
	late chan error
}

func (l *lateRead) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body == nil || r.ContentLength <= 0 {
		return http.DefaultTransport.RoundTrip(r)
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, r.ContentLength))
	if err != nil {
		return nil, err
	}
	out := r.Clone(r.Context())
	out.Body = io.NopCloser(bytes.NewReader(b))
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	resp.Body = &readsLate{ReadCloser: resp.Body, call: r.Body, late: l.late}
	return resp, nil
}

// readsLate is an answer's body that reads its call's body at its second
// read, the first after the proxy wrote some of the answer (its first
// read answers no EOF, so that a second one comes).
type readsLate struct {
	io.ReadCloser
	call  io.Reader
	late  chan error
	reads int
	ended bool
}

func (b *readsLate) Read(p []byte) (int, error) {
	switch b.reads++; {
	case b.reads == 2:
		_, err := b.call.Read(make([]byte, 1))
		b.late <- err
	case b.ended:
		return 0, io.EOF
	}
	n, err := b.ReadCloser.Read(p)
	if b.reads == 1 && n > 0 && err == io.EOF {
		b.ended, err = true, nil
	}
	return n, err
}

// TestProxy_ForwardedBodyEndsOnceEvenWhileAnswering: the body of a call
// the proxy forwards answers EOF to a read after its end even once the
// proxy has begun the answer, when its HTTP server has closed the body.
// An error there fails net/http's write of the call, and the transport
// drops the connection while the proxy copies Conductor's answer: the
// worker gets it cut ("unexpected EOF"). That read lands after the close
// only on a busy machine; the transport here makes it always, on a
// worker's token request (POST /token), whose answer Conductor sends
// with a body.
func TestProxy_ForwardedBodyEndsOnceEvenWhileAnswering(t *testing.T) {
	l := &lateRead{late: make(chan error, 1)}
	e := newEnvOpts(t, envOpts{transport: l})
	key := map[string]string{"keyId": "worker", "keySecret": "secret"}
	resp, body := call(t, http.MethodPost, e.url+"/token", key)
	direct, want := call(t, http.MethodPost, conductortest.URL(t)+"/token", key)
	if resp.StatusCode != direct.StatusCode || !bytes.Equal(body, want) {
		t.Fatalf("POST /token through the proxy: HTTP %d %q; straight to Conductor: HTTP %d %q", resp.StatusCode, body, direct.StatusCode, want)
	}
	select {
	case err := <-l.late:
		if err != io.EOF {
			t.Fatalf("a read of the forwarded body after its end, the answer begun: %v, want EOF", err)
		}
	default:
		t.Fatal("Conductor's answer had no body: nothing read the call's body late")
	}
}
