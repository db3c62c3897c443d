// Package proxy is the task proxy: Conductor's REST API on a listener of
// its own, for workers written with Conductor's SDKs. It forwards the
// calls workers make (routes.go; the rest is refused unless
// Options.ForwardAll) to Conductor unchanged, within the limits of
// limits.go, except task polls and task updates: a polled
// task of an external step (plan.ExecutorExternal) reaches the worker only
// through the gate (taskworkers.Worker.Admit: the run is not paused,
// draining or cancelled, and StepStarted is in the log), and the worker's
// update of one is recorded (StepCompleted / StepFailed) before it is
// forwarded. Tasks of any other workflow pass through untouched. The
// worker's own headers are forwarded; the proxy can require a token of
// its own (Options.Tokens). docs/workers.md, "Bring your own workers",
// lists the endpoints and the SDKs that use them.
package proxy

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	pathpkg "path"
	"strings"
	"sync"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/connlimit"
	"github.com/conductor-sidecar/sidecar/fair"
	"github.com/conductor-sidecar/sidecar/ratelog"
	"github.com/conductor-sidecar/sidecar/taskworkers"
)

// Steps is what the proxy asks of the task workers for external steps
// and for the worker tasks of adopted workflows (taskworkers.Worker).
type Steps interface {
	// External tells the tasks the proxy gates (an external plan step's,
	// or a worker task of an adopted workflow) from those it passes
	// through untouched.
	External(t *model.Task) (*taskworkers.Assignment, bool)
	// MayAdopt reports whether External may take a task whose input
	// holds no plan step, of a workflow of that definition name (a
	// worker task of an adopted workflow). When it is false, the proxy
	// passes such a task through having scanned only its taskId,
	// workflowType and input's keys, without decoding it.
	MayAdopt(workflowType string) bool
	// Admit gates a polled task of an external step (a: External's
	// assignment of t, decoded once per task); false: the task was
	// answered to Conductor and must not reach the worker.
	Admit(t *model.Task, a *taskworkers.Assignment) bool
	// Record records the worker's update of t (a: as for Admit) before it
	// is forwarded; forward false: Record answered Conductor itself. An
	// error: nothing recorded, nothing may be forwarded.
	Record(t *model.Task, a *taskworkers.Assignment, r *model.TaskResult) (forward bool, err error)
	// Reported is called once Conductor took a forwarded update.
	Reported(t *model.Task, a *taskworkers.Assignment, r *model.TaskResult)
	// Unreported is called when a forwarded update (of size bytes) did
	// not reach Conductor: no answer, or a 5xx.
	Unreported(t *model.Task, a *taskworkers.Assignment, r *model.TaskResult, size int)
	// Undelivered hands back t, an external step's task from the answer
	// of a poll whose worker hung up before it came: no worker has it,
	// and Conductor offers it again at once rather than at its response
	// timeout. It must not block.
	Undelivered(t *model.Task)
}

// Options configures a Proxy.
type Options struct {
	// Conductor is Conductor's API base URL (as --conductor-url:
	// http://host:8080/api). A request for /api/X is forwarded to
	// Conductor + /X.
	Conductor string
	// Tokens, when not empty, are the tokens a worker must present: in
	// the header X-Sidecar-Proxy-Token, or as the first path segment
	// (http://proxy:8788/TOKEN/api), so that a worker whose SDK sets no
	// custom header changes only its server URL. The header is not
	// forwarded.
	Tokens []string
	// ForwardAll forwards every request the proxy does not intercept, as
	// Conductor's whole API: a worker that may reach the proxy may then
	// pause, resume, terminate and read every workflow, any tenant's.
	// Off: only the calls workers make are forwarded (routes.go), the
	// rest answered 403 CodeRouteNotForwarded.
	ForwardAll bool
	// MaxUpdateBytes bounds a request's body (default
	// DefaultMaxUpdateBytes; 413 CodeUpdateTooLarge beyond).
	// MaxBufferedBytes bounds the update bodies held at once, across
	// requests (default DefaultMaxBufferedBytes, at least
	// MaxUpdateBytes); an update waits BufferWait (default
	// DefaultBufferWait) for room, then is answered 503 CodeBusy.
	MaxUpdateBytes, MaxBufferedBytes int64
	BufferWait                       time.Duration
	// MaxTaskOutputBytes is Conductor's maxTaskOutputPayloadSizeThreshold
	// (default DefaultMaxTaskOutputBytes, Conductor's default): a final
	// report of a run's task with a larger output is recorded as
	// Conductor ends it, failed for good, and forwarded as sent.
	MaxTaskOutputBytes int64
	// Timeouts of the listener (defaults as the control API's:
	// DefaultReadHeaderTimeout, DefaultReadTimeout, DefaultWriteTimeout,
	// DefaultIdleTimeout). A request whose body has not arrived within
	// ReadTimeout is cut off.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// StallTimeout cuts a forwarded call's answer whose worker stopped
	// reading it for that long (default DefaultStallTimeout).
	StallTimeout time.Duration
	// MaxConnections bounds the connections the listener keeps open (0:
	// no bound); a connection beyond is answered 503
	// CodeTooManyConnections and closed (package connlimit). serve gives
	// it the API's bound (--max-connections).
	MaxConnections int
	// MaxUpstreamConnections bounds the connections to Conductor the
	// default Transport has open at once (0:
	// DefaultMaxUpstreamConnections); a forwarded request waits for one.
	MaxUpstreamConnections int
	// Transport carries the forwarded requests (default: a keep-alive
	// transport of at most MaxUpstreamConnections connections).
	Transport http.RoundTripper
	Logger    *zap.Logger
	// Metrics may be nil.
	Metrics *Metrics
}

