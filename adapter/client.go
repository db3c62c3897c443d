package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/antihax/optional"
	"github.com/conductor-sdk/conductor-go/sdk/client"
	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/conductor-sdk/conductor-go/sdk/settings"
	"go.uber.org/zap"
	"golang.org/x/sync/semaphore"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/fair"
)

// DefaultBaseURL is the Conductor API base URL used when ClientOptions.BaseURL
// is empty (the sidecar's --conductor-url default).
const DefaultBaseURL = "http://localhost:8080/api"

// DefaultTimeout bounds one Conductor call whose context has no deadline.
const DefaultTimeout = 10 * time.Second

// maxPollTimeout caps the long-poll wait of one batch poll; Conductor holds
// the request open at most this long, and the SDK's own HTTP client gives up
// after 30 s.
const maxPollTimeout = 20 * time.Second

// ClientOptions configures NewClient. The zero value talks to DefaultBaseURL.
type ClientOptions struct {
	// BaseURL is Conductor's API base, including the /api suffix.
	BaseURL string
	// Timeout bounds each call whose context has no deadline (default
	// DefaultTimeout). A batch poll gets its long-poll wait on top.
	Timeout time.Duration
	// HTTPClient is used for the calls the sidecar makes without the SDK
	// (Health, the JSON definitions, batch polls). The SDK builds its own
	// http.Client and cannot take this one; see docs/conductor.md.
	// Default: a client with Timeout, 100 idle connections per host.
	HTTPClient *http.Client
	// Logger receives debug traces of failed calls (default zap.NewNop()).
	Logger *zap.Logger
	// Metrics records every call (nil: none).
	Metrics *Metrics
	// MaxConcurrentCalls bounds the calls the client has at Conductor at
	// once, batch polls aside (their loops are few and fixed); a further
	// call waits for one within its deadline. Each call takes one of
	// Conductor's request threads (Tomcat's 200 by default), which
	// workers and other clients need too. Default
	// DefaultMaxConcurrentCalls.
	MaxConcurrentCalls int
}

// DefaultMaxConcurrentCalls is ClientOptions.MaxConcurrentCalls by
// default: more than serve's task workers report at once with the
// default concurrency (52), fewer than a third of Conductor's threads.
const DefaultMaxConcurrentCalls = 64

// Client is the sidecar's Conductor API client: the conductor-go SDK v1.5.4
// with a deadline on every call, typed errors and metrics. Every method takes
// a context, honours its cancellation and deadline, and returns an *Error
// matching one of the package sentinels (ErrEngineUnavailable, ErrNotFound,
// ErrConflict, ErrEngineRejected), or an error matching context.Canceled when
// the caller cancelled ctx. Client is safe for concurrent use; consumers
// declare the few methods they need as their own interface.
type Client struct {
	base     string
	timeout  time.Duration
	http     *http.Client
	poll     *http.Client // http without its Timeout, for long polls
	log      *zap.Logger
	metrics  *Metrics
	workflow client.WorkflowClient
	tasks    client.TaskClient
	metadata client.MetadataClient
	// bulkMax is how many workflow ids one bulk call sends (BulkMax).
	bulkMax int
	// calls bounds the calls at Conductor at once (MaxConcurrentCalls),
	// batch polls and the health check aside; control bounds the control
	// calls among them (every call but the work calls, workCalls) to
	// three quarters, so that a flood of API requests leaves room for the
	// calls that keep runs moving, and hands its places to the callers in
	// turn (WithCaller).
	calls    *semaphore.Weighted
	control  *fair.Semaphore
	maxCalls int
	// apiSeen is set once a call of the API under base answered: the URL
	// is the API's base (Health checks it until then).
	apiSeen atomic.Bool
}

// workCalls are the calls that keep runs moving and the log in step: a
// task's report and reads of tasks and workflows. They may take every
// place for calls at Conductor; the other calls (starts, pauses, resumes,
// terminations, retries, registrations: what API requests make, one
// caller's hundreds at once) leave a quarter of the places to them.
var workCalls = map[string]bool{opUpdateTask: true, opGetTask: true, opGetWorkflow: true, opRunningWorkflows: true}

// controlPlaces is how many of places for calls control calls may
// take: all but a quarter (rounded down), and at least one.
func controlPlaces(places int) int { return max(1, places-places/4) }

