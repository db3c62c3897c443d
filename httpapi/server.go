// Package httpapi is the sidecar's control API (HTTP JSON under /v1) and a
// client for it. Errors are {"code": "...", "message": "..."} with a fitting
// status; bad input gets a 4xx and changes nothing.
package httpapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/connlimit"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/ratelog"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/tracing"
)

// LogReader reads a run's events and its derived state.
type LogReader interface {
	ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error)
	Fetch(ctx context.Context, runID string, afterSeq int64, limit int) ([]statestore.RunEventRecord, error)
}

// StartRequest asks for a run of a plan; it is idempotent on (TenantID,
// ProjectID, EnvironmentID, Plan.PlanID, Plan.PlanVersion, RunRequestID).
type StartRequest struct {
	TenantID      string     `json:"tenantId"`
	ProjectID     string     `json:"projectId"`
	EnvironmentID string     `json:"environmentId"`
	RunRequestID  string     `json:"runRequestId"`
	RequestedBy   string     `json:"requestedBy,omitempty"`
	Plan          *plan.Plan `json:"plan"`
	// Labels are the run's labels, e.g. {"team": "data", "tier": "gold"}
	// (Kubernetes' rules: adapter.CheckLabels).
	Labels map[string]string `json:"labels,omitempty"`
}

// Started is the answer to a start: the run, and whether this request
// created it (false: an earlier request with the same key did).
type Started struct {
	RunID        string `json:"runId"`
	WorkflowID   string `json:"workflowId"`
	EngineRunRef string `json:"engineRunRef"`
	Created      bool   `json:"created"`
	// Status is set when the run did not start (answered 202): QUEUED
	// (admission control holds it: Position, and NotBefore under the
	// delay policy), PENDING (not decided within the wait; see its
	// status) or CANCELLED (cancelled while queued).
	Status    string `json:"status,omitempty"`
	Position  int    `json:"position,omitempty"`
	NotBefore string `json:"notBefore,omitempty"`
}

// Starter starts runs on the engine.
type Starter interface {
	Start(ctx context.Context, req StartRequest) (*Started, error)
}

// Options configures a Server.
type Options struct {
	Log LogReader
	// Archive reads the runs that left hot state (nil: no archive):
	// status and events answer them from it, marked archived, and
	// control actions on them answer RUN_ARCHIVED.
	Archive ArchiveReader
	// ArchiveReadTimeout bounds each read of the archive a request makes
	// (default DefaultArchiveReadTimeout): past it, 503
	// ARCHIVE_UNAVAILABLE.
	ArchiveReadTimeout time.Duration
	Starter            Starter
	// Control carries out pause, resume and cancel (nil: not served).
	Control Control
	// List lists runs: GET /v1/runs (nil: not served).
	List RunLister
	// Bus is the event bus: GET /v1/bus, its dead letters and their
	// replay (nil: not served).
	Bus Bus
	// Plans reads a run's plan version: GET /v1/runs/{runId}/plan, the
	// step graph the console draws (nil: not served).
	Plans PlanReader
	// NoConsole turns the web console at /ui off (it is served by
	// default, behind the API's authentication: docs/console.md).
	NoConsole bool
	// SecureCookies marks the console's session cookie Secure on a plain
	// HTTP listener too (behind a proxy that terminates TLS); over TLS it
	// always is.
	SecureCookies bool
	// Queue gives a QUEUED run's place in the admission queue (nil: no
	// admission control).
	Queue QueuePositions
	// DrainTimeout is the default drain timeout shown in a paused run's
	// drain block (default 5m).
	DrainTimeout time.Duration
	// Ready reports whether the sidecar can serve (store and engine
	// reachable); nil means always ready.
	Ready func(ctx context.Context) error
	// Live reports whether the process can still recover by itself
	// (/healthz): an error means it cannot and only a restart helps (its
	// connection to the store was closed for good, say). nil: always live.
	Live func() error
	// Gatherer is served on /metrics (nil: no /metrics).
	Gatherer prometheus.Gatherer
	// Replies keeps the first answers of control requests that carry an
	// Idempotency-Key (nil: the header is ignored).
	Replies Replies
	// Registerer receives the API's own metrics (nil: none).
	Registerer prometheus.Registerer
	Logger     *zap.Logger
	// Tracer makes a span per control request (every method but GET),
	// in the trace of the caller's W3C traceparent or else in the run's
	// (nil: tracing off).
	Tracer *tracing.Tracer
	// Auth authenticates every request but /healthz and /readyz; nil
	// serves without authentication (local use on loopback), and then the
	// requestedBy a caller sends is recorded as it is.
	Auth Authenticator
	// TLSConfig, when set, makes Open serve TLS (and mTLS when it asks
	// for client certificates).
	TLSConfig *tls.Config
	// Timeouts of the HTTP server (defaults: header 10s, whole request
	// read 30s, write 2m, idle keep-alive 60s). A body sent slower than
	// ReadTimeout allows is cut off.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// AllowedHosts are host names (no port) a request's Host may name
	// besides loopback names and IP addresses, e.g. a pod's service name.
	AllowedHosts []string
	// Notifications, with NotifySecret, serves POST NotifyPath: Conductor's
	// workflow status notifications, each a prompt check of the
	// workflow's run. The route takes no bearer token: the caller proves
	// itself with NotifySecret (at least MinNotifySecretBytes) in
	// NotifySecretHeader. Nil or no secret: not served.
	Notifications WorkflowNudger
	NotifySecret  []byte
	// Adoption, when set, adopts on demand the workflow a request names
	// by its runId when the log has no such run yet (adopted runs' runId
	// is their workflowId): a run of an adopted definition is not
	// RUN_NOT_FOUND in the seconds before the adopter's running-list read
	// finds it. Nil: no adoption.
	Adoption RunAdoption
	// MaxConnections bounds the connections the listener keeps open at
	// once (0: no bound); a connection beyond is answered 503
	// TOO_MANY_CONNECTIONS and closed (over TLS, closed).
	MaxConnections int
	// MaxRequestsPerPrincipal bounds the writing requests (starts,
	// control actions, dead-letter replays) each principal has in progress
	// at once (0: no bound); one beyond is answered 429 TOO_MANY_REQUESTS.
	// Requests without authentication count as one principal.
	MaxRequestsPerPrincipal int
}