// TokenHeader is the header a worker presents the proxy's token in.
const TokenHeader = "X-Sidecar-Proxy-Token"

// Proxy is the task proxy. New builds it; Open serves it on a listener;
// Close stops it.
type Proxy struct {
	base   *url.URL
	steps  Steps
	opts   Options
	log    *zap.Logger
	client *http.Client
	rp     *httputil.ReverseProxy
	srv    *http.Server
	done   chan struct{}
	seen   seenTasks
	buf    *buffers
	// pollSlots and updateSlots are the polls and the updates the proxy
	// has at Conductor at once, together Options.MaxUpstreamConnections
	// (an update, short and the end of a worker's work, never queues
	// behind a flood of long polls): forward holds one until Conductor
	// answered.
	pollSlots, updateSlots *upstreamSlots
	refuse                 refusals
	// away bounds the lines of forwarded calls Conductor did not answer.
	away ratelog.Limiter
}

// New returns a Proxy in front of Options.Conductor for steps.
func New(steps Steps, opts Options) (*Proxy, error) {
	base, err := url.Parse(strings.TrimRight(opts.Conductor, "/"))
	if err != nil || base.Scheme == "" || base.Host == "" {
		return nil, errors.New("proxy: Options.Conductor must be an absolute http(s) URL")
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if err := setLimitDefaults(&opts); err != nil {
		return nil, err
	}
	if opts.Transport == nil {
		opts.Transport = &http.Transport{
			Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxConnsPerHost: opts.MaxUpstreamConnections, MaxIdleConns: opts.MaxUpstreamConnections,
			MaxIdleConnsPerHost: opts.MaxUpstreamConnections, IdleConnTimeout: 90 * time.Second,
		}
	}
	p := &Proxy{base: base, steps: steps, opts: opts, log: opts.Logger.Named("proxy"),
		client: &http.Client{Transport: opts.Transport}, done: make(chan struct{}), buf: newBuffers(opts.MaxBufferedBytes, opts.Metrics),
		pollSlots:   newUpstreamSlots("poll", opts.MaxUpstreamConnections-updateSlots(opts.MaxUpstreamConnections), opts.Metrics),
		updateSlots: newUpstreamSlots("update", updateSlots(opts.MaxUpstreamConnections), opts.Metrics)}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL = p.target(r.In.URL)
			r.Out.Host = base.Host
			r.Out.Header.Del(TokenHeader)
		},
		Transport: opts.Transport,
		ModifyResponse: func(*http.Response) error {
			p.away.Recovered(p.log, "Conductor answers forwarded requests again")
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if tooBig := (*http.MaxBytesError)(nil); errors.As(err, &tooBig) {
				writeError(w, http.StatusRequestEntityTooLarge, CodeUpdateTooLarge, tooLarge(opts.MaxUpdateBytes))
				return
			}
			p.away.Warn(p.log, "Conductor did not answer a forwarded request", zap.String("path", r.URL.Path), zap.Error(err))
			writeError(w, http.StatusBadGateway, CodeConductorUnavailable, err.Error())
		},
	}
	return p, nil
}

// Open serves the proxy on ln until Close.
func (p *Proxy) Open(ln net.Listener) {
	if p.opts.MaxConnections > 0 {
		ln = connlimit.New(ln, connlimit.Options{Max: p.opts.MaxConnections, Refusal: tooManyConnections, OnRefuse: p.opts.Metrics.connRefused})
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: p.opts.ReadHeaderTimeout, ReadTimeout: p.opts.ReadTimeout,
		WriteTimeout: p.opts.WriteTimeout, IdleTimeout: p.opts.IdleTimeout, MaxHeaderBytes: MaxHeaderBytes,
		ErrorLog: ratelog.NewStdLog(p.log.Named("http"))}
	go func() {
		defer close(p.done)
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("task proxy stopped serving", zap.Error(err))
		}
	}()
	p.log.Info("task proxy serving", zap.String("listen", ln.Addr().String()), zap.String("conductor", p.base.String()))
}

// Close stops accepting requests and waits for those in progress until
// ctx is done.
func (p *Proxy) Close(ctx context.Context) error {
	if p.srv == nil {
		return nil
	}
	err := p.srv.Shutdown(ctx)
	<-p.done
	return err
}

