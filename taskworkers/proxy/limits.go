package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/sync/semaphore"
)

// Defaults of the proxy's admission limits (Options).
const (
	// DefaultMaxUpdateBytes bounds one request's body: Conductor's own
	// maxTaskOutputPayloadSizeThreshold (10 MB; a larger output fails
	// the task there) with room for the rest of a task result (its
	// logs, its reason).
	DefaultMaxUpdateBytes = 16 << 20
	// DefaultMaxBufferedBytes bounds the update bodies held at once,
	// across requests: four of the largest, thousands of usual ones.
	DefaultMaxBufferedBytes = 64 << 20
	// DefaultBufferWait is how long an update waits for room before it
	// is answered 503 CodeBusy.
	DefaultBufferWait = 2 * time.Second
	// DefaultMaxUpstreamConnections bounds the connections to Conductor
	// the proxy has open at once, so its forwarded requests at once: a
	// further request waits for one (for as long as its worker waits).
	// Each forwarded request holds a descriptor beside its worker's, which
	// the listener's bound does not count, and a request thread of
	// Conductor's (Tomcat's pool: 200 by default), which serve's own calls
	// to Conductor need too.
	DefaultMaxUpstreamConnections = 64
	// The listener's timeouts, as the control API's (httpapi).
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 2 * time.Minute
	DefaultIdleTimeout       = 60 * time.Second
	// DefaultStallTimeout cuts an answer of a forwarded call whose worker
	// stopped reading it (Options.StallTimeout).
	DefaultStallTimeout = 10 * time.Second
	// MaxHeaderBytes bounds a request's line and headers (431 beyond).
	MaxHeaderBytes = 64 << 10
)

// setLimitDefaults fills the zero limits of o with their defaults.
func setLimitDefaults(o *Options) error {
	for _, d := range []struct {
		p *time.Duration
		v time.Duration
	}{{&o.BufferWait, DefaultBufferWait}, {&o.ReadHeaderTimeout, DefaultReadHeaderTimeout}, {&o.ReadTimeout, DefaultReadTimeout},
		{&o.WriteTimeout, DefaultWriteTimeout}, {&o.IdleTimeout, DefaultIdleTimeout}, {&o.StallTimeout, DefaultStallTimeout}} {
		if *d.p <= 0 {
			*d.p = d.v
		}
	}
	if o.MaxUpdateBytes <= 0 {
		o.MaxUpdateBytes = DefaultMaxUpdateBytes
	}
	if o.MaxTaskOutputBytes <= 0 {
		o.MaxTaskOutputBytes = DefaultMaxTaskOutputBytes
	}
	if o.MaxBufferedBytes <= 0 {
		o.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if o.MaxUpstreamConnections <= 0 {
		o.MaxUpstreamConnections = DefaultMaxUpstreamConnections
	}
	if o.MaxUpstreamConnections < 2 {
		return errors.New("proxy: Options.MaxUpstreamConnections must be at least 2 (polls and updates each need one)")
	}
	if o.MaxBufferedBytes < o.MaxUpdateBytes {
		return errors.New("proxy: Options.MaxBufferedBytes must be at least Options.MaxUpdateBytes")
	}
	return nil
}

// buffers bounds the bytes of update bodies the proxy holds at once.
type buffers struct {
	sem *semaphore.Weighted
	m   *Metrics
}

func newBuffers(max int64, m *Metrics) *buffers {
	return &buffers{sem: semaphore.NewWeighted(max), m: m}
}

// acquire takes n bytes of room, waiting until ctx is done.
func (b *buffers) acquire(ctx context.Context, n int64) error {
	if err := b.sem.Acquire(ctx, n); err != nil {
		return err
	}
	b.m.buffered(n)
	return nil
}

func (b *buffers) release(n int64) {
	b.m.buffered(-n)
	b.sem.Release(n)
}

// readBody reads a request's body within the limits: past
// Options.MaxUpdateBytes it answers 413 (from Content-Length before
// reading anything), when the updates in progress hold
// Options.MaxBufferedBytes for longer than Options.BufferWait 503, a body
// cut by the read timeout 408. ok false: answered. release gives the
// room back; call it once the body is no longer needed.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) (body []byte, release func(), ok bool) {
	max := p.opts.MaxUpdateBytes
	if r.ContentLength > max {
		p.opts.Metrics.request("too_large")
		writeError(w, http.StatusRequestEntityTooLarge, CodeUpdateTooLarge, tooLarge(max))
		return nil, nil, false
	}
	n := r.ContentLength
	if n < 0 {
		n = max // not announced: room for the largest
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.opts.BufferWait)
	err := p.buf.acquire(ctx, n)
	cancel()
	if err != nil {
		p.opts.Metrics.request("busy")
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, CodeBusy, "the task proxy holds as many update bytes as it may (Options.MaxBufferedBytes); retry the update")
		return nil, nil, false
	}
	release = func() { p.buf.release(n) }
	if r.ContentLength >= 0 {
		// The server reads no more than Content-Length: one
		// allocation of its size.
		body = make([]byte, n)
		_, err = io.ReadFull(r.Body, body)
	} else {
		body, err = io.ReadAll(io.LimitReader(r.Body, n+1))
	}
	var ne net.Error
	switch {
	case int64(len(body)) > n:
		release()
		p.opts.Metrics.request("too_large")
		writeError(w, http.StatusRequestEntityTooLarge, CodeUpdateTooLarge, tooLarge(max))
		return nil, nil, false
	case errors.As(err, &ne) && ne.Timeout():
		release()
		writeError(w, http.StatusRequestTimeout, CodeRequestTimeout, "the request's body did not arrive within the task proxy's read timeout ("+p.opts.ReadTimeout.String()+")")
		return nil, nil, false
	case err != nil:
		release()
		writeError(w, http.StatusBadRequest, CodeBadRequest, "the request's body could not be read: "+err.Error())
		return nil, nil, false
	}
	return body, release, true
}

func tooLarge(max int64) string {
	return "the request's body exceeds the task proxy's " + strconv.FormatInt(max, 10) + " bytes (Conductor fails a task output over its maxTaskOutputPayloadSizeThreshold, 10 MB by default)"
}

// tooManyConnections is the whole answer to a connection beyond
// Options.MaxConnections, written before it is closed.
var tooManyConnections = func() []byte {
	body, _ := json.Marshal(map[string]any{"status": http.StatusServiceUnavailable, "code": CodeTooManyConnections, "retryable": true,
		"message": "the task proxy holds its most open connections (--max-connections); close idle connections or try again later"})
	return []byte(fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s", len(body), body))
}()
