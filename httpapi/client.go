package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/conductor-sidecar/sidecar/errcode"
)

// Client calls a sidecar's control API.
type Client struct {
	// BaseURL is the sidecar's address, e.g. http://127.0.0.1:8787.
	BaseURL string
	HTTP    *http.Client
	// IdempotencyKey, when set, is sent with every control call (pause,
	// resume, cancel, retry): a repeated call with the same key gets the
	// first answer back instead of acting again.
	IdempotencyKey string
	// Token, when set, is sent as "Authorization: Bearer <Token>".
	Token string
}

// NewClient returns a Client for baseURL with a 30s request timeout.
func NewClient(baseURL string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), HTTP: &http.Client{Timeout: 30 * time.Second}}
}

// Error is an error answer of the API.
type Error struct {
	Status   int             `json:"-"`
	Code     string          `json:"code"`
	Message  string          `json:"message"`
	Field    string          `json:"field,omitempty"`
	Problems json.RawMessage `json:"problems,omitempty"`
}

// foreignCode prefixes the code of an answer that is not the API's own (no
// error body of ours: another server, a gateway's page): HTTP_<status>.
const foreignCode = "HTTP_"

// Foreign reports whether the answer was not the sidecar API's own (its
// error bodies carry a code): another server at the address, or a
// gateway's page.
func (e *Error) Foreign() bool { return strings.HasPrefix(e.Code, foreignCode) }

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s (HTTP %d): %s", e.Code, e.Status, e.Message)
	if len(e.Problems) == 0 {
		return msg
	}
	var problems []struct{ Code, Path, Message string }
	if json.Unmarshal(e.Problems, &problems) != nil {
		return msg + "\n" + string(e.Problems)
	}
	// One a line, after the message, which says the first already.
	for _, p := range problems {
		line := p.Code + ": " + p.Message
		if p.Path != "" {
			line = p.Path + ": " + line
		}
		if !strings.Contains(e.Message, line) {
			msg += "\n  " + line
		}
	}
	return msg
}

// ErrorCode returns the machine code.
func (e *Error) ErrorCode() string { return e.Code }

// ErrorKind returns the kind the answer's status stands for (the inverse
// of the server's kind -> status table).
func (e *Error) ErrorKind() errcode.Kind { return kindOfStatus(e.Status) }

// Is matches an *Error with the same code, and the answer's kind.
func (e *Error) Is(target error) bool { return errcode.Match(e, target) }

// Start starts a run (idempotent on the request's key).
func (c *Client) Start(ctx context.Context, req StartRequest) (*Started, error) {
	var out Started
	return &out, c.do(ctx, http.MethodPost, "/v1/runs", req, &out)
}

// ListRuns lists runs (GET /v1/runs) with the query q: filters, limit,
// continue, or watch with revision and timeoutSeconds.
func (c *Client) ListRuns(ctx context.Context, q url.Values) (*RunList, error) {
	var out RunList
	return &out, c.do(ctx, http.MethodGet, "/v1/runs?"+q.Encode(), nil, &out)
}

// Bulk acts on the runs req selects: action is pause, resume or cancel
// (POST /v1/runs:<action>).
func (c *Client) Bulk(ctx context.Context, action string, req BulkRequest) (*BulkResult, error) {
	var out BulkResult
	return &out, c.do(ctx, http.MethodPost, "/v1/runs:"+action, req, &out)
}

// Bus returns the event bus's sinks (GET /v1/bus).
func (c *Client) Bus(ctx context.Context) (*BusStatus, error) {
	var out BusStatus
	return &out, c.do(ctx, http.MethodGet, "/v1/bus", nil, &out)
}

// DeadLetters lists dead letters (GET /v1/bus/deadletters) with the query
// q: sink, after, limit.
func (c *Client) DeadLetters(ctx context.Context, q url.Values) (*DeadLetterList, error) {
	var out DeadLetterList
	return &out, c.do(ctx, http.MethodGet, "/v1/bus/deadletters?"+q.Encode(), nil, &out)
}