// target is Conductor's URL for a request URL of the proxy: its path
// without the leading /api (the base URL has its own) and without a
// token segment. /health is Conductor's, beside its /api.
func (p *Proxy) target(in *url.URL) *url.URL {
	out := *p.base
	out.Path = p.base.Path + strings.TrimPrefix(in.Path, "/api")
	if out.Path == p.base.Path+"/health" {
		out.Path = strings.TrimSuffix(p.base.Path, "/api") + "/health"
	}
	out.RawPath = ""
	out.RawQuery = in.RawQuery
	return &out
}

// ServeHTTP authenticates the request, before anything of its body is
// read, and routes it (routeOf): task polls and updates are intercepted,
// the workers' other calls forwarded, the rest refused.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.authorize(r) {
		p.opts.Metrics.request("unauthorized")
		writeError(w, http.StatusUnauthorized, CodeUnauthorized, "the task proxy requires its token (header "+TokenHeader+" or the URL's first path segment)")
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/api")
	switch routeOf(r.Method, r.URL.Path, p.opts.ForwardAll) {
	case routeBatchPoll:
		p.opts.Metrics.request("batch_poll")
		p.poll(w, r, true)
	case routePoll:
		p.opts.Metrics.request("poll")
		p.poll(w, r, false)
	case routeUpdate:
		p.opts.Metrics.request("update")
		p.update(w, r, false)
	case routeUpdateV2:
		p.opts.Metrics.request("update_v2")
		p.update(w, r, true)
	case routeUpdateByRef:
		p.opts.Metrics.request("update_by_ref")
		p.updateByRef(w, r, path)
	case routeForward:
		if r.ContentLength > p.opts.MaxUpdateBytes {
			p.opts.Metrics.request("too_large")
			writeError(w, http.StatusRequestEntityTooLarge, CodeUpdateTooLarge, tooLarge(p.opts.MaxUpdateBytes))
			return
		}
		// The limit also keeps the body's EOF: once the answer begins,
		// the server closes the body, and the transport's read past its
		// Content-Length must still see EOF, not an error that drops the
		// connection with the answer half copied.
		r.Body = http.MaxBytesReader(w, r.Body, p.opts.MaxUpdateBytes)
		p.opts.Metrics.request("forward")
		// The workers' other calls share the polls' places: their answers
		// are copied to the worker as they come, so one whose worker does
		// not read holds its connection to Conductor (until StallTimeout),
		// and must not take the updates' quarter.
		if err := p.pollSlots.acquire(r.Context(), ""); err != nil {
			return // the worker hung up while it waited
		}
		defer p.pollSlots.release()
		p.rp.ServeHTTP(&stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), stall: p.opts.StallTimeout}, r)
	default:
		p.opts.Metrics.request("refused")
		p.refuse.log(p.log, r.Method, r.URL.Path)
		writeError(w, http.StatusForbidden, CodeRouteNotForwarded, "the task proxy forwards only the calls workers make ("+r.Method+" "+r.URL.Path+
			" is not one): call Conductor directly, or start serve with --conductor-proxy-forward-all")
	}
}

// authorize checks the proxy's token and strips a token path segment.
func (p *Proxy) authorize(r *http.Request) bool {
	if len(p.opts.Tokens) == 0 {
		return true
	}
	rest := strings.TrimPrefix(r.URL.Path, "/")
	seg, after, _ := strings.Cut(rest, "/")
	inPath := seg != "" && p.known(seg)
	if h := r.Header.Get(TokenHeader); h != "" && !p.known(h) {
		return false
	} else if h == "" && !inPath {
		return false
	}
	if inPath {
		// The token as the path's first segment (a worker whose server
		// URL carries it), with or without the header: never forwarded,
		// nor logged.
		r.URL.Path = "/" + after
		r.URL.RawPath = ""
	}
	return true
}

func (p *Proxy) known(tok string) bool {
	ok := 0
	for _, t := range p.opts.Tokens {
		ok |= subtle.ConstantTimeCompare([]byte(t), []byte(tok))
	}
	return ok == 1
}

// forward sends r (with body) to Conductor with the worker's headers, once
// it has one of slots (waiting in queue), and returns the answer, its body
// read into buf (the bytes are buf's). It is
// one round trip of the transport: a redirect is the worker's to follow,
// as for every other call the proxy forwards.
//
// It holds one of the proxy's slots until Conductor answered, even when
// the worker hangs up first: Conductor works on an abandoned poll until
// its timeout, and a slot freed at the hang-up would let a flood of
// abandoned polls take every request thread of Conductor's, which serve's
// own calls need. A request still waiting for a slot when its worker
// hangs up is never sent.
func (p *Proxy) forward(r *http.Request, body []byte, buf *bytes.Buffer, slots *upstreamSlots, queue string) (*http.Response, []byte, error) {
	if err := slots.acquire(r.Context(), queue); err != nil {
		return nil, nil, err
	}
	defer slots.release()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), p.opts.WriteTimeout)
	defer cancel()
	out := (&http.Request{Method: r.Method, URL: p.target(r.URL), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: make(http.Header, len(r.Header)), Host: p.base.Host}).WithContext(ctx)
	if len(body) > 0 {
		out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	copyHeaders(out.Header, r.Header)
	resp, err := p.opts.Transport.RoundTrip(out)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	_, err = buf.ReadFrom(resp.Body)
	return resp, buf.Bytes(), err
}

