package exec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/taskworkers"
	"github.com/conductor-sidecar/sidecar/taskworkers/secrets"
)

// DefaultRetryableStatus is the statuses whose failure is retryable when a
// spec sets no RetryableStatus.
var DefaultRetryableStatus = []int{408, 429, 500, 502, 503, 504}

// tokenRe matches an HTTP token (RFC 9110 §5.6.2): methods, header names.
var tokenRe = regexp.MustCompile("^[!#$%&'*+\\-.^_`|~0-9A-Za-z]+$")

// httpExecutor sends one request. ${secret:NAME} in the URL, the header
// values and the body is replaced by the value of the step's secret NAME;
// everything logged or stored uses the spec's text (placeholders, not
// values) or is redacted.
//
// Destinations: every connection, a redirect's included, goes through a
// guarded dialer (newGuardedClient): loopback, link-local, private,
// unspecified, multicast and reserved addresses need an Options.HTTPAllow
// entry, Options.HTTPDeny addresses are never reached, and proxies from
// the environment are not used.
type httpExecutor struct {
	base
	client *http.Client
}

func (e *httpExecutor) Execute(ctx context.Context, x taskworkers.Execution) (taskworkers.Result, error) {
	if r, ok := checkOnly(x.Spec, plan.ExecutorHTTP, "method", "url", "headers", "body", "retryableStatus"); !ok {
		return r, nil
	}
	red := secrets.NewRedactorMap(x.Secrets)
	req, retryable, r, ok := e.request(x, red)
	if !ok {
		return r, nil
	}
	log := e.logger(x).With(zap.String("method", req.Method), zap.String("url", x.Spec.URL))
	if ctx.Err() != nil {
		return taskworkers.Result{Err: ctxError(ctx, red, "the request was not sent")}, nil
	}
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if _, has := ctx.Deadline(); !has {
		rctx, cancel = context.WithTimeout(ctx, e.opts.HTTPTimeout)
	}
	defer cancel()
	req = req.WithContext(rctx)

	started := time.Now()
	resp, err := e.client.Do(req)
	if err != nil {
		took := time.Since(started)
		res := taskworkers.Result{Output: map[string]any{"durationMs": took.Milliseconds()}}
		// A *url.Error quotes the request URL, secrets substituted: quote
		// the spec's URL (placeholders) instead. Redact anyway.
		msg := err.Error()
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			msg = fmt.Sprintf("%s %q: %s", ue.Op, x.Spec.URL, ue.Err)
		}
		msg = red.String(msg)
		switch {
		case errors.Is(err, ErrDestinationForbidden):
			res.Err = &statestore.StepError{Code: CodeHTTPDestinationForbidden, Message: msg, Retryable: false}
		case ctx.Err() != nil:
			res.Err = ctxError(ctx, red, "no response: "+msg)
		case errors.Is(rctx.Err(), context.DeadlineExceeded):
			res.Err = &statestore.StepError{Code: CodeHTTPRequestFailed, Retryable: true,
				Message: fmt.Sprintf("no response within %s (the default request timeout; a step timeout replaces it)", e.opts.HTTPTimeout)}
		default:
			res.Err = &statestore.StepError{Code: CodeHTTPRequestFailed, Message: msg, Retryable: true}
		}
		log.Warn("http request failed", zap.String("code", res.Err.Code), zap.String("error", res.Err.Message), zap.Duration("took", took))
		return res, nil
	}
	body := newCapture(e.opts.MaxCaptureBytes)
	_, readErr := io.Copy(body, resp.Body)
	resp.Body.Close()
	took := time.Since(started)
	data, total, trunc := body.bytes(red)
	out := map[string]any{"status": resp.StatusCode, "responseBytes": total, "durationMs": took.Milliseconds()}
	if trunc {
		out["responseTruncated"] = true
	}
	res := taskworkers.Result{Output: out}
	switch {
	case readErr != nil && ctx.Err() != nil:
		res.Err = ctxError(ctx, red, fmt.Sprintf("response %d body read interrupted after %d bytes", resp.StatusCode, total))
	case readErr != nil:
		res.Err = &statestore.StepError{Code: CodeHTTPRequestFailed, Retryable: true,
			Message: fmt.Sprintf("response %d: reading the body failed after %d bytes: %s", resp.StatusCode, total, red.String(readErr.Error()))}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		res.Err = &statestore.StepError{Code: CodeHTTPStatusPrefix + strconv.Itoa(resp.StatusCode),
			Message:   fmt.Sprintf("%s %s answered %s", req.Method, x.Spec.URL, red.String(resp.Status)),
			Retryable: slices.Contains(retryable, resp.StatusCode)}
	}
	log.Info("http request done", zap.Int("status", resp.StatusCode), zap.Int64("responseBytes", total), zap.Duration("took", took))
	ref, ok, err := e.store(ctx, x, KindHTTPResponse, data)
	if err != nil {
		log.Error("could not store the response body", zap.Error(err))
		return res, err
	}
	if ok {
		res.Artifacts = append(res.Artifacts, ref)
	}
	return res, nil
}