// Replay delivers dead letters again (POST /v1/bus/deadletters:replay).
func (c *Client) Replay(ctx context.Context, req ReplayRequest) (*ReplayAnswer, error) {
	var out ReplayAnswer
	return &out, c.do(ctx, http.MethodPost, "/v1/bus/deadletters:replay", req, &out)
}

// Run returns a run's view.
func (c *Client) Run(ctx context.Context, runID string) (*RunView, error) {
	var out RunView
	return &out, c.do(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(runID), nil, &out)
}

// Pause pauses a run (draining); timeoutSeconds 0 uses the default.
func (c *Client) Pause(ctx context.Context, runID string, timeoutSeconds int64, reason string) (*RunView, error) {
	return c.PauseWith(ctx, runID, PauseOptions{TimeoutSeconds: timeoutSeconds, Reason: reason})
}

// PauseOptions are a pause's optional fields; the zero value pauses with
// the sidecar's default drain timeout and no scheduled resume.
type PauseOptions struct {
	TimeoutSeconds int64
	Reason         string
	// ResumeAt, or ResumeAfter from the sidecar's clock, schedules the
	// resume (at most one of them).
	ResumeAt    time.Time
	ResumeAfter time.Duration
}

// PauseWith pauses a run with o.
func (c *Client) PauseWith(ctx context.Context, runID string, o PauseOptions) (*RunView, error) {
	var out RunView
	body := map[string]any{}
	if o.TimeoutSeconds > 0 {
		body["timeoutSeconds"] = o.TimeoutSeconds
	}
	if o.Reason != "" {
		body["reason"] = o.Reason
	}
	if !o.ResumeAt.IsZero() {
		body["resumeAt"] = o.ResumeAt.UTC().Format(time.RFC3339Nano)
	}
	if o.ResumeAfter > 0 {
		body["resumeAfterSeconds"] = int64(o.ResumeAfter / time.Second)
	}
	return &out, c.do(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(runID)+"/pause", body, &out)
}

// Resume resumes a paused run.
func (c *Client) Resume(ctx context.Context, runID string) (*RunView, error) {
	return c.ResumeWith(ctx, runID, "")
}

// ResumeWith resumes a paused run, recording reason (when set) in its
// RunResumed.
func (c *Client) ResumeWith(ctx context.Context, runID, reason string) (*RunView, error) {
	var out RunView
	body := map[string]any{}
	if reason != "" {
		body["reason"] = reason
	}
	return &out, c.do(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(runID)+"/resume", body, &out)
}

// Cancel cancels a run.
func (c *Client) Cancel(ctx context.Context, runID, reason string) (*RunView, error) {
	var out RunView
	body := map[string]any{}
	if reason != "" {
		body["reason"] = reason
	}
	return &out, c.do(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(runID)+"/cancel", body, &out)
}

// RetryStep reruns a step held after a failure (onStepFailure: pause) as
// its next logical attempt, once the run is resumed.
func (c *Client) RetryStep(ctx context.Context, runID, stepID, reason string) (*RunView, error) {
	var out RunView
	body := map[string]any{}
	if reason != "" {
		body["reason"] = reason
	}
	return &out, c.do(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(runID)+"/steps/"+url.PathEscape(stepID)+"/retry", body, &out)
}

// Events returns a page of a run's events after afterSeq.
func (c *Client) Events(ctx context.Context, runID string, afterSeq int64, limit int) (*EventsPage, error) {
	q := url.Values{"afterSeq": {strconv.FormatInt(afterSeq, 10)}}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out EventsPage
	return &out, c.do(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(runID)+"/events?"+q.Encode(), nil, &out)
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.IdempotencyKey != "" && method == http.MethodPost && path != "/v1/runs" {
		req.Header.Set(IdempotencyKeyHeader, c.IdempotencyKey)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("sidecar at %s: %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(data, e) != nil || e.Code == "" {
			body := strings.TrimSpace(string(data))
			if len(body) > 200 {
				body = body[:200] + "..."
			}
			e.Code, e.Message = foreignCode+strconv.Itoa(resp.StatusCode), "not an answer of the sidecar's API (is the server address right?): "+body
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return err
	}
	if v, ok := out.(*RunView); ok {
		v.Replayed = resp.Header.Get(ReplayedHeader) == "true"
	}
	return nil
}
