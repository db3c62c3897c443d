package httpapi

import (
	"errors"
	"net/http"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// Machine codes of the API's own errors. The codes of other packages'
// errors pass through unchanged (STORE_UNAVAILABLE, INVALID_TRANSITION,
// ENGINE_UNAVAILABLE, ADMISSION_REJECTED, ...), with the status of their
// kind (statusOf).
const (
	// CodeBadRequest: the request is malformed (body, parameters,
	// headers; 415 for a body that is not application/json); nothing was
	// changed. The answer's problems locate every
	// problem of a body by its JSON path.
	CodeBadRequest = "BAD_REQUEST"
	// CodeRunNotFound: no such run, or none the caller's scope may see.
	CodeRunNotFound = drain.CodeRunNotFound
	// CodeRunArchived: the run left hot state and is read from the
	// archive: it can be read (status, events) but not steered (409).
	CodeRunArchived = "RUN_ARCHIVED"
	// CodePlanInvalid: the plan of a start is invalid; problems lists
	// every problem with its code, path and stepId.
	CodePlanInvalid = "PLAN_INVALID"
	// CodeInternal: a fault of the sidecar; the log has the details.
	CodeInternal = "INTERNAL"
	// CodeNotReady: the sidecar cannot serve the request now (/readyz).
	CodeNotReady = "NOT_READY"
	// CodeSessionsFull: the console's session table is full of other
	// principals' sessions; a login is refused until one ends (503).
	CodeSessionsFull = "SESSIONS_FULL"
	// CodeTooManyRequests: the principal has
	// Options.MaxRequestsPerPrincipal writing requests in progress; a
	// further one is answered 429 with Retry-After.
	CodeTooManyRequests = "TOO_MANY_REQUESTS"
	// CodeTooManyConnections: the listener holds MaxConnections open
	// connections; a further one is answered 503 and closed.
	CodeTooManyConnections = "TOO_MANY_CONNECTIONS"
	// CodeNotLive: the process cannot recover by itself; restart it
	// (/healthz).
	CodeNotLive = "NOT_LIVE"
	// CodeUnavailable: Conductor did not answer.
	CodeUnavailable = adapter.CodeEngineUnavailable
	// CodeEngineConflict: the action is recorded, but Conductor refused
	// it because the workflow is not in the state it needs; the message
	// names the workflow's status (409).
	CodeEngineConflict = "ENGINE_CONFLICT"
	// CodePlanConflict: the plan version exists with other content.
	CodePlanConflict = "PLAN_VERSION_CONFLICT"
	// CodeKeyReused: an Idempotency-Key was first used for another
	// request (another run, action, step or body).
	CodeKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// CodeInProgress: a request with the same Idempotency-Key is being
	// answered.
	CodeInProgress = "REQUEST_IN_PROGRESS"
	// CodeUnauthenticated: no valid credentials (401).
	CodeUnauthenticated = "UNAUTHENTICATED"
	// CodeForbidden: the credentials lack the role the route needs (403).
	CodeForbidden = "FORBIDDEN"
	// CodeCrossOrigin: a browser's cross-origin request (Origin, or
	// Sec-Fetch-Site), refused whatever it carries (403).
	CodeCrossOrigin = "CROSS_ORIGIN_REFUSED"
	// CodeHostRefused: the request's Host is not a loopback name, an IP
	// address or an allowed host (DNS rebinding; 403).
	CodeHostRefused = "HOST_NOT_ALLOWED"
	// CodeMethodNotAllowed: the route exists with other methods (405,
	// with Allow).
	CodeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	// CodeNotFound: no such endpoint.
	CodeNotFound = "NOT_FOUND"
	// CodeCSRF: a console session's request that changes something came
	// without the session's CSRF token (403).
	CodeCSRF = "CSRF_TOKEN_INVALID"
)

// errBadBody matches the errors of plan.DecodeJSON decoding a request
// body with the code BAD_REQUEST.
var errBadBody = &plan.ValidationError{Code: CodeBadRequest}

// ErrUnauthenticated is returned by an Authenticator for a request without
// valid credentials.
var ErrUnauthenticated = errors.New("httpapi: no valid credentials")

// statusOf is the API's status for each kind of coded error; an error of
// kind errcode.Internal, or with no code, is 500 INTERNAL.
var statusOf = map[errcode.Kind]int{
	errcode.Invalid:     http.StatusBadRequest,
	errcode.NotFound:    http.StatusNotFound,
	errcode.Conflict:    http.StatusConflict,
	errcode.Forbidden:   http.StatusForbidden,
	errcode.Rejected:    http.StatusTooManyRequests,
	errcode.Upstream:    http.StatusBadGateway,
	errcode.Unavailable: http.StatusServiceUnavailable,
}

// kindOfStatus is the kind an answer's status stands for: statusOf read
// backwards, errcode.Internal for any other status.
func kindOfStatus(status int) errcode.Kind {
	for k, st := range statusOf {
		if st == status {
			return k
		}
	}
	return errcode.Internal
}

// writeRefused answers an error with a stream that refuses every write
// (STORE_WRITE_REFUSED, 503) in its tree, whatever wrapped it
// (RUN_REGISTRY_UNAVAILABLE, STORE_UNAVAILABLE): its message names the
// stream and the fix, which retrying does not bring. Nil for any other
// error.
func writeRefused(err error) *apiError {
	var r *natsstore.WriteRefusedError
	if !errors.As(err, &r) {
		return nil
	}
	return &apiError{status: statusOf[r.ErrorKind()], Code: r.ErrorCode(), Message: r.Message()}
}