// request validates the spec and builds the request with the secrets
// substituted. Errors name fields and secrets, never values.
func (e *httpExecutor) request(x taskworkers.Execution, red *secrets.Redactor) (*http.Request, []int, taskworkers.Result, bool) {
	s := x.Spec
	method := strings.ToUpper(s.Method)
	if method == "" {
		method = http.MethodGet
	}
	if !tokenRe.MatchString(method) {
		return nil, nil, specInvalid("method %q is not an HTTP method", s.Method), false
	}
	if s.URL == "" {
		return nil, nil, specInvalid("http needs a url"), false
	}
	raw, r, ok := substitute("url", s.URL, x.Secrets)
	if !ok {
		return nil, nil, r, false
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, specInvalid("url %q does not parse: %s", s.URL, red.String(err.Error())), false
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, nil, specInvalid("url %q must be absolute http:// or https://", s.URL), false
	}
	retryable := DefaultRetryableStatus
	if len(s.RetryableStatus) > 0 {
		for _, st := range s.RetryableStatus {
			if st < 100 || st > 599 {
				return nil, nil, specInvalid("retryableStatus %d is not an HTTP status", st), false
			}
		}
		retryable = s.RetryableStatus
	}
	body, r, ok := substitute("body", s.Body, x.Secrets)
	if !ok {
		return nil, nil, r, false
	}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u.String(), rd)
	if err != nil {
		return nil, nil, specInvalid("request: %s", red.String(err.Error())), false
	}
	if x.Traceparent != "" {
		// The step attempt's trace context; a traceparent of the spec's
		// own headers replaces it.
		req.Header.Set("traceparent", x.Traceparent)
	}
	for _, name := range slices.Sorted(maps.Keys(s.Headers)) {
		if !tokenRe.MatchString(name) {
			return nil, nil, specInvalid("header name %q is not an HTTP token", name), false
		}
		v, r, ok := substitute("header "+name, s.Headers[name], x.Secrets)
		if !ok {
			return nil, nil, r, false
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return nil, nil, specInvalid("header %s contains CR, LF or NUL (after secret substitution)", name), false
		}
		if strings.EqualFold(name, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(name, v)
	}
	return req, retryable, taskworkers.Result{}, true
}

// substitute expands the ${secret:NAME} placeholders of s with
// plan.ExpandPlaceholders, the one expander (the plan compiler checks the
// same syntax); an error names the field, never a value.
func substitute(field, s string, values map[string]string) (string, taskworkers.Result, bool) {
	out, err := plan.ExpandPlaceholders(s, values)
	if err != nil {
		return "", specInvalid("%s %v", field, err), false
	}
	return out, taskworkers.Result{}, true
}