// NewClient returns a Client for opts.BaseURL. It does not contact the
// server; use Health for that.
func NewClient(opts ClientOptions) (*Client, error) {
	if opts.BaseURL == "" {
		opts.BaseURL = DefaultBaseURL
	}
	u, err := url.Parse(opts.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, invalidInput("new client", "conductor url %q must be an absolute http(s) URL", opts.BaseURL)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxConcurrentCalls <= 0 {
		opts.MaxConcurrentCalls = DefaultMaxConcurrentCalls
	}
	opts.Metrics.bound(opts.MaxConcurrentCalls)
	if opts.HTTPClient == nil {
		// Go's default transport keeps 2 idle connections per host: the
		// pollers and the concurrent task updates would open and close
		// connections all the time.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 100
		opts.HTTPClient = &http.Client{Timeout: opts.Timeout, Transport: t}
	}
	// Polls wait up to maxPollTimeout on the server, longer than
	// opts.Timeout: their client has no timeout of its own; each poll's
	// context carries its deadline (do).
	poll := *opts.HTTPClient
	poll.Timeout = 0
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	base := strings.TrimRight(opts.BaseURL, "/")
	api := client.NewAPIClient(nil, settings.NewHttpSettings(base))
	return &Client{
		base:     base,
		timeout:  opts.Timeout,
		http:     opts.HTTPClient,
		poll:     &poll,
		log:      opts.Logger.Named("conductor"),
		metrics:  opts.Metrics,
		workflow: client.NewWorkflowClient(api),
		tasks:    client.NewTaskClient(api),
		metadata: client.NewMetadataClient(api),
		calls:    semaphore.NewWeighted(int64(opts.MaxConcurrentCalls)),
		control:  fair.NewSemaphore(controlPlaces(opts.MaxConcurrentCalls)),
		maxCalls: opts.MaxConcurrentCalls,
	}, nil
}

// BaseURL returns the API base URL the client talks to.
func (c *Client) BaseURL() string { return c.base }

// do runs one SDK call under a default deadline, classifies its error and
// records the metrics.
func (c *Client) do(ctx context.Context, op string, extra time.Duration, call func(ctx context.Context) (*http.Response, error)) (*http.Response, error) {
	start := time.Now()
	callCtx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(ctx, c.timeout+extra)
		defer cancel()
	}
	if op != opBatchPoll && op != opHealth {
		release, err := c.acquire(callCtx, !workCalls[op])
		if err != nil {
			err = c.classify(ctx, op, nil, err)
			c.observe(op, start, err)
			return nil, err
		}
		defer release()
	}
	resp, err := call(callCtx)
	if err != nil {
		err = c.classify(ctx, op, resp, err)
	} else if op != opHealth {
		c.apiSeen.Store(true)
	}
	c.observe(op, start, err)
	return resp, err
}

// webPage reports whether resp is a web page (Conductor 3.32 answers a
// path it does not serve with its UI's page, 200), not an API's answer.
func webPage(resp *http.Response) bool {
	return strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html")
}

// registrations are the calls no Conductor answers 404 at its API's base.
var registrations = map[string]bool{opRegisterTaskDefs: true, opRegisterWorkflow: true}

// apiProbeWorkflow names no workflow definition: the health check reads
// its running list to see that the URL is the API's base.
const apiProbeWorkflow = "sidecar_api_probe"

// acquire takes one of the places for calls at Conductor (and, for a
// control call, one of the control calls' places first), waiting for them
// while ctx lasts, and returns what gives them back.
func (c *Client) acquire(ctx context.Context, control bool) (release func(), err error) {
	if control && !c.control.TryAcquire() {
		c.metrics.waiting(1)
		err := c.control.Acquire(ctx, CallerOf(ctx))
		c.metrics.waiting(-1)
		if err != nil {
			return nil, c.waitFailed(err)
		}
	}
	if !c.calls.TryAcquire(1) {
		c.metrics.waiting(1)
		err := c.calls.Acquire(ctx, 1)
		c.metrics.waiting(-1)
		if err != nil {
			if control {
				c.control.Release()
			}
			return nil, c.waitFailed(err)
		}
	}
	if !control {
		return func() { c.calls.Release(1) }, nil
	}
	return func() { c.calls.Release(1); c.control.Release() }, nil
}

func (c *Client) waitFailed(err error) error {
	return fmt.Errorf("waiting for one of the %d places for calls to Conductor (--conductor-max-concurrent-calls): %w", c.maxCalls, err)
}

func (c *Client) observe(op string, start time.Time, err error) {
	result := resultOK
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled):
		result = resultCanceled
	default:
		result = errcode.CodeOf(err)
		if result == "" {
			result = CodeEngineUnavailable
		}
	}
	c.metrics.request(op, result, start)
	if err != nil && result != resultCanceled {
		c.log.Debug("call failed", zap.String("op", op), zap.Error(err))
	}
}

// conductorError is the JSON body of a Conductor error answer.
type conductorError struct {
	Status           int    `json:"status"`
	Message          string `json:"message"`
	ValidationErrors []struct {
		Path    string `json:"path"`
		Message string `json:"message"`
	} `json:"validationErrors"`
}

// classify maps an SDK error to an *Error (or to the caller's cancellation).
func (c *Client) classify(ctx context.Context, op string, resp *http.Response, err error) error {
	var typed *Error
	if errors.As(err, &typed) {
		return err // already classified inside the call (Resume, Retry, Task)
	}
	var se client.GenericSwaggerError
	if errors.As(err, &se) {
		status := se.StatusCode()
		if status == 0 && resp != nil {
			status = resp.StatusCode
		}
		e := &Error{Op: op, Status: status, Message: errorMessage(se.Body())}
		switch {
		case status == http.StatusNotFound && registrations[op]:
			// No Conductor answers a registration 404: the URL is not
			// its API's base.
			e.Code = CodeConductorURLInvalid
			e.Message = "Conductor's API is not at " + c.base + " (404 to a definition's registration): give its base URL, which ends in /api on a stock server; " + e.Message
		case status == http.StatusNotFound:
			e.Code = CodeNotFound
		case status == http.StatusConflict:
			e.Code = CodeConflict
		case status >= 500 || status == http.StatusTooManyRequests || status == http.StatusRequestTimeout:
			e.Code = CodeEngineUnavailable
		default:
			e.Code = CodeEngineRejected
		}
		return e
	}
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(ctxErr, context.Canceled) {
		return fmt.Errorf("adapter: %s: %w", op, ctxErr)
	}
	// Transport errors (refused, reset, DNS, timeouts, our deadline or the
	// caller's) and undecodable 2xx bodies.
	status := 0
	if resp != nil {
		status = resp.StatusCode
	}
	return &Error{Code: CodeEngineUnavailable, Op: op, Status: status, Err: err}
}