// stallWriter is a worker's answer written with a deadline for each write:
// a worker that stops reading it is cut StallTimeout after its last read
// progress, not at the listener's WriteTimeout, so that what its answer
// holds (a connection to Conductor, one of the proxy's places) comes back.
type stallWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
}

func (s *stallWriter) Write(b []byte) (int, error) {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.stall))
	return s.ResponseWriter.Write(b)
}

// Flush and Unwrap let the reverse proxy flush through it.
func (s *stallWriter) Flush() { _ = s.rc.Flush() }

func (s *stallWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// updateSlots is the share of n upstream slots kept for updates: a
// quarter, at least one.
func updateSlots(n int) int {
	return max(1, n/4)
}

// upstreamSlots are the requests of one kind the proxy may have at
// Conductor at once, counted in the metrics. Requests wait for a slot in
// queues (a poll's is its task type) that take turns: the workers of one
// task type polling in their hundreds make another type's poll wait for
// one slot, not behind all of theirs.
type upstreamSlots struct {
	sem     *fair.Semaphore
	kind    string
	metrics *Metrics
}

func newUpstreamSlots(kind string, n int, m *Metrics) *upstreamSlots {
	m.bound(kind, n)
	return &upstreamSlots{sem: fair.NewSemaphore(n), kind: kind, metrics: m}
}

// acquire takes a slot for a request of queue, waiting for one while ctx
// lasts.
func (s *upstreamSlots) acquire(ctx context.Context, queue string) error {
	if !s.sem.TryAcquire() {
		s.metrics.upstreamWait(s.kind, 1)
		err := s.sem.Acquire(ctx, queue)
		s.metrics.upstreamWait(s.kind, -1)
		if err != nil {
			return err
		}
	}
	s.metrics.upstreamHeld(s.kind, 1)
	return nil
}

// release gives back a slot acquire took.
func (s *upstreamSlots) release() {
	s.metrics.upstreamHeld(s.kind, -1)
	s.sem.Release()
}

// answers are the buffers Conductor's answers to polls and updates are
// read into, each back once the worker has the answer: nothing the proxy
// keeps refers to one (what it keeps of a task is decoded or copied).
var answers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// answerBuffer returns an empty buffer of answers and the func that
// gives it back.
func answerBuffer() (*bytes.Buffer, func()) {
	buf := answers.Get().(*bytes.Buffer)
	buf.Reset()
	return buf, func() {
		if buf.Cap() <= maxPooledAnswer {
			answers.Put(buf)
		}
	}
}

// maxPooledAnswer: a buffer that grew larger (a batch of large tasks) is
// left to the garbage collector rather than kept.
const maxPooledAnswer = 1 << 20

// hopHeaders are not copied to the calls the proxy reads the answers of
// (polls, updates, its own reads of a task): the hop-by-hop headers (RFC
// 9110 §7.6.1), the proxy's token, and the worker's Accept-Encoding. The
// proxy's transport negotiates the encoding itself and hands the proxy
// Conductor's answer decoded: a gzipped answer would be a task the proxy
// cannot read, and one it cannot read passes through. The worker gets the
// answer uncompressed.
var hopHeaders = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true, TokenHeader: true,
	"Accept-Encoding": true}

// copyHeaders copies src's end-to-end headers to dst. The values are
// shared, not copied: neither side is changed afterwards.
func copyHeaders(dst, src http.Header) {
	for k, vs := range src {
		if !hopHeaders[http.CanonicalHeaderKey(k)] {
			dst[k] = vs
		}
	}
}

// reply writes Conductor's answer (status, headers) with body.
func reply(w http.ResponseWriter, resp *http.Response, body []byte) {
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "code": code, "message": msg, "retryable": status >= 500})
}