// Default server timeouts.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 2 * time.Minute
	DefaultIdleTimeout       = 60 * time.Second
)

// MaxPauseTimeout bounds a pause's timeoutSeconds (7 days).
const MaxPauseTimeout = 7 * 24 * time.Hour

// Byte budgets of a request. Whatever a request carries is recorded in
// every event it causes (a bulk action's reason in each run's), so the
// budgets are what operators type, not what a store could hold.
const (
	// MaxBodyBytes bounds the body of a start (a plan) and of a dead-letter
	// replay (up to MaxDeadLetterLimit keys).
	MaxBodyBytes = 1 << 20
	// MaxControlBodyBytes bounds the body of the control actions, single
	// and bulk.
	MaxControlBodyBytes = 16 << 10
	// MaxReasonBytes bounds a control action's reason (UTF-8 bytes).
	MaxReasonBytes = 512
	// MaxHeaderBytes bounds a request's line and headers (431 beyond).
	MaxHeaderBytes = 64 << 10
)

// Server serves the control API.
type Server struct {
	opts     Options
	log      *zap.Logger
	mux      *http.ServeMux
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	controls *prometheus.CounterVec
	// refusedConns counts the connections refused beyond MaxConnections;
	// conns is the bounded listener once Open made it.
	refusedConns prometheus.Counter
	conns        atomic.Pointer[connlimit.Listener]

	serving  serving
	sessions *sessions // the console's cookie sessions
	// refusedLogins bounds the log of refused console sign-ins.
	refusedLogins ratelog.Limiter
	// failures bounds the log of failed requests: a limiter a code.
	failures failureLog
	// closing is cancelled when Close starts: list watches answer then
	// instead of holding shutdown for the rest of their wait.
	closing     context.Context
	stopWatches context.CancelFunc

	allow map[string][]string // path pattern -> methods served

	// writing bounds each principal's writing requests in progress.
	writing *inProgress

	notifySecret [32]byte // the digest of Options.NotifySecret

	// unreleased are the Idempotency-Keys whose claim a 5xx answer could
	// not release (the replies' store down): a retry on this replica
	// releases it first (idempotency.go).
	unreleased unreleasedKeys
}

// NewServer returns a Server; Handler serves it, Open listens.
func NewServer(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 5 * time.Minute
	}
	for _, d := range []struct {
		p   *time.Duration
		def time.Duration
	}{{&opts.ReadHeaderTimeout, DefaultReadHeaderTimeout}, {&opts.ReadTimeout, DefaultReadTimeout}, {&opts.WriteTimeout, DefaultWriteTimeout}, {&opts.IdleTimeout, DefaultIdleTimeout}} {
		if *d.p <= 0 {
			*d.p = d.def
		}
	}
	if opts.Archive != nil {
		if opts.ArchiveReadTimeout <= 0 {
			opts.ArchiveReadTimeout = DefaultArchiveReadTimeout
		}
		opts.Archive = boundedArchive{opts.Archive, opts.ArchiveReadTimeout}
	}
	s := &Server{opts: opts, log: opts.Logger.Named("api"), mux: http.NewServeMux(), allow: map[string][]string{}, sessions: newSessions(),
		writing: &inProgress{max: opts.MaxRequestsPerPrincipal}}
	s.closing, s.stopWatches = context.WithCancel(context.Background())
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sidecar_api_requests_total", Help: "Control API requests by route and result code.",
	}, []string{"route", "code"})
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "sidecar_api_request_duration_seconds", Help: "Control API latency by route.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
	}, []string{"route"})
	s.controls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sidecar_control_requests_total", Help: "Control requests (pause, resume, cancel, retry) by action and result.",
	}, []string{"action", "result"})
	for _, a := range []string{"pause", "resume", "cancel", "retry", "bulk_pause", "bulk_resume", "bulk_cancel"} {
		for _, r := range controlResults {
			s.controls.WithLabelValues(a, r)
		}
	}
	s.refusedConns = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sidecar_api_connections_refused_total", Help: "Connections to the API's listener refused (503 TOO_MANY_CONNECTIONS) because it held MaxConnections.",
	})
	openConns := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sidecar_api_connections_open", Help: "Connections the API's listener holds open (counted when it has a bound).",
	}, func() float64 {
		if l := s.conns.Load(); l != nil {
			return float64(l.Open())
		}
		return 0
	})
	maxConns := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sidecar_api_connections_max", Help: "The bound on the API listener's open connections (0: none).",
	})
	maxConns.Set(float64(max(opts.MaxConnections, 0)))
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(s.requests, s.latency, s.controls, s.refusedConns, openConns, maxConns)
	}
	s.route("POST /v1/runs", "start", RoleSubmitter, s.start)
	if opts.List != nil {
		s.route("GET /v1/runs", "list", RoleViewer, s.list)
	}
	s.route("GET /v1/runs/{runId}", "status", RoleViewer, s.status)
	s.route("GET /v1/runs/{runId}/events", "events", RoleViewer, s.events)
	if opts.Plans != nil {
		s.route("GET /v1/runs/{runId}/plan", "plan", RoleViewer, s.planGraph)
	}
	for _, action := range []string{"pause", "resume", "cancel"} {
		s.route("POST /v1/runs/{runId}/"+action, action, RoleOperator, s.controlRoute(action, s.control(action)))
	}
	s.route("POST /v1/runs/{runId}/steps/{stepId}/retry", "retry", RoleOperator, s.controlRoute("retry", s.control("retry")))
	if opts.List != nil {
		for _, action := range []string{"pause", "resume", "cancel"} {
			s.route("POST /v1/runs:"+action, "bulk_"+action, RoleOperator, s.controlRoute("bulk_"+action, s.bulk(action)))
		}
	}
	if opts.Bus != nil {
		s.route("GET /v1/bus", "bus", RoleViewer, s.busStatus)
		s.route("GET /v1/bus/deadletters", "deadletters", RoleViewer, s.deadLetters)
		s.route("POST /v1/bus/deadletters:replay", "replay", RoleOperator, s.replay)
	}
	if opts.Notifications != nil && len(opts.NotifySecret) >= MinNotifySecretBytes {
		// Conductor sends one header, no bearer token: the secret is
		// the route's authentication (checked by the handler).
		s.notifySecret = notifySecret(opts.NotifySecret)
		s.route("POST "+NotifyPath, "conductor_status", "", s.workflowStatus)
	}
	s.route("GET /healthz", "healthz", "", s.live)
	s.route("GET /readyz", "readyz", "", s.ready)
	if opts.Gatherer != nil {
		metrics := promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{})
		s.route("GET /metrics", "metrics", RoleViewer, func(w http.ResponseWriter, r *http.Request) error {
			if p := PrincipalFrom(r.Context()); p != nil && p.Scope != (Scope{}) {
				return &apiError{status: http.StatusForbidden, Code: CodeForbidden,
					Message: p.Name + " is scoped to a tenant, project or environment, and /metrics counts every tenant's runs; scrape it with an unscoped viewer's token, or on --metrics-listen"}
			}
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.Header().Set("Cache-Control", "no-store")
			metrics.ServeHTTP(w, r)
			return nil
		})
	}
	// A known path with another method is 405 with Allow, not 404.
	for path, methods := range s.allow {
		allow := strings.Join(methods, ", ")
		s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, &apiError{status: http.StatusMethodNotAllowed, Code: CodeMethodNotAllowed, Message: r.Method + " " + r.URL.Path + ": allowed: " + allow})
		})
	}
	if !opts.NoConsole {
		s.consoleRoutes()
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, Code: CodeNotFound, Message: "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
	return s
}