// errorMessage extracts Conductor's message (and validation errors) from an
// error body, or returns the body itself, truncated.
func errorMessage(body []byte) string {
	var ce conductorError
	if err := json.Unmarshal(body, &ce); err == nil && ce.Message != "" {
		msg := ce.Message
		for _, v := range ce.ValidationErrors {
			msg += "; " + v.Path + ": " + v.Message
		}
		return msg
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 512 {
		s = s[:512] + "..."
	}
	return s
}

// raw sends body to path (under the base URL) with plain net/http and turns
// a non-2xx answer into the SDK's error, so that classify treats it like an
// SDK call. It is used where the SDK cannot send the request (see the
// callers).
func (c *Client) raw(ctx context.Context, method, url string, body []byte) (*http.Response, error) {
	return c.rawJSON(ctx, c.http, method, url, body, 1<<20, nil)
}

// rawJSON is raw with hc, reading at most limit bytes of the answer and
// decoding a 2xx JSON answer into out (nil: the body is read and dropped).
// An empty answer (Conductor's 204) leaves out as it is.
func (c *Client) rawJSON(ctx context.Context, hc *http.Client, method, url string, body []byte, limit int64, out any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, text/plain, */*")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return resp, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp, client.NewGenericSwaggerError(b, string(b), nil, resp.StatusCode)
	}
	if int64(len(b)) > limit {
		return resp, fmt.Errorf("answer larger than %d bytes", limit)
	}
	if out != nil && len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp, fmt.Errorf("decode answer: %w", err)
		}
	}
	return resp, nil
}

// Health checks GET /health on the server root (the base URL without its
// /api suffix) and returns nil when Conductor reports healthy. The SDK's
// health call resolves under /api, which 3.21 answers with 404, so Health
// uses plain net/http.
func (c *Client) Health(ctx context.Context) error {
	_, err := c.do(ctx, opHealth, 0, func(ctx context.Context) (*http.Response, error) {
		root := strings.TrimSuffix(c.base, "/api")
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, root+"/health", nil)
		if err != nil {
			return nil, err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err != nil {
			return resp, err
		}
		if resp.StatusCode == http.StatusNotFound || webPage(resp) {
			// 3.32 answers an unknown path with its UI's page (200).
			fix := "give Conductor's API base URL, which ends in /api on a stock server (http://conductor:8080/api)"
			if strings.HasSuffix(c.base, "/api") {
				fix = "the sidecar reads Conductor's health there, beside its /api: a proxy in front of Conductor must forward /health too"
			}
			return resp, &Error{Code: CodeConductorURLInvalid, Op: opHealth, Status: resp.StatusCode,
				Message: "no Conductor health at " + root + "/health: " + fix}
		}
		if resp.StatusCode != http.StatusOK {
			return resp, client.NewGenericSwaggerError(body, string(body), nil, resp.StatusCode)
		}
		var h struct {
			Healthy bool `json:"healthy"`
		}
		if err := json.Unmarshal(body, &h); err != nil {
			return resp, fmt.Errorf("decode health: %w", err)
		}
		if !h.Healthy {
			return resp, client.NewGenericSwaggerError(body, "not healthy", nil, http.StatusServiceUnavailable)
		}
		if c.apiSeen.Load() {
			return resp, nil
		}
		// Until a call of the API answered, check that the URL is its
		// base: /health answers at the server's root too, where every call
		// of the API is 404 (a URL without /api). A running list of a
		// name no definition has is an empty list on every version.
		var ids []string
		resp, err = c.rawJSON(ctx, c.http, http.MethodGet, c.base+"/workflow/running/"+apiProbeWorkflow+"?version=1", nil, 64<<10, &ids)
		if resp != nil && (resp.StatusCode == http.StatusNotFound || webPage(resp)) {
			hint := ""
			if !strings.HasSuffix(c.base, "/api") {
				hint = " (try " + c.base + "/api)"
			}
			return resp, &Error{Code: CodeConductorURLInvalid, Op: opHealth, Status: resp.StatusCode,
				Message: "the server at " + c.base + " answers /health but not as Conductor's API under it (404, or a web page): give Conductor's API base URL, which ends in /api on a stock server" + hint}
		}
		if err == nil {
			c.apiSeen.Store(true)
		}
		return resp, err
	})
	return err
}

// RegisterTaskDefs creates or updates task definitions (POST
// /metadata/taskdefs, an upsert on 3.21). Registering the same defs again is
// a no-op. The SDK encodes defs with omitempty, so zero values such as
// retryDelaySeconds 0 are dropped and the server's defaults apply; use
// RegisterTaskDefsJSON when they matter.
func (c *Client) RegisterTaskDefs(ctx context.Context, defs []model.TaskDef) error {
	if len(defs) == 0 {
		return nil
	}
	_, err := c.do(ctx, opRegisterTaskDefs, 0, func(ctx context.Context) (*http.Response, error) {
		return c.metadata.RegisterTaskDef(ctx, defs)
	})
	return err
}

// RegisterTaskDefsJSON is RegisterTaskDefs with the JSON list sent as is
// (plan.Compiled.TaskDefsJSON). The SDK's TaskDef drops zero values with
// omitempty (retryDelaySeconds 0 becomes the server's 60 s), so this call
// uses plain net/http.
func (c *Client) RegisterTaskDefsJSON(ctx context.Context, defs []byte) error {
	if !json.Valid(defs) {
		return invalidInput(opRegisterTaskDefs, "task defs are not valid JSON")
	}
	return c.upsert(ctx, func() error {
		_, err := c.do(ctx, opRegisterTaskDefs, 0, func(ctx context.Context) (*http.Response, error) {
			return c.raw(ctx, http.MethodPost, c.base+"/metadata/taskdefs", defs)
		})
		return err
	})
}

// upsert runs register, a write of definitions that Conductor upserts,
// and repeats it while it lost a race on a unique key. Conductor on
// PostgreSQL upserts a definition with an update, then an insert when the
// update found none: two first registrations at once (replicas starting
// runs) race on the insert, and the loser gets PostgreSQL's duplicate key
// error (a 500 for task definitions, an entry of bulkErrorResults for
// workflow definitions). The definition exists then, so the repeat
// updates it.
func (c *Client) upsert(ctx context.Context, register func() error) error {
	err := register()
	for try := 0; try < duplicateKeyRetries && duplicateKey(err); try++ {
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(25+rand.IntN(50)) * time.Millisecond):
		}
		err = register()
	}
	return err
}

// duplicateKeyRetries bounds how often a registration that lost
// Conductor's insert race is repeated.
const duplicateKeyRetries = 3

// duplicateKey reports whether err is Conductor's answer to a write that
// lost a race on a unique key in its PostgreSQL store (PostgreSQL's
// message).
func duplicateKey(err error) bool {
	var e *Error
	return errors.As(err, &e) && strings.Contains(e.Message, "duplicate key value violates unique constraint")
}

// RegisterWorkflowDefJSON is RegisterWorkflowDef with the definition's JSON
// sent as is (plan.Compiled.WorkflowDefJSON), in a one-element list to PUT
// /metadata/workflow. The SDK's WorkflowDef drops restartable=false and
// inline retryDelaySeconds=0 with omitempty (the server then applies true
// and 60 s), so this call uses plain net/http.
func (c *Client) RegisterWorkflowDefJSON(ctx context.Context, def []byte) error {
	if !json.Valid(def) {
		return invalidInput(opRegisterWorkflow, "workflow def is not valid JSON")
	}
	body := make([]byte, 0, len(def)+2)
	body = append(append(append(body, '['), def...), ']')
	return c.upsert(ctx, func() error {
		// Conductor answers 200 with the definitions it could not write
		// in bulkErrorResults.
		var answer bulkAnswer
		_, err := c.do(ctx, opRegisterWorkflow, 0, func(ctx context.Context) (*http.Response, error) {
			return c.rawJSON(ctx, c.http, http.MethodPut, c.base+"/metadata/workflow", body, 1<<20, &answer)
		})
		if err == nil {
			for name, msg := range answer.Errors {
				e := &Error{Code: CodeEngineRejected, Op: opRegisterWorkflow, Status: http.StatusOK,
					Message: "workflow definition " + name + " not written: " + msg}
				if duplicateKey(e) {
					e.Code = CodeEngineUnavailable
				}
				err = e
			}
		}
		return err
	})
}

// RegisterWorkflowDef creates or replaces the workflow definition of
// def.Name and def.Version with PUT /metadata/workflow (an upsert; POST
// fails on an existing version). Callers that must not replace a different
// definition check WorkflowDef first (RegisterPlan does). The SDK encodes
// def with omitempty (restartable=false is dropped); use
// RegisterWorkflowDefJSON when that matters.
func (c *Client) RegisterWorkflowDef(ctx context.Context, def model.WorkflowDef) error {
	if def.Name == "" {
		return invalidInput(opRegisterWorkflow, "workflow def has no name")
	}
	_, err := c.do(ctx, opRegisterWorkflow, 0, func(ctx context.Context) (*http.Response, error) {
		return c.metadata.Update(ctx, []model.WorkflowDef{def})
	})
	return err
}

// WorkflowDef returns the registered workflow definition name/version
// (version 0: the latest), or an error matching ErrNotFound.
func (c *Client) WorkflowDef(ctx context.Context, name string, version int32) (*model.WorkflowDef, error) {
	if name == "" {
		return nil, invalidInput(opGetWorkflowDef, "empty workflow name")
	}
	var def model.WorkflowDef
	_, err := c.do(ctx, opGetWorkflowDef, 0, func(ctx context.Context) (*http.Response, error) {
		var resp *http.Response
		var err error
		opts := &client.MetadataResourceApiGetOpts{}
		if version > 0 {
			opts.Version = optional.NewInt32(version)
		}
		def, resp, err = c.metadata.Get(ctx, name, opts)
		return resp, err
	})
	if err != nil {
		return nil, err
	}
	return &def, nil
}

// StartWorkflow starts a workflow and returns its workflowId. Conductor
// 3.21 has no idempotent start (StartWorkflowRequest.idempotencyKey is
// ignored): every successful call creates a new workflow. Use
// Runs.StartRun for idempotent run starts. An unknown workflow name or
// version gives ErrNotFound.
func (c *Client) StartWorkflow(ctx context.Context, req model.StartWorkflowRequest) (string, error) {
	if req.Name == "" {
		return "", invalidInput(opStartWorkflow, "empty workflow name")
	}
	var id string
	_, err := c.do(ctx, opStartWorkflow, 0, func(ctx context.Context) (*http.Response, error) {
		var resp *http.Response
		var err error
		id, resp, err = c.workflow.StartWorkflowWithRequest(ctx, req)
		if err == nil && strings.TrimSpace(id) == "" {
			err = errors.New("start answered without a workflowId")
		}
		return resp, err
	})
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(id), nil
}

// WorkflowStatus returns the status of workflowID (RUNNING, PAUSED,
// COMPLETED, ...), read without its tasks.
func (c *Client) WorkflowStatus(ctx context.Context, workflowID string) (string, error) {
	wf, err := c.Workflow(ctx, workflowID, false)
	if err != nil {
		return "", err
	}
	return string(wf.Status), nil
}

// Workflow returns the workflow's execution state (status,
// reasonForIncompletion, input, parentWorkflowId, and its tasks when
// includeTasks is set), or
// an error matching ErrNotFound.
func (c *Client) Workflow(ctx context.Context, workflowID string, includeTasks bool) (*model.Workflow, error) {
	if workflowID == "" {
		return nil, invalidInput(opGetWorkflow, "empty workflowId")
	}
	var wf model.Workflow
	_, err := c.do(ctx, opGetWorkflow, 0, func(ctx context.Context) (*http.Response, error) {
		var resp *http.Response
		var err error
		if includeTasks {
			wf, resp, err = c.workflow.GetExecutionStatus(ctx, workflowID,
				&client.WorkflowResourceApiGetExecutionStatusOpts{IncludeTasks: optional.NewBool(true)})
		} else {
			var head workflowHead
			resp, err = c.rawJSON(ctx, c.http, http.MethodGet, c.base+"/workflow/"+url.PathEscape(workflowID)+"?includeTasks=false", nil, maxWorkflowBytes, &head)
			wf = *head.workflow()
		}
		if err == nil && wf.WorkflowId == "" {
			err = errors.New("workflow answer has no workflowId")
		}
		return resp, err
	})
	if err != nil {
		return nil, err
	}
	return &wf, nil
}

// maxWorkflowBytes caps the body of one workflow read without its tasks
// (its input and output, up to 64 KiB each, and its definition).
const maxWorkflowBytes = 16 << 20

// workflowHead is the part of a workflow (read without its tasks) that
// the adapter reads. Most of the answer is the workflow's definition,
// every task of it included; the run watcher reads one workflow per ended
// run, and decoding it whole was 8 % of the sidecar's CPU per step
// (BENCHMARKS.md, "Where a step's CPU goes").
type workflowHead struct {
	WorkflowID            string            `json:"workflowId"`
	ParentWorkflowID      string            `json:"parentWorkflowId"`
	WorkflowName          string            `json:"workflowName"`
	WorkflowVersion       int32             `json:"workflowVersion"`
	Status                string            `json:"status"`
	ReasonForIncompletion string            `json:"reasonForIncompletion"`
	Input                 map[string]any    `json:"input"`
	StartTime             int64             `json:"startTime"`
	EndTime               int64             `json:"endTime"`
	TaskToDomain          map[string]string `json:"taskToDomain"`
	CorrelationID         string            `json:"correlationId"`
}

// WorkflowTasks returns the workflow with its tasks as the adopter reads
// it: the fields of workflowHead and, of each task, those of taskHead
// (the others are left zero); an error matching ErrNotFound for a workflow
// Conductor does not know. Decoding Conductor's whole answer (the
// definition, each task's definition, input and output) was most of a read
// of an adopted run (BENCHMARKS.md, "The adopter's read of a workflow").
func (c *Client) WorkflowTasks(ctx context.Context, workflowID string) (*model.Workflow, error) {
	if workflowID == "" {
		return nil, invalidInput(opGetWorkflow, "empty workflowId")
	}
	var wt workflowTasks
	_, err := c.do(ctx, opGetWorkflow, 0, func(ctx context.Context) (*http.Response, error) {
		wt = workflowTasks{}
		resp, err := c.rawJSON(ctx, c.http, http.MethodGet, c.base+"/workflow/"+url.PathEscape(workflowID)+"?includeTasks=true", nil, maxWorkflowBytes, &wt)
		if err == nil && wt.WorkflowID == "" {
			err = errors.New("workflow answer has no workflowId")
		}
		return resp, err
	})
	if err != nil {
		return nil, err
	}
	return wt.workflow(), nil
}

// workflowTasks is a workflow read with its tasks, as the adopter reads
// it (Client.WorkflowTasks).
type workflowTasks struct {
	workflowHead
	Tasks []taskHead `json:"tasks"`
}

// taskHead is the part of a workflow's task the adopter reads.
type taskHead struct {
	TaskID                string `json:"taskId"`
	TaskType              string `json:"taskType"`
	TaskDefName           string `json:"taskDefName"`
	Status                string `json:"status"`
	ReferenceTaskName     string `json:"referenceTaskName"`
	Iteration             int32  `json:"iteration"`
	RetryCount            int32  `json:"retryCount"`
	Retried               bool   `json:"retried"`
	StartTime             int64  `json:"startTime"`
	EndTime               int64  `json:"endTime"`
	ScheduledTime         int64  `json:"scheduledTime"`
	CallbackAfterSeconds  int64  `json:"callbackAfterSeconds"`
	ReasonForIncompletion string `json:"reasonForIncompletion"`
	SubWorkflowID         string `json:"subWorkflowId"`
	WorkflowInstanceID    string `json:"workflowInstanceId"`
	// WorkflowTask says how many times Conductor retries the task: the
	// adopter tells a try Conductor retries from one that ended the step.
	WorkflowTask *taskRetries `json:"workflowTask"`
}

// taskRetries is the part of a task's workflowTask that says how many
// times Conductor retries it: the workflow task's own retryCount, else its
// definition's.
type taskRetries struct {
	RetryCount     int32 `json:"retryCount"`
	TaskDefinition *struct {
		RetryCount int32 `json:"retryCount"`
	} `json:"taskDefinition"`
}

// model is r as the SDK's WorkflowTask (nil for none).
func (r *taskRetries) model() *model.WorkflowTask {
	if r == nil {
		return nil
	}
	wt := &model.WorkflowTask{RetryCount: r.RetryCount}
	if r.TaskDefinition != nil {
		wt.TaskDefinition = &model.TaskDef{RetryCount: r.TaskDefinition.RetryCount}
	}
	return wt
}

func (h *workflowHead) workflow() *model.Workflow {
	return &model.Workflow{WorkflowId: h.WorkflowID, WorkflowName: h.WorkflowName, WorkflowVersion: h.WorkflowVersion,
		Status: model.WorkflowStatus(h.Status), ReasonForIncompletion: h.ReasonForIncompletion, Input: h.Input,
		StartTime: h.StartTime, EndTime: h.EndTime, TaskToDomain: h.TaskToDomain, CorrelationId: h.CorrelationID,
		ParentWorkflowId: h.ParentWorkflowID}
}

func (wt *workflowTasks) workflow() *model.Workflow {
	wf := wt.workflowHead.workflow()
	wf.Tasks = make([]model.Task, len(wt.Tasks))
	for i, t := range wt.Tasks {
		wf.Tasks[i] = model.Task{TaskId: t.TaskID, TaskType: t.TaskType, TaskDefName: t.TaskDefName, Status: model.TaskResultStatus(t.Status),
			ReferenceTaskName: t.ReferenceTaskName, Iteration: t.Iteration, RetryCount: t.RetryCount, Retried: t.Retried,
			StartTime: t.StartTime, EndTime: t.EndTime, ScheduledTime: t.ScheduledTime, CallbackAfterSeconds: t.CallbackAfterSeconds,
			ReasonForIncompletion: t.ReasonForIncompletion,
			SubWorkflowId:         t.SubWorkflowID, WorkflowInstanceId: t.WorkflowInstanceID, WorkflowTask: t.WorkflowTask.model()}
	}
	return wf
}

// Pause pauses a workflow: Conductor stops scheduling its next tasks, but
// tasks already scheduled are still handed out by polls (see
// deploy/local/README.md). Pausing a PAUSED workflow is a no-op (200). A
// workflow that has ended gives ErrConflict, an unknown one ErrNotFound.
func (c *Client) Pause(ctx context.Context, workflowID string) error {
	if workflowID == "" {
		return invalidInput(opPause, "empty workflowId")
	}
	_, err := c.do(ctx, opPause, 0, func(ctx context.Context) (*http.Response, error) {
		return c.workflow.PauseWorkflow(ctx, workflowID)
	})
	return err
}

// Decide asks Conductor to evaluate a workflow now (PUT
// /workflow/decide/{workflowId}), what its decider queue does at the
// workflow's next sweep. The watcher uses it for a workflow left RUNNING
// with every task terminal.
func (c *Client) Decide(ctx context.Context, workflowID string) error {
	if workflowID == "" {
		return invalidInput(opDecide, "empty workflowId")
	}
	_, err := c.do(ctx, opDecide, 0, func(ctx context.Context) (*http.Response, error) {
		return c.workflow.Decide(ctx, workflowID)
	})
	return err
}

// Resume resumes a PAUSED workflow. Conductor 3.21 answers 500 ("The
// workflow ... is not PAUSED so cannot resume. Current status is S") for a
// workflow in any other state: Resume returns ErrConflict with
// Error.EngineStatus set to S. For another 500 it reads the workflow and
// returns ErrConflict when it is not PAUSED, and ErrEngineUnavailable only
// if it is (a real server error) or cannot be read. The refusal's own
// words decide first: a concurrent pause may have paused the workflow by
// the time it is read, and the refusal was still an answer. An unknown
// workflow gives ErrNotFound.
func (c *Client) Resume(ctx context.Context, workflowID string) error {
	if workflowID == "" {
		return invalidInput(opResume, "empty workflowId")
	}
	_, err := c.do(ctx, opResume, 0, func(ctx context.Context) (*http.Response, error) {
		resp, err := c.workflow.ResumeWorkflow(ctx, workflowID)
		var se client.GenericSwaggerError
		if errors.As(err, &se) && se.StatusCode() == http.StatusInternalServerError {
			msg := errorMessage(se.Body())
			if status, ok := notPausedStatus(msg); ok {
				return resp, &Error{Code: CodeConflict, Op: opResume, Status: se.StatusCode(), Message: msg, EngineStatus: status}
			}
			if wf, gerr := c.Workflow(ctx, workflowID, false); gerr == nil && wf.Status != model.PausedWorkflow {
				return resp, &Error{Code: CodeConflict, Op: opResume, Status: se.StatusCode(),
					Message: errorMessage(se.Body()), EngineStatus: string(wf.Status)}
			}
		}
		return resp, err
	})
	return err
}

// notPausedStatus returns the status Conductor names in its refusal to
// resume a workflow that is not paused ("... is not PAUSED so cannot
// resume. Current status is RUNNING"), and whether msg is that refusal.
func notPausedStatus(msg string) (string, bool) {
	const refusal, current = "is not PAUSED so cannot resume", "Current status is "
	if !strings.Contains(msg, refusal) {
		return "", false
	}
	_, status, ok := strings.Cut(msg, current)
	status = strings.TrimRight(strings.TrimSpace(status), ".")
	if !ok || status == "" || strings.ContainsAny(status, " \n") {
		return "", true // refused, status not named
	}
	return status, true
}

// Terminate terminates a workflow with reason (recorded as its
// reasonForIncompletion); its non-terminal tasks become CANCELED.
// Terminating a workflow that has already ended is a no-op on 3.21 (200). An
// unknown workflow gives ErrNotFound.
func (c *Client) Terminate(ctx context.Context, workflowID, reason string) error {
	if workflowID == "" {
		return invalidInput(opTerminate, "empty workflowId")
	}
	_, err := c.do(ctx, opTerminate, 0, func(ctx context.Context) (*http.Response, error) {
		opts := &client.WorkflowResourceApiTerminateOpts{}
		if reason != "" {
			opts.Reason = optional.NewString(reason)
		}
		return c.workflow.Terminate(ctx, workflowID, opts)
	})
	return err
}

// RemoveWorkflow deletes a workflow and its tasks from Conductor's store
// (DELETE /workflow/{id}/remove?archiveWorkflow=false): Conductor keeps
// nothing of it. An unknown workflow (removed before) gives ErrNotFound.
func (c *Client) RemoveWorkflow(ctx context.Context, workflowID string) error {
	if workflowID == "" {
		return invalidInput(opRemoveWorkflow, "empty workflowId")
	}
	_, err := c.do(ctx, opRemoveWorkflow, 0, func(ctx context.Context) (*http.Response, error) {
		return c.workflow.Delete(ctx, workflowID, &client.WorkflowResourceApiDeleteOpts{ArchiveWorkflow: optional.NewBool(false)})
	})
	return err
}

// Retry retries the last failed task of a FAILED (or TIMED_OUT, TERMINATED)
// workflow; Conductor answers 204. On a workflow that is still running
// Conductor 3.21 answers 404 ("Workflow is still running"); Retry then reads
// the workflow and returns ErrConflict with Error.EngineStatus set, keeping
// ErrNotFound for an unknown workflow.
func (c *Client) Retry(ctx context.Context, workflowID string) error {
	if workflowID == "" {
		return invalidInput(opRetry, "empty workflowId")
	}
	_, err := c.do(ctx, opRetry, 0, func(ctx context.Context) (*http.Response, error) {
		resp, err := c.workflow.Retry(ctx, workflowID, nil)
		var se client.GenericSwaggerError
		if errors.As(err, &se) && se.StatusCode() == http.StatusNotFound {
			if wf, gerr := c.Workflow(ctx, workflowID, false); gerr == nil {
				return resp, &Error{Code: CodeConflict, Op: opRetry, Status: se.StatusCode(),
					Message: errorMessage(se.Body()), EngineStatus: string(wf.Status)}
			}
		}
		return resp, err
	})
	return err
}

// RunningWorkflows lists the ids of the RUNNING and PAUSED workflows of
// name/version (GET /workflow/running/{name}; it works without indexing).
func (c *Client) RunningWorkflows(ctx context.Context, name string, version int32) ([]string, error) {
	if name == "" {
		return nil, invalidInput(opRunningWorkflows, "empty workflow name")
	}
	var ids []string
	_, err := c.do(ctx, opRunningWorkflows, 0, func(ctx context.Context) (*http.Response, error) {
		var resp *http.Response
		var err error
		ids, resp, err = c.workflow.GetRunningWorkflow(ctx, name,
			&client.WorkflowResourceApiGetRunningWorkflowOpts{Version: optional.NewInt32(version)})
		return resp, err
	})
	return ids, err
}

// BatchPoll long-polls up to count tasks of taskType for workerID, waiting
// at most timeout (capped at 20 s) for the first one. No task is an empty
// slice and no error. The polled tasks are IN_PROGRESS in Conductor and
// must be answered with UpdateTask.
func (c *Client) BatchPoll(ctx context.Context, taskType, workerID string, count int, timeout time.Duration) ([]model.Task, error) {
	return c.BatchPollDomain(ctx, taskType, workerID, "", count, timeout)
}

// BatchPollDomain is BatchPoll in a task domain (empty: no domain).
func (c *Client) BatchPollDomain(ctx context.Context, taskType, workerID, domain string, count int, timeout time.Duration) ([]model.Task, error) {
	if taskType == "" || workerID == "" {
		// Conductor answers an empty poll without workerid as if no task
		// were queued; refuse it instead of polling forever.
		return nil, invalidInput(opBatchPoll, "taskType and workerId are required")
	}
	count = min(max(count, 1), 1000)
	timeout = min(max(timeout, 0), maxPollTimeout)
	q := url.Values{}
	q.Set("workerid", workerID)
	q.Set("count", strconv.Itoa(count))
	q.Set("timeout", strconv.FormatInt(timeout.Milliseconds(), 10))
	if domain != "" {
		q.Set("domain", domain)
	}
	target := c.base + "/tasks/poll/batch/" + url.PathEscape(taskType) + "?" + q.Encode()
	var polled []PolledTask
	_, err := c.do(ctx, opBatchPoll, timeout, func(ctx context.Context) (*http.Response, error) {
		return c.rawJSON(ctx, c.poll, http.MethodGet, target, nil, maxPollBytes, &polled)
	})
	if err != nil {
		return nil, err
	}
	tasks := make([]model.Task, len(polled))
	for i := range polled {
		tasks[i] = *polled[i].Task()
	}
	return tasks, nil
}

// maxPollBytes caps the body of one batch poll's answer (1,000 tasks of
// up to 64 KiB of input each).
const maxPollBytes = 64 << 20

// PolledTask is the part of a polled task the workers and the task proxy
// read. A task's JSON is mostly its workflowTask and taskDefinition (the
// whole task definition, input templates included); decoding only these
// fields into a model.Task was two thirds of a poll's client CPU less
// (BENCHMARKS.md).
type PolledTask struct {
	TaskID             string         `json:"taskId"`
	TaskDefName        string         `json:"taskDefName"`
	TaskType           string         `json:"taskType"`
	Status             string         `json:"status"`
	ReferenceTaskName  string         `json:"referenceTaskName"`
	WorkflowInstanceID string         `json:"workflowInstanceId"`
	WorkerID           string         `json:"workerId"`
	Domain             string         `json:"domain"`
	InputData          map[string]any `json:"inputData"`
	// OutputData is empty on a task no worker has answered yet; a task
	// handed back may carry what the worker kept on it.
	OutputData             map[string]any `json:"outputData"`
	RetryCount             int32          `json:"retryCount"`
	PollCount              int32          `json:"pollCount"`
	ScheduledTime          int64          `json:"scheduledTime"`
	ResponseTimeoutSeconds int64          `json:"responseTimeoutSeconds"`
	// WorkflowType is the name of the task's workflow definition: the
	// task proxy tells an adopted workflow's task by it.
	WorkflowType string `json:"workflowType"`
	// Iteration is the DO_WHILE iteration of a task inside a loop (0
	// outside one).
	Iteration int32 `json:"iteration"`
	// WorkflowTask carries how many times Conductor retries the task (the
	// engine tries of an adopted workflow's task).
	WorkflowTask *taskRetries `json:"workflowTask"`
}

// Task is p as a model.Task.
func (p *PolledTask) Task() *model.Task {
	t := &model.Task{TaskId: p.TaskID, TaskDefName: p.TaskDefName, TaskType: p.TaskType, Status: model.TaskResultStatus(p.Status),
		ReferenceTaskName: p.ReferenceTaskName, WorkflowInstanceId: p.WorkflowInstanceID, WorkerId: p.WorkerID, Domain: p.Domain,
		InputData: p.InputData, OutputData: p.OutputData, RetryCount: p.RetryCount, PollCount: p.PollCount,
		ScheduledTime: p.ScheduledTime, ResponseTimeoutSeconds: p.ResponseTimeoutSeconds,
		WorkflowType: p.WorkflowType, Iteration: p.Iteration, WorkflowTask: p.WorkflowTask.model()}
	return t
}

// DomainPoller is a Client whose BatchPoll polls one task domain (the
// domain a Runs with that TaskDomain starts its tasks in).
type DomainPoller struct {
	*Client
	Domain string
}

// BatchPoll is Client.BatchPollDomain in d.Domain.
func (d DomainPoller) BatchPoll(ctx context.Context, taskType, workerID string, count int, timeout time.Duration) ([]model.Task, error) {
	return d.BatchPollDomain(ctx, taskType, workerID, d.Domain, count, timeout)
}

// UpdateTask reports a task's result (status COMPLETED, FAILED,
// FAILED_WITH_TERMINAL_ERROR or IN_PROGRESS with callbackAfterSeconds to
// hand it back; outputData, reasonForIncompletion, logs). An unknown task or
// workflow gives ErrNotFound. Conductor 3.21 answers 200 and changes nothing
// when the task has already ended (CANCELED by a terminate, TIMED_OUT): check
// Task afterwards if that matters.
func (c *Client) UpdateTask(ctx context.Context, r *model.TaskResult) error {
	if r == nil || r.TaskId == "" || r.WorkflowInstanceId == "" {
		return invalidInput(opUpdateTask, "task result needs taskId and workflowInstanceId")
	}
	_, err := c.do(ctx, opUpdateTask, 0, func(ctx context.Context) (*http.Response, error) {
		_, resp, err := c.tasks.UpdateTask(ctx, r)
		return resp, err
	})
	return err
}

// Task returns a task by id, or ErrNotFound for an unknown id: Conductor
// 3.21 answers that with 204 and no body, 3.32 with 404.
func (c *Client) Task(ctx context.Context, taskID string) (*model.Task, error) {
	if taskID == "" {
		return nil, invalidInput(opGetTask, "empty taskId")
	}
	var t model.Task
	_, err := c.do(ctx, opGetTask, 0, func(ctx context.Context) (*http.Response, error) {
		var resp *http.Response
		var err error
		t, resp, err = c.tasks.GetTask(ctx, taskID)
		if err == nil && resp != nil && (resp.StatusCode == http.StatusNoContent || t.TaskId == "") {
			return resp, &Error{Code: CodeNotFound, Op: opGetTask, Status: resp.StatusCode, Message: "no such task: " + taskID}
		}
		return resp, err
	})
	if err != nil {
		return nil, err
	}
	return &t, nil
}