// gate decides for the tasks of Conductor's answer (raw JSON each): pass[i]
// is true when task i goes to the worker unchanged (a task of no external
// step, or one Admit let through). The external steps' tasks are admitted
// concurrently, at most maxAdmits at a time: a batch is answered after one
// round of parallel appends, not one append after another. (Admit
// serializes the starts of one run itself, each on the runSeq the one
// before it left.) Every Admit has returned when gate returns.
func (p *Proxy) gate(raws ...[]byte) (pass []bool) {
	pass = make([]bool, len(raws))
	var external []int
	var tasks []*model.Task
	var as []*taskworkers.Assignment
	for i, raw := range raws {
		if s, ok := scanTask(raw); ok && s.taskID != "" && !s.stepInput && !p.steps.MayAdopt(s.workflowType) {
			p.seen.note(s.taskID, nil, nil)
			pass[i] = true
			continue
		}
		var pt adapter.PolledTask
		if err := json.Unmarshal(raw, &pt); err != nil || pt.TaskID == "" {
			pass[i] = true // not a task we can read: Conductor's answer as is
			continue
		}
		t := pt.Task()
		a, ours := p.steps.External(t)
		if !ours {
			p.seen.note(t.TaskId, nil, nil)
			pass[i] = true
			continue
		}
		if tasks == nil {
			tasks, as = make([]*model.Task, len(raws)), make([]*taskworkers.Assignment, len(raws))
		}
		tasks[i], as[i] = t, a
		external = append(external, i)
	}
	if len(external) == 0 {
		return pass
	}
	defer p.opts.Metrics.gated("poll", time.Now())
	admit := func(i int) {
		t := tasks[i]
		if !p.steps.Admit(t, as[i]) {
			p.opts.Metrics.task("held_back")
			return
		}
		p.opts.Metrics.task("admitted")
		p.seen.note(t.TaskId, t, as[i])
		pass[i] = true
	}
	if len(external) == 1 {
		admit(external[0])
		return pass
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxAdmits)
	for _, i := range external {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			admit(i)
		}()
	}
	wg.Wait()
	return pass
}

// handBackUndelivered hands back the external steps' tasks of a poll
// answer (body) its worker never received (Steps.Undelivered); the other
// tasks are left to Conductor's response timeout, as for a worker that
// polled Conductor and died.
func (p *Proxy) handBackUndelivered(body []byte, batch bool) {
	raws := []json.RawMessage{body}
	if batch {
		if err := json.Unmarshal(body, &raws); err != nil {
			return
		}
	}
	for _, raw := range raws {
		var pt adapter.PolledTask
		if err := json.Unmarshal(raw, &pt); err != nil || pt.TaskID == "" {
			continue
		}
		if t := pt.Task(); p.steps.MayAdopt(t.WorkflowType) || t.InputData[plan.InputStep] != nil {
			if _, ours := p.steps.External(t); ours {
				p.steps.Undelivered(t)
			}
		}
	}
}

// maxAdmits bounds the tasks of one poll's answer admitted at once.
const maxAdmits = 32