// Handler returns the API's handler.
func (s *Server) Handler() http.Handler { return s.mux }

// Open serves on ln until Close.
func (s *Server) Open(ln net.Listener) {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: s.opts.ReadHeaderTimeout, ReadTimeout: s.opts.ReadTimeout,
		WriteTimeout: s.opts.WriteTimeout, IdleTimeout: s.opts.IdleTimeout, MaxHeaderBytes: MaxHeaderBytes, ErrorLog: ratelog.NewStdLog(s.log.Named("http"))}
	if s.opts.MaxConnections > 0 {
		// Bounded before TLS: a connection beyond the bound costs no
		// handshake. Over TLS it is closed without a word (its client
		// expects a handshake, not plain HTTP).
		opts := connlimit.Options{Max: s.opts.MaxConnections, OnRefuse: s.refusedConns.Inc}
		if s.opts.TLSConfig == nil {
			opts.Refusal = tooManyConnections
		}
		l := connlimit.New(ln, opts)
		s.conns.Store(l)
		ln = l
	}
	if s.opts.TLSConfig != nil {
		ln = tls.NewListener(ln, s.opts.TLSConfig)
	}
	s.serving.start(srv, ln, s.log)
}

// tooManyConnections is the whole answer to a connection beyond
// MaxConnections, written before it is closed.
var tooManyConnections = func() []byte {
	body, _ := json.Marshal(apiError{Code: CodeTooManyConnections,
		Message: "this listener holds its most open connections (--max-connections); close idle connections or try again later"})
	return []byte(fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s", len(body), body))
}()

// Close stops accepting requests and waits for those in flight until ctx
// is done.
func (s *Server) Close(ctx context.Context) error {
	s.stopWatches()
	return s.serving.close(ctx)
}

// apiError is an error answer.
type apiError struct {
	status int
	// retryAfter, when set, is sent as Retry-After (whole seconds).
	retryAfter time.Duration
	Code       string `json:"code"`
	Message    string `json:"message"`
	Problems   any    `json:"problems,omitempty"`
	Field      string `json:"field,omitempty"`
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

// answerCode is the machine code err is answered with ("" for nil).
func answerCode(err error) string {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return errcode.CodeOf(err)
}

// route serves pattern ("METHOD /path") as name. With authentication on,
// the caller needs role (none: open, for probes), and on a route with a
// {runId} a scoped caller sees only the runs in its scope: any other run
// is RUN_NOT_FOUND, as if it did not exist.
func (s *Server) route(pattern, name, role string, h func(http.ResponseWriter, *http.Request) error) {
	method, path, _ := strings.Cut(pattern, " ")
	s.allow[path] = append(s.allow[path], method)
	traced := s.opts.Tracer != nil && method != http.MethodGet && role != ""
	// A writing request: a start, a control action, a replay (not the
	// console's sign-in, nor Conductor's notifications).
	writing := method != http.MethodGet && (role == RoleSubmitter || role == RoleOperator)
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		var span *tracing.Request
		if traced { // a control request: its span, in the caller's trace or the run's
			r, span = s.opts.Tracer.BeginRequest(r, path)
		}
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		r.Body = http.MaxBytesReader(rec, r.Body, bodyBudget(name))
		var err error
		if role != "" { // probes answer anyone
			err = s.checkBrowser(r)
		}
		if err == nil {
			err = checkPathIDs(r)
		}
		if err == nil {
			err = checkQuery(r, name)
		}
		if err == nil {
			r, err = s.authorize(rec, r, role)
		}
		if err == nil && writing {
			name := ""
			if p := PrincipalFrom(r.Context()); p != nil {
				name = p.Name
			}
			if s.writing.take(name) {
				defer s.writing.give(name)
			} else {
				err = s.writing.tooManyRequests(name)
			}
		}
		if err == nil {
			err = h(rec, r)
		}
		if err != nil {
			s.writeErr(rec, name, err)
		}
		if span != nil {
			code := answerCode(err)
			if code == statestore.CodeRunNotFound {
				// No such run, or one outside the caller's scope: the
				// span names no run, so that no principal puts spans
				// into the trace of a run it may not see.
				span.SetRunID("")
			}
			span.End(rec.status, code)
		}
		s.requests.WithLabelValues(name, strconv.Itoa(rec.status)).Inc()
		s.latency.WithLabelValues(name).Observe(time.Since(began).Seconds())
	})
}

