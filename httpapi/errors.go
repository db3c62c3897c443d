package httpapi

import (
	"errors"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/drain"
)

// Machine codes of the API's own errors. statestore, adapter and plan
// codes pass through unchanged (STORE_UNAVAILABLE, STORE_DAMAGED,
// INVALID_TRANSITION, SCHEMA_VALIDATION_FAILED, ...).
const (
	// CodeBadRequest: the request is malformed (body, parameters,
	// headers; 415 for a body that is not application/json); nothing was
	// changed. The answer's problems locate every
	// problem of a body by its JSON path.
	CodeBadRequest = "BAD_REQUEST"
	// CodeRunNotFound: no such run, or none the caller's scope may see.
	CodeRunNotFound = drain.CodeRunNotFound
	// CodePlanInvalid: the plan of a start is invalid; problems lists
	// every problem with its code, path and stepId.
	CodePlanInvalid = "PLAN_INVALID"
	// CodeInternal: a fault of the sidecar; the log has the details.
	CodeInternal = "INTERNAL"
	// CodeNotReady: the sidecar cannot serve the request now (/readyz).
	CodeNotReady = "NOT_READY"
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
)

// ErrUnauthenticated is returned by an Authenticator for a request without
// valid credentials.
var ErrUnauthenticated = errors.New("httpapi: no valid credentials")