// poll forwards a poll and gates the tasks of its answer; a task the gate
// holds back is left out (a single poll then answers 204, as Conductor
// does when no task is queued).
func (p *Proxy) poll(w http.ResponseWriter, r *http.Request, batch bool) {
	if tt := pathpkg.Base(r.URL.Path); reservedType(tt) {
		p.reserved(w, "task type "+tt+" is executed by the sidecar's own workers; an outside worker may not poll it")
		return
	}
	buf, release := answerBuffer()
	defer release()
	resp, body, err := p.forward(r, nil, buf, p.pollSlots, "type "+pathpkg.Base(r.URL.Path))
	if err != nil {
		writeError(w, http.StatusBadGateway, CodeConductorUnavailable, err.Error())
		return
	}
	if r.Context().Err() != nil {
		// The worker hung up: nothing is gated for a worker that will
		// never have the tasks, and those of external steps are handed
		// back (Conductor shows them in progress; a run adopted meanwhile
		// would take one for a try in flight that nobody runs).
		if resp.StatusCode == http.StatusOK {
			p.handBackUndelivered(body, batch)
		}
		return
	}
	if resp.StatusCode != http.StatusOK || len(bytes.TrimSpace(body)) == 0 {
		reply(w, resp, body)
		return
	}
	if !batch {
		if p.gate(body)[0] {
			reply(w, resp, body)
			return
		}
		copyHeaders(w.Header(), resp.Header)
		w.Header().Del("Content-Type")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	var tasks []json.RawMessage
	if err := json.Unmarshal(body, &tasks); err != nil {
		reply(w, resp, body)
		return
	}
	raws := make([][]byte, len(tasks))
	for i, raw := range tasks {
		raws[i] = raw
	}
	pass := p.gate(raws...)
	kept := tasks[:0]
	for i, raw := range tasks {
		if pass[i] {
			kept = append(kept, raw)
		}
	}
	if len(kept) == len(tasks) {
		reply(w, resp, body)
		return
	}
	out, _ := json.Marshal(kept)
	reply(w, resp, out)
}

// update records an update of an external step's task, then forwards it;
// update-v2's answer (the worker's next task) passes the gate too.
func (p *Proxy) update(w http.ResponseWriter, r *http.Request, v2 bool) {
	if !p.jsonBody(w, r) {
		return
	}
	body, release, ok := p.readBody(w, r)
	if !ok {
		return
	}
	defer release()
	if s, ok := scanTask(body); ok && p.seen.passed(s.taskID) && knownStatus(model.TaskResultStatus(s.status)) {
		// A task a poll passed through: forwarded without decoding it
		// (and forgotten once Conductor took its final update).
		p.relay(w, r, body, v2, nil, nil, &model.TaskResult{TaskId: s.taskID, Status: model.TaskResultStatus(s.status)})
		return
	}
	var res model.TaskResult
	if err := json.Unmarshal(body, &res); err != nil {
		if !isObject(body) {
			p.badUpdate(w, "the body is not a JSON object: "+err.Error())
			return
		}
		// A field of another type than the proxy reads, which Conductor
		// may still take (Jackson reads a status's ordinal, a number in
		// a string). The task of a run of the log cannot be recorded
		// from it, so it is not forwarded either; any other task's is
		// Conductor's to answer.
		var id struct {
			TaskID string `json:"taskId"`
		}
		_ = json.Unmarshal(body, &id)
		t, _, terr := p.task(r, id.TaskID)
		switch {
		case errors.Is(terr, errReserved):
			p.reserved(w, "task "+id.TaskID+" is a step the sidecar's own workers execute; an outside worker may not report it")
		case terr != nil:
			writeError(w, http.StatusBadGateway, CodeConductorUnavailable, terr.Error())
		case t != nil:
			p.badUpdate(w, "a field is not of its type (status is one of the names, numbers are numbers), so its outcome cannot be recorded: "+err.Error())
		default:
			p.relay(w, r, body, v2, nil, nil, nil)
		}
		return
	}
	if !knownStatus(res.Status) {
		p.badUpdate(w, fmt.Sprintf("status %q is none of IN_PROGRESS, COMPLETED, FAILED, FAILED_WITH_TERMINAL_ERROR", res.Status))
		return
	}
	if res.TaskId == "" || res.WorkflowInstanceId == "" {
		p.badUpdate(w, "taskId and workflowInstanceId are required")
		return
	}
	t, a, err := p.task(r, res.TaskId)
	if errors.Is(err, errReserved) {
		p.reserved(w, "task "+res.TaskId+" is a step the sidecar's own workers execute; an outside worker may not report it")
		return
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, CodeConductorUnavailable, err.Error())
		return
	}
	if t == nil {
		p.relay(w, r, body, v2, nil, nil, &res)
		return
	}
	if res.WorkflowInstanceId != t.WorkflowInstanceId {
		// Conductor answers it 200 and changes nothing: recorded, it would
		// split the log from Conductor (and stand for the real update).
		p.opts.Metrics.task("update_refused")
		writeError(w, http.StatusBadRequest, CodeWorkflowMismatch, fmt.Sprintf("the update names workflow %q, but task %s is of workflow %s: nothing was recorded or forwarded",
			res.WorkflowInstanceId, t.TaskId, t.WorkflowInstanceId))
		return
	}
	if d := nesting(body); d > MaxNesting {
		p.badUpdate(w, fmt.Sprintf("the body nests %d deep, and Conductor refuses JSON nested deeper than %d", d, MaxNesting))
		return
	}
	if n, over := outputTooLarge(body, &res, p.opts.MaxTaskOutputBytes); over {
		// Conductor takes the update and fails the task for good: the
		// log records that outcome, not the worker's COMPLETED.
		p.log.Warn("an update's output is over Conductor's limit: recorded as the failure Conductor makes of it",
			zap.String("taskId", t.TaskId), zap.Int("outputBytes", n), zap.Int64("maxTaskOutputBytes", p.opts.MaxTaskOutputBytes))
		res = *tooLargeResult(&res, t, n, p.opts.MaxTaskOutputBytes)
	}
	began := time.Now()
	forward, err := p.steps.Record(t, a, &res)
	p.opts.Metrics.gated("update", began)
	if err != nil {
		p.notRecorded(w, err)
		return
	}
	if !forward {
		// Answered to Conductor by Record: the worker hears what
		// Conductor says to a taken update.
		p.opts.Metrics.task("update_answered")
		p.seen.forget(res.TaskId)
		if v2 {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, res.TaskId)
		return
	}
	p.relay(w, r, body, v2, t, a, &res)
}

// reservedType reports whether taskType is one the sidecar's own workers
// execute (plan.TaskTypes): its tasks' starts and outcomes are theirs to
// record, and an external step may not take such a type (plan validation
// refuses it), so no outside worker has a task of it to poll or report.
func reservedType(taskType string) bool {
	return plan.ExecutorTypeOf(taskType) != ""
}

// errReserved is task's answer for a task of a reservedType.
var errReserved = errors.New("the task is a step the sidecar's own workers execute")

// reserved answers a poll or an update that reservedType refuses (403
// PROXY_TASK_RESERVED): nothing is forwarded.
func (p *Proxy) reserved(w http.ResponseWriter, why string) {
	p.opts.Metrics.task("reserved")
	writeError(w, http.StatusForbidden, CodeTaskReserved, why+": nothing was forwarded")
}

// badUpdate answers an update whose body is not a task result (400
// PROXY_BAD_UPDATE): nothing is recorded or forwarded.
func (p *Proxy) badUpdate(w http.ResponseWriter, why string) {
	p.opts.Metrics.task("update_refused")
	writeError(w, http.StatusBadRequest, CodeBadUpdate, "not a task result, nothing was recorded or forwarded: "+why)
}