// checkBrowser refuses what a web page can make a browser send: a
// cross-origin request (an Origin other than the request's own, or
// Sec-Fetch-Site cross-site or same-site) and, when the API has no
// authentication or Options.AllowedHosts is set, a Host that is neither
// a loopback name, an IP address nor an allowed host (a DNS-rebinding
// page names its own domain). Clients that are not browsers send neither
// header.
func (s *Server) checkBrowser(r *http.Request) error {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return &apiError{status: http.StatusForbidden, Code: CodeCrossOrigin,
			Message: "cross-origin browser requests are refused (Sec-Fetch-Site: " + r.Header.Get("Sec-Fetch-Site") + "); use the CLI or an HTTP client"}
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return &apiError{status: http.StatusForbidden, Code: CodeCrossOrigin,
				Message: fmt.Sprintf("cross-origin browser requests are refused (Origin %q, Host %q); use the CLI or an HTTP client", origin, r.Host)}
		}
	}
	if s.opts.Auth != nil && len(s.opts.AllowedHosts) == 0 {
		return nil
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") || net.ParseIP(host) != nil {
		return nil
	}
	for _, h := range s.opts.AllowedHosts {
		if strings.EqualFold(host, h) {
			return nil
		}
	}
	return &apiError{status: http.StatusForbidden, Code: CodeHostRefused,
		Message: fmt.Sprintf("Host %q is not a loopback name, an IP address or an allowed host; allow it with serve --api-allowed-hosts %s", r.Host, host)}
}

// bodyBudget is the most body bytes route name reads: a start's plan and
// a replay's keys get MaxBodyBytes, every other route MaxControlBodyBytes.
func bodyBudget(name string) int64 {
	switch name {
	case "start", "replay":
		return MaxBodyBytes
	case "conductor_status":
		return MaxNotificationBytes
	}
	return MaxControlBodyBytes
}

// tooLarge is the answer to a body over its route's budget.
func tooLarge(err error) (*apiError, bool) {
	var mbe *http.MaxBytesError
	if !errors.As(err, &mbe) {
		return nil, false
	}
	return &apiError{status: http.StatusRequestEntityTooLarge, Code: CodeBadRequest, Message: fmt.Sprintf("body larger than %d bytes, this route's budget", mbe.Limit)}, true
}

// checkReason bounds a control action's reason: it is recorded in every
// event the action causes.
func checkReason(reason string) error {
	switch {
	case len(reason) > MaxReasonBytes:
		return badRequest("reason", fmt.Sprintf("reason is %d bytes; the limit is %d (say what happened in a sentence, link to the rest)", len(reason), MaxReasonBytes))
	case strings.IndexByte(reason, 0) >= 0:
		return badRequest("reason", "reason must not contain NUL")
	}
	return nil
}

// checkPathIDs checks the ids of r's path (runId, stepId) with the one id
// rule (statestore.CheckID), before anything reads a store with them.
func checkPathIDs(r *http.Request) error {
	for _, name := range []string{"runId", "stepId"} {
		if v := r.PathValue(name); v != "" {
			if err := checkID(name, v, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkID checks an id that enters through the API: statestore.CheckID's
// rule (1..MaxIDBytes bytes of UTF-8, no NUL; no '|' with noPipe), a 400
// naming the field otherwise.
func checkID(field, v string, noPipe bool) error {
	if err := statestore.CheckID(v, noPipe); err != nil {
		return badRequest(field, field+" "+err.Error())
	}
	return nil
}

// checkOptionalIDs checks the ids that are set, as checkID.
func checkOptionalIDs(noPipe bool, fields ...[2]string) error {
	for _, f := range fields {
		if f[1] == "" {
			continue
		}
		if err := checkID(f[0], f[1], noPipe); err != nil {
			return err
		}
	}
	return nil
}

// authorize authenticates r (when the server has an Authenticator),
// checks role and, on a run route, the principal's scope. The principal
// goes into r's context for requestedBy.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, role string) (*http.Request, error) {
	if role == "" {
		return r, nil // probes: no run, no caller
	}
	if s.opts.Auth == nil {
		return r, s.adoptOnDemand(r.Context(), r.PathValue("runId"))
	}
	p, err := s.opts.Auth.Authenticate(r)
	if err != nil {
		// A console session: its cookie, and its CSRF token on a change.
		p, err = s.cookiePrincipal(r)
	}
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			return r, ae
		}
		return r, errUnauthenticated(w)
	}
	if !p.Can(role) {
		return r, &apiError{status: http.StatusForbidden, Code: CodeForbidden, Message: fmt.Sprintf("%s lacks the role %s", p.Name, role)}
	}
	// The principal names the caller of the calls to Conductor the request
	// makes: control calls waiting for a place get one in turn by caller.
	r = r.WithContext(adapter.WithCaller(context.WithValue(r.Context(), principalKey{}, p), p.Name))
	if err := s.adoptOnDemand(r.Context(), r.PathValue("runId")); err != nil {
		return r, err
	}
	if runID := r.PathValue("runId"); runID != "" && p.Scope != (Scope{}) {
		notFound := &apiError{status: http.StatusNotFound, Code: CodeRunNotFound, Message: "no such run"}
		snap, _, err := s.runSnapshot(r.Context(), runID)
		switch {
		case errors.Is(err, statestore.ErrNotFound):
			return r, notFound
		case err != nil && s.archivedOutside(r.Context(), p.Scope, runID, err):
			return r, notFound
		case err != nil:
			return r, err
		case !p.Scope.Allows(snap.TenantID, snap.ProjectID, snap.EnvironmentID):
			return r, notFound
		}
	}
	return r, nil
}

// RunAdoption adopts a workflow of an adopted definition that Conductor
// runs now (adapter.Adopter.EnsureRunning); an error when it is not one.
type RunAdoption interface {
	EnsureRunning(ctx context.Context, workflowID string) error
}

// adoptOnDemandTimeout bounds the adoption a request waits for.
const adoptOnDemandTimeout = 5 * time.Second

// adoptOnDemand adopts runID's workflow before the request is served when
// adoption is on (Options.Adoption), runID could be a workflow's id (a
// UUID) and the log has no such run. A workflow that is not adopted
// leaves the request to answer as without adoption (RUN_NOT_FOUND); when
// Conductor, which may run it, did not answer, the error is returned
// (ENGINE_UNAVAILABLE: retry), not a RUN_NOT_FOUND that may be untrue. It
// costs one read of the log when adoption is on, and one read of
// Conductor for a UUID the log does not have.
func (s *Server) adoptOnDemand(ctx context.Context, runID string) error {
	if s.opts.Adoption == nil || runID == "" || len(runID) != 36 {
		return nil
	}
	if _, err := uuid.Parse(runID); err != nil {
		return nil
	}
	// In hot state or archived: a run already (an archived run is never
	// adopted again, and is answered from the archive while Conductor is
	// away).
	if _, _, err := s.runSnapshot(ctx, runID); !errors.Is(err, statestore.ErrNotFound) && !errors.Is(err, archive.ErrRunNotFound) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, adoptOnDemandTimeout)
	defer cancel()
	err := s.opts.Adoption.EnsureRunning(ctx, runID)
	if errors.Is(err, errcode.Unavailable) {
		return err
	}
	if err != nil {
		s.log.Debug("a request named a run the log does not have; not adopted", zap.String("runId", runID), zap.Error(err))
	}
	return nil
}

// answer is the API answer of err: err itself when it is one, else its
// classification.
func (s *Server) answer(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	return s.classify(err)
}

// writeErr writes the answer of a handler's error, logging server faults:
// each code at most once a minute, since clients retrying while a
// dependency is away would write a line a request.
func (s *Server) writeErr(w http.ResponseWriter, route string, err error) {
	ae := s.answer(err)
	if ae.status >= 500 {
		if ok, held := s.failures.take(ae.Code); ok {
			fields := []zap.Field{zap.String("route", route), zap.String("code", ae.Code), zap.Error(err)}
			if held > 0 {
				fields = append(fields, zap.Int("failuresNotLogged", held))
			}
			if ae.Code == CodeInternal {
				s.log.Error("request failed (logged at most once a minute a code)", fields...)
			} else {
				// A named condition (a store or an archive unavailable
				// or damaged), not a fault of the sidecar's: no stack.
				s.log.Warn("request failed (logged at most once a minute a code)", fields...)
			}
		}
	}
	writeError(w, ae)
}

// failureLog is a ratelog.Limiter for each error code.
type failureLog struct {
	mu    sync.Mutex
	codes map[string]*ratelog.Limiter
}

// take reports whether a failure of code may be logged now, and how many
// were not since the last one that was.
func (f *failureLog) take(code string) (ok bool, held int) {
	f.mu.Lock()
	l := f.codes[code]
	if l == nil {
		if f.codes == nil {
			f.codes = map[string]*ratelog.Limiter{}
		}
		l = new(ratelog.Limiter)
		f.codes[code] = l
	}
	f.mu.Unlock()
	return l.Take(time.Now())
}

// classify answers an error that is not an API answer by its kind: the
// status from statusOf, the code and message from the error, and the
// details its type carries (a field, a plan's problems, when to retry). An
// error without a kind is a fault of the sidecar (INTERNAL), unless a
// deadline passed first: then the call waited on Conductor. A stream that
// refuses every write outranks whatever wrapped its error (writeRefused).
func (s *Server) classify(err error) *apiError {
	if ae := writeRefused(err); ae != nil {
		return ae
	}
	c, ok := errcode.Of(err)
	status, known := 0, false
	if ok {
		status, known = statusOf[c.ErrorKind()]
	}
	if !known && ok && c.ErrorKind() == errcode.Internal && c.ErrorCode() != "" {
		// A fault with a name (an archive that does not match its
		// manifests): its code, not INTERNAL.
		return &apiError{status: http.StatusInternalServerError, Code: c.ErrorCode(), Message: err.Error()}
	}
	if !known {
		if errors.Is(err, context.DeadlineExceeded) {
			return &apiError{status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error()}
		}
		return &apiError{status: http.StatusInternalServerError, Code: CodeInternal, Message: err.Error()}
	}
	ae := &apiError{status: status, Code: c.ErrorCode(), Message: err.Error()}
	switch e := c.(type) {
	case *statestore.Error:
		ae.Message, ae.Field = e.Message, e.Field
	case *plan.ValidationError:
		ae.Message, ae.Problems = e.Error(), e.Problems
	case *runlist.Error:
		ae.Message = e.Message
		switch {
		case errors.Is(e, runlist.ErrSelectorInvalid):
			ae.Field = "labelSelector"
		case errors.Is(e, runlist.ErrContinueInvalid):
			ae.Field = "continue"
		case errors.Is(e, runlist.ErrSyncing):
			ae.retryAfter = time.Second
		}
	case *admission.Error:
		ae.Message, ae.retryAfter = e.Error(), e.RetryAfter
	case *eventbus.Error:
		ae.Message = e.Error()
	case *adapter.Error:
		if !e.RetryAt.IsZero() {
			ae.retryAfter = max(time.Until(e.RetryAt), time.Second)
		}
	}
	if c == statestore.ErrNotFound {
		ae.Message = "no such run"
	}
	return ae
}