// jsonBody reports whether r's body is JSON by its Content-Type
// (application/json or application/*+json, with any parameters), the only
// bodies Conductor takes for a task update; otherwise it answers 415
// PROXY_UNSUPPORTED_MEDIA_TYPE (Conductor answers 500 and changes
// nothing, which an SDK retries).
func (p *Proxy) jsonBody(w http.ResponseWriter, r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		return true
	}
	p.opts.Metrics.task("update_refused")
	writeError(w, http.StatusUnsupportedMediaType, CodeUnsupportedMediaType,
		fmt.Sprintf("a task update's body must be JSON (Content-Type: application/json), not %q: nothing was recorded or forwarded", ct))
	return false
}

// isObject reports whether b is one well-formed JSON object.
func isObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}

// knownStatus reports whether s is a status a task result may carry
// (Conductor's TaskResult.Status).
func knownStatus(s model.TaskResultStatus) bool {
	switch s {
	case model.InProgressTask, model.CompletedTask, model.FailedTask, model.FailedWithTerminalErrorTask:
		return true
	}
	return false
}

// notRecorded answers an update whose outcome Record did not take: a task
// the gate never handed out whose run may not start it (409, not to be
// retried), or an outcome that could not be recorded (503, retry).
func (p *Proxy) notRecorded(w http.ResponseWriter, err error) {
	if errors.Is(err, taskworkers.ErrNotAdmitted) {
		p.opts.Metrics.task("update_not_admitted")
		writeError(w, http.StatusConflict, CodeTaskNotAdmitted, "the task was not handed out through the proxy (polled from Conductor directly?) and its run is paused, being cancelled or ended: the update was not taken, and Conductor gets the task back")
		return
	}
	if errors.Is(err, taskworkers.ErrTryTimedOut) {
		p.opts.Metrics.task("update_try_timed_out")
		writeError(w, http.StatusConflict, CodeTryTimedOut, "the task's response timeout passed before this report (its run was paused, or the worker was slow): Conductor times the task out, as it would have without a pause, and takes no report of it; the update was not taken")
		return
	}
	p.opts.Metrics.task("update_not_recorded")
	if errors.Is(err, adapter.ErrEngineUnavailable) {
		// Conductor could not say whether the try is still open (a
		// report after a restart, or through another replica, is read
		// back first): Conductor is away, not the sidecar's store.
		writeError(w, http.StatusBadGateway, CodeConductorUnavailable, "the update was not taken, Conductor did not answer; retry the update: "+err.Error())
		return
	}
	writeError(w, http.StatusServiceUnavailable, CodeStoreUnavailable, "the step's outcome could not be recorded; retry the update: "+err.Error())
}

// relay forwards an update and answers the worker as Conductor answered;
// t (of an external step, a its assignment) is reported once Conductor
// took res.
func (p *Proxy) relay(w http.ResponseWriter, r *http.Request, body []byte, v2 bool, t *model.Task, a *taskworkers.Assignment, res *model.TaskResult) {
	buf, release := answerBuffer()
	defer release()
	resp, out, err := p.forward(r, body, buf, p.updateSlots, "")
	if (err != nil || resp.StatusCode/100 == 5) && t != nil && res != nil {
		p.steps.Unreported(t, a, res, len(body))
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, CodeConductorUnavailable, err.Error())
		return
	}
	if resp.StatusCode/100 == 2 && res != nil {
		if res.Status != model.InProgressTask {
			p.seen.forget(res.TaskId)
		}
		if t != nil {
			p.steps.Reported(t, a, res)
		}
	}
	if v2 && resp.StatusCode == http.StatusOK && len(bytes.TrimSpace(out)) > 0 && !p.gate(out)[0] {
		copyHeaders(w.Header(), resp.Header)
		w.Header().Del("Content-Type")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	reply(w, resp, out)
}