func (s *Server) start(w http.ResponseWriter, r *http.Request) error {
	var req StartRequest
	if err := decodeBody(r, startSchema, &req); err != nil {
		return err
	}
	if err := validateStart(&req); err != nil {
		return err
	}
	if p := PrincipalFrom(r.Context()); p != nil && !p.Scope.Allows(req.TenantID, req.ProjectID, req.EnvironmentID) {
		return &apiError{status: http.StatusForbidden, Code: CodeForbidden,
			Message: fmt.Sprintf("%s may start runs only in tenant %q, project %q, environment %q (empty: any)", p.Name, p.Scope.TenantID, p.Scope.ProjectID, p.Scope.EnvironmentID)}
	}
	by, err := requestedBy(r.Context(), req.RequestedBy)
	if err != nil {
		return err
	}
	req.RequestedBy = by
	if err := plan.Validate(req.Plan); err != nil {
		return err
	}
	if s.opts.Starter == nil {
		return &apiError{status: http.StatusServiceUnavailable, Code: CodeNotReady, Message: "this sidecar does not start runs"}
	}
	started, err := s.opts.Starter.Start(r.Context(), req)
	if err != nil {
		return err
	}
	tracing.RequestFrom(r.Context()).SetRunID(started.RunID)
	status := http.StatusOK
	switch {
	case started.Status != "":
		status = http.StatusAccepted
	case started.Created:
		status = http.StatusCreated
	}
	w.Header().Set("Location", "/v1/runs/"+started.RunID)
	return writeJSON(w, status, started)
}

// validateStart checks the run-start key fields with statestore.CheckID:
// required, UTF-8, at most statestore.MaxIDBytes, no NUL and no '|' (the
// key is their '|'-joined hash).
func validateStart(req *StartRequest) error {
	for _, f := range []struct{ name, v string }{
		{"tenantId", req.TenantID}, {"projectId", req.ProjectID}, {"environmentId", req.EnvironmentID}, {"runRequestId", req.RunRequestID},
	} {
		if err := checkID(f.name, f.v, true); err != nil {
			return err
		}
	}
	if req.Plan == nil {
		return badRequest("plan", "plan is required")
	}
	if problems := adapter.CheckLabels(req.Labels); len(problems) > 0 {
		msgs := make([]string, len(problems))
		for i, p := range problems {
			msgs[i] = "labels: " + p.Message
			if p.Key != "" {
				msgs[i] = fmt.Sprintf("labels[%q]: %s", p.Key, p.Message)
			}
		}
		field := "labels"
		if problems[0].Key != "" {
			field = "labels." + problems[0].Key
		}
		return badRequest(field, strings.Join(msgs, "; "))
	}
	return nil
}

// RunView is GET /v1/runs/{runId} and the answer of the control actions:
// the snapshot, the human message of Execution Semantics Contract v1.1 §6.5
// and, while the run is paused, the drain block (pausedAt, deadline,
// in-flight step ids).
type RunView struct {
	*statestore.RunSnapshot
	Message string           `json:"message"`
	Drain   *drain.DrainView `json:"drain,omitempty"`
	// DrainETA estimates when a DRAINING run's drain ends, from the
	// durations of the same steps in earlier runs of the plan version.
	DrainETA *runlist.ETA `json:"drainEta,omitempty"`
	// QueuePosition is a QUEUED run's place among the runs waiting for
	// admission (1: next).
	QueuePosition int `json:"queuePosition,omitempty"`
	// Notice says what an accepted control request did not do (see
	// drain.State.Notice).
	Notice string `json:"notice,omitempty"`
	// Archived is set when the run left hot state and was read from the
	// archive (its records checked against the archive's manifest).
	Archived bool `json:"archived,omitempty"`
	// Replayed is set by the Client when the answer is the stored first
	// answer of an Idempotency-Key (the run's state then, not now).
	Replayed bool `json:"-"`
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) error {
	return s.writeRun(w, r, r.PathValue("runId"))
}

func (s *Server) writeRun(w http.ResponseWriter, r *http.Request, runID string) error {
	snap, archived, err := s.runSnapshot(r.Context(), runID)
	if err != nil {
		return err
	}
	if archived {
		return writeJSON(w, http.StatusOK, RunView{RunSnapshot: snap, Message: Message(snap), Archived: true})
	}
	return s.writeSnapshot(w, runID, drain.StateOf(snap, s.opts.DrainTimeout), snap)
}

// writeControlled answers a control action from the state it returned
// (read again only when that state carries no snapshot).
func (s *Server) writeControlled(w http.ResponseWriter, r *http.Request, runID string, st *drain.State) error {
	if st != nil && st.Snapshot != nil {
		return s.writeSnapshot(w, runID, st, st.Snapshot)
	}
	snap, err := s.opts.Log.ProjectSnapshot(r.Context(), runID)
	if err != nil {
		return err
	}
	answer := drain.StateOf(snap, s.opts.DrainTimeout)
	if st != nil {
		answer.Notice = st.Notice
	}
	return s.writeSnapshot(w, runID, answer, snap)
}

// writeSnapshot writes the RunView of snap, with the drain block and the
// notice of st, snap's pause state.
func (s *Server) writeSnapshot(w http.ResponseWriter, runID string, st *drain.State, snap *statestore.RunSnapshot) error {
	view := *snap // the projector's snapshot may be shared: the open pause goes on a copy
	view.PausedSeconds += openPauseSeconds(snap, time.Now())
	rv := RunView{RunSnapshot: &view, Message: Message(snap), Drain: st.Drain, Notice: st.Notice}
	if snap.Substatus == statestore.SubstatusDraining && s.opts.List != nil {
		rv.DrainETA = s.opts.List.DrainETA(snap, time.Now())
	}
	if snap.Status == statestore.RunStatusQueued && s.opts.Queue != nil {
		if n := s.opts.Queue.Position(runID); n > 0 {
			rv.QueuePosition = n
			rv.Message = fmt.Sprintf("Workflow queued: position %d for admission.", n)
		}
	}
	return writeJSON(w, http.StatusOK, rv)
}

// openPauseSeconds is how long the run has been paused, when it is.
func openPauseSeconds(snap *statestore.RunSnapshot, now time.Time) float64 {
	if snap.Status != statestore.RunStatusPaused || snap.Pause == nil {
		return 0
	}
	at, err := time.Parse(time.RFC3339Nano, snap.Pause.PausedAt)
	if err != nil || now.Before(at) {
		return 0
	}
	return float64(now.Sub(at).Milliseconds()) / 1000
}

// Message is the human summary of a run's state, e.g. "Workflow paused.
// Waiting for 3 in-flight tasks to complete." while it drains.
func Message(s *statestore.RunSnapshot) string {
	inFlight := len(s.InFlight())
	switch {
	case s.Status == statestore.RunStatusPaused && s.Substatus == statestore.SubstatusDraining:
		return fmt.Sprintf("Workflow paused. Waiting for %d in-flight %s to complete.", inFlight, plural(inFlight, "task", "tasks"))
	case s.Status == statestore.RunStatusPaused && len(s.HeldSteps()) > 0:
		return fmt.Sprintf("Workflow paused: step %s failed. Retry it or cancel the run.", strings.Join(s.HeldSteps(), ", "))
	case s.Status == statestore.RunStatusPaused && s.Pause != nil && s.Pause.DrainTimedOut && inFlight > 0:
		return fmt.Sprintf("Workflow paused. Drain timed out (PAUSE_DRAIN_TIMEOUT); %d %s still in flight (started, no outcome recorded).", inFlight, plural(inFlight, "task", "tasks"))
	case s.Status == statestore.RunStatusPaused && s.Pause != nil && s.Pause.DrainTimedOut:
		return "Workflow paused. Drain timed out (PAUSE_DRAIN_TIMEOUT); the tasks it waited for have ended since. No tasks in flight."
	case s.Status == statestore.RunStatusPaused:
		return "Workflow paused. No tasks in flight."
	case s.Status == statestore.RunStatusRunning && s.CancelRequested:
		return "Cancel requested. Waiting for the engine to stop the workflow."
	case s.Status == statestore.RunStatusRunning:
		return fmt.Sprintf("Workflow running. %d tasks in flight.", inFlight)
	case s.Status == statestore.RunStatusFailed && s.Error != nil:
		// The code says why, e.g. WORKFLOW_NOT_FOUND when Conductor lost
		// the workflow (a restart on its in-memory store).
		return fmt.Sprintf("Workflow failed: %s: %s", s.Error.Code, s.Error.Message)
	default:
		return "Workflow " + strings.ToLower(s.Status) + "."
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// EventsPage is GET /v1/runs/{runId}/events.
type EventsPage struct {
	Events []statestore.RunEventRecord `json:"events"`
	// NextAfterSeq is the afterSeq of the next page (the last runSeq
	// returned, or the request's afterSeq when none was).
	NextAfterSeq int64 `json:"nextAfterSeq"`
	// Archived is set when the run left hot state and its events were
	// read from the archive.
	Archived bool `json:"archived,omitempty"`
}

// Events page size limits.
const (
	DefaultEventsLimit = 100
	MaxEventsLimit     = 1000
)

func (s *Server) events(w http.ResponseWriter, r *http.Request) error {
	runID := r.PathValue("runId")
	q := r.URL.Query()
	after, err := intParam(q.Get("afterSeq"), 0, "afterSeq")
	if err != nil {
		return err
	}
	limit, err := intParam(q.Get("limit"), DefaultEventsLimit, "limit")
	if err != nil {
		return err
	}
	if limit < 1 || limit > MaxEventsLimit {
		return badRequest("limit", fmt.Sprintf("limit must be 1..%d", MaxEventsLimit))
	}
	if after < 0 {
		return badRequest("afterSeq", "afterSeq must be >= 0")
	}
	recs, err := s.opts.Log.Fetch(r.Context(), runID, after, int(limit))
	if err != nil {
		return err
	}
	asked := after
	if len(recs) == 0 && after > 0 {
		// Past the end of a run, or no run at all: ask for its first event.
		if recs, err = s.opts.Log.Fetch(r.Context(), runID, 0, 1); err != nil {
			return err
		}
		if len(recs) > 0 {
			recs = recs[:0]
		} else {
			after = 0
		}
	}
	if len(recs) == 0 && after == 0 {
		if s.opts.Archive != nil {
			return s.archivedEvents(w, r, runID, asked, int(limit))
		}
		return &apiError{status: http.StatusNotFound, Code: CodeRunNotFound, Message: "no such run"}
	}
	next := after
	if len(recs) > 0 {
		next = recs[len(recs)-1].RunSeq
	}
	return writeJSON(w, http.StatusOK, EventsPage{Events: recs, NextAfterSeq: next})
}

func (s *Server) live(w http.ResponseWriter, r *http.Request) error {
	if s.opts.Live != nil {
		if err := s.opts.Live(); err != nil {
			return &apiError{status: http.StatusServiceUnavailable, Code: CodeNotLive, Message: err.Error()}
		}
	}
	return writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// ReadyTimeout bounds /readyz's checks: below the timeout the chart's and
// the manifests' readiness probes give it (5 s), so that a check a frozen
// Conductor holds ends in a 503 that says why, not in the probe's
// timeout; as long as that allows, for a Conductor slow under load.
const ReadyTimeout = 4 * time.Second

func (s *Server) ready(w http.ResponseWriter, r *http.Request) error {
	if s.opts.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), ReadyTimeout)
		defer cancel()
		if err := s.opts.Ready(ctx); err != nil {
			return &apiError{status: http.StatusServiceUnavailable, Code: CodeNotReady, Message: err.Error()}
		}
	}
	return writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func intParam(v string, def int64, name string) (int64, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, badRequest(name, name+" must be an integer")
	}
	return n, nil
}