// task returns the task an update is about, with its assignment, when it
// is an external step's (nil: any other task), from the polls this proxy
// answered or else from Conductor (a poll through another replica, or
// before a restart).
func (p *Proxy) task(r *http.Request, taskID string) (*model.Task, *taskworkers.Assignment, error) {
	if taskID == "" {
		return nil, nil, nil
	}
	if t, a, known := p.seen.get(taskID); known {
		return t, a, nil
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, p.base.String()+"/tasks/"+url.PathEscape(taskID), nil)
	if err != nil {
		return nil, nil, err
	}
	copyHeaders(req.Header, r.Header)
	req.Header.Set("Accept", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK || len(bytes.TrimSpace(b)) == 0 {
		return nil, nil, nil // unknown to Conductor: its answer to the update says so
	}
	var pt adapter.PolledTask
	if err := json.Unmarshal(b, &pt); err != nil {
		return nil, nil, nil
	}
	t := pt.Task()
	if reservedType(t.TaskDefName) || reservedType(t.TaskType) {
		return nil, nil, errReserved
	}
	a, ours := p.steps.External(t)
	if !ours {
		return nil, nil, nil
	}
	return t, a, nil
}

// isUpdateByRef reports whether path is POST /tasks/{workflowId}/{ref}/{status}
// (optionally /sync): an update by reference name.
func isUpdateByRef(path string) bool {
	parts := strings.Split(strings.TrimPrefix(path, "/tasks/"), "/")
	if !strings.HasPrefix(path, "/tasks/") || len(parts) < 3 || len(parts) > 4 {
		return false
	}
	if len(parts) == 4 && parts[3] != "sync" {
		return false
	}
	switch parts[2] {
	case "COMPLETED", "FAILED", "FAILED_WITH_TERMINAL_ERROR", "IN_PROGRESS":
		return true
	}
	return false
}

// updateByRef records an update by reference name of an external step's
// task (the workflow's task of that reference, in progress) and forwards
// it; the body is the task's output.
func (p *Proxy) updateByRef(w http.ResponseWriter, r *http.Request, path string) {
	if !p.jsonBody(w, r) {
		return
	}
	body, release, ok := p.readBody(w, r)
	if !ok {
		return
	}
	defer release()
	if !isObject(body) {
		p.badUpdate(w, "the body of an update by reference name is the task's output, a JSON object (Conductor requires one)")
		return
	}
	parts := strings.Split(strings.TrimPrefix(path, "/tasks/"), "/")
	t, a, err := p.taskByRef(r, parts[0], parts[1])
	if errors.Is(err, errReserved) {
		p.reserved(w, "task "+parts[1]+" of workflow "+parts[0]+" is a step the sidecar's own workers execute; an outside worker may not report it")
		return
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, CodeConductorUnavailable, err.Error())
		return
	}
	if t == nil {
		p.relay(w, r, body, false, nil, nil, nil)
		return
	}
	res := &model.TaskResult{TaskId: t.TaskId, WorkflowInstanceId: t.WorkflowInstanceId, Status: model.TaskResultStatus(parts[2])}
	_ = json.Unmarshal(body, &res.OutputData)
	began := time.Now()
	forward, err := p.steps.Record(t, a, res)
	p.opts.Metrics.gated("update", began)
	switch {
	case err != nil:
		p.notRecorded(w, err)
	case !forward:
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, t.TaskId)
	default:
		p.relay(w, r, body, false, t, a, res)
	}
}

// taskByRef returns the in-progress task of reference ref in workflowID
// when it is an external step's (nil: any other).
func (p *Proxy) taskByRef(r *http.Request, workflowID, ref string) (*model.Task, *taskworkers.Assignment, error) {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, p.base.String()+"/workflow/"+url.PathEscape(workflowID)+"?includeTasks=true", nil)
	if err != nil {
		return nil, nil, err
	}
	copyHeaders(req.Header, r.Header)
	req.Header.Set("Accept", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, nil
	}
	var wf struct {
		Tasks []adapter.PolledTask `json:"tasks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&wf); err != nil {
		return nil, nil, nil
	}
	for i := len(wf.Tasks) - 1; i >= 0; i-- {
		pt := &wf.Tasks[i]
		if pt.ReferenceTaskName != ref {
			continue
		}
		t := pt.Task()
		if reservedType(t.TaskDefName) || reservedType(t.TaskType) {
			return nil, nil, errReserved
		}
		a, ours := p.steps.External(t)
		if !ours || (pt.Status != "IN_PROGRESS" && pt.Status != "SCHEDULED") {
			return nil, nil, nil
		}
		return t, a, nil
	}
	return nil, nil, nil
}

// seenTasks remembers the tasks polls handed out until their final
// update: an external step's task and its assignment (for Record, so that
// its input is decoded once per task), or nil for any other (so that its
// update costs no read from Conductor). A task whose final update never
// came through this proxy stays: entries older than seenMaxAge are
// dropped when the map has grown past seenSweepAt, at most once every
// seenSweepEvery (a sweep reads every entry).
type seenTasks struct {
	mu     sync.Mutex
	m      map[string]seenTask
	swept  time.Time
	nowFor func() time.Time // time.Now unless a test sets it
}

type seenTask struct {
	t  *model.Task
	a  *taskworkers.Assignment
	at time.Time
}

const (
	seenSweepAt    = 100_000
	seenSweepEvery = time.Minute
	seenMaxAge     = 2 * time.Hour
)

func (s *seenTasks) note(id string, t *model.Task, a *taskworkers.Assignment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]seenTask{}
	}
	now := time.Now()
	if s.nowFor != nil {
		now = s.nowFor()
	}
	if len(s.m) >= seenSweepAt && now.Sub(s.swept) >= seenSweepEvery {
		s.swept = now
		for k, v := range s.m {
			if now.Sub(v.at) > seenMaxAge {
				delete(s.m, k)
			}
		}
	}
	s.m[id] = seenTask{t: t, a: a, at: now}
}

func (s *seenTasks) get(id string) (*model.Task, *taskworkers.Assignment, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[id]
	return v.t, v.a, ok
}

// passed reports whether a poll passed task id through untouched (not an
// external step's).
func (s *seenTasks) passed(id string) bool {
	t, _, known := s.get(id)
	return known && t == nil
}

func (s *seenTasks) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}