// Schemas of the request bodies: decoded as strictly as a plan (exact
// field names, no duplicates, valid UTF-8, nothing after the document).
var (
	startSchema = plan.JSONObject(map[string]plan.Schema{
		"tenantId": plan.JSONString, "projectId": plan.JSONString, "environmentId": plan.JSONString,
		"runRequestId": plan.JSONString, "requestedBy": plan.JSONString, "plan": plan.JSONRaw,
		"labels": plan.JSONStringMap,
	})
	pauseSchema = plan.JSONObject(map[string]plan.Schema{
		"timeoutSeconds": plan.JSONInt, "reason": plan.JSONString, "requestedBy": plan.JSONString,
		"resumeAt": plan.JSONString, "resumeAfterSeconds": plan.JSONInt,
	})
	reasonSchema = plan.JSONObject(map[string]plan.Schema{
		"reason": plan.JSONString, "requestedBy": plan.JSONString,
	})
)

// decodeBody reads r's JSON body into v, checked against sch. A malformed
// body is BAD_REQUEST with every problem located; a plan's own problems
// are PLAN_INVALID.
func decodeBody(r *http.Request, sch plan.Schema, v any) error {
	// Required, not assumed: a web page's form or no-cors fetch sends a
	// body without application/json.
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return &apiError{status: http.StatusUnsupportedMediaType, Code: CodeBadRequest, Message: fmt.Sprintf("Content-Type %q: a body needs Content-Type: application/json", ct)}
	}
	data, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, MaxBodyBytes))
	if err != nil {
		if ae, ok := tooLarge(err); ok {
			return ae
		}
		return badRequest("", "reading the body: "+err.Error())
	}
	if at := loneSurrogate(data); at >= 0 {
		return &apiError{status: http.StatusBadRequest, Code: CodeBadRequest,
			Message: fmt.Sprintf("malformed JSON body: a \\u escape at byte %d is a lone UTF-16 surrogate (not a character; a decoder would make it U+FFFD)", at)}
	}
	err = plan.DecodeJSON(data, sch, v, CodeBadRequest)
	var ve *plan.ValidationError
	if errors.Is(err, errBadBody) && errors.As(err, &ve) {
		first := ve.Problems[0]
		return &apiError{status: http.StatusBadRequest, Code: CodeBadRequest, Field: first.Path, Problems: ve.Problems,
			Message: "malformed JSON body: " + first.String()}
	}
	return err // nil, or PLAN_INVALID (classify)
}

// loneSurrogate returns the offset of the first \u escape in a JSON
// string of data that is a UTF-16 surrogate not paired (a high one
// followed by a low one), or -1. It reads escapes only inside strings;
// data's syntax is the decoder's to judge.
func loneSurrogate(data []byte) int {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(data[i+2:i+6]), 16, 16)
		return rune(n), err == nil
	}
	in := false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case c == '"':
			in = !in
		case in && c == '\\':
			r, ok := hex4(i)
			switch {
			case !ok:
				i++ // another escape: skip its character
			case r >= 0xD800 && r < 0xDC00:
				if low, ok := hex4(i + 6); !ok || low < 0xDC00 || low > 0xDFFF {
					return i
				}
				i += 11
			case r >= 0xDC00 && r <= 0xDFFF:
				return i
			default:
				i += 5
			}
		}
	}
	return -1
}

// queryParams are the query parameters each route takes (by its name),
// with true for one that may be repeated; a route not listed takes none.
// The probes, the metrics and Conductor's notifications are not checked:
// their callers are not ours to correct.
var queryParams = map[string]map[string]bool{
	"list": {"tenantId": false, "projectId": false, "environmentId": false, "planId": false, "planVersion": false,
		"status": true, "substatus": false, "labelSelector": false, "updatedSince": false, "limit": false, "continue": false, "include": false,
		"watch": false, "revision": false, "timeoutSeconds": false},
	"events":      {"afterSeq": false, "limit": false},
	"deadletters": {"sink": false, "after": false, "limit": false},
	"healthz":     nil, "readyz": nil, "metrics": nil, "conductor_status": nil,
}

// checkQuery refuses a query parameter the route does not take, or one
// given twice that may not be: ignored, a typo in a filter
// (lableSelector) would answer every run.
func checkQuery(r *http.Request, route string) error {
	if r.URL.RawQuery == "" {
		return nil
	}
	takes, listed := queryParams[route]
	if listed && takes == nil {
		return nil
	}
	for k, v := range r.URL.Query() {
		repeatable, ok := takes[k]
		switch {
		case !ok:
			known := slices.Sorted(maps.Keys(takes))
			want := "it takes none"
			if len(known) > 0 {
				want = "it takes " + strings.Join(known, ", ")
			}
			return badRequest(k, fmt.Sprintf("unknown query parameter %q: %s %s", k, r.Method, r.URL.Path)+"; "+want)
		case len(v) > 1 && !repeatable:
			return badRequest(k, fmt.Sprintf("query parameter %q is given %d times: give it once", k, len(v)))
		}
	}
	return nil
}

func badRequest(field, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, Code: CodeBadRequest, Field: field, Message: msg}
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	// A run's state and log are not for caches, and not to be read as
	// anything but JSON.
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((e.retryAfter+time.Second-1)/time.Second), 10))
	}
	_ = writeJSON(w, e.status, e)
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Flush lets streaming handlers flush through the recorder.
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
