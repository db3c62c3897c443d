package proxy

// Error codes the proxy itself answers with, as {"status", "code",
// "message", "retryable"}. Any other answer is Conductor's, relayed.
const (
	// CodeUnauthorized: Options.Tokens is set and the request has none of them.
	CodeUnauthorized = "PROXY_UNAUTHORIZED"
	// CodeRouteNotForwarded: the request is not one of the calls workers
	// make (routes.go) and Options.ForwardAll is off; nothing was sent to
	// Conductor (403).
	CodeRouteNotForwarded = "PROXY_ROUTE_NOT_FORWARDED"
	// CodeUpdateTooLarge: a request's body is larger than
	// Options.MaxUpdateBytes; nothing was forwarded (413).
	CodeUpdateTooLarge = "PROXY_UPDATE_TOO_LARGE"
	// CodeBusy: the updates in progress already hold
	// Options.MaxBufferedBytes and none ended within Options.BufferWait;
	// nothing was read or forwarded, retry the update (503, Retry-After).
	CodeBusy = "PROXY_BUSY"
	// CodeRequestTimeout: the request's body did not arrive within the
	// listener's read timeout; nothing was forwarded (408).
	CodeRequestTimeout = "PROXY_REQUEST_TIMEOUT"
	// CodeStoreUnavailable: the update's outcome could not be recorded;
	// the worker should retry its update (the SDKs do).
	CodeStoreUnavailable = "STATE_STORE_UNAVAILABLE"
	// CodeTaskNotAdmitted: an update of an external step's task that the
	// proxy never handed out (its worker polled Conductor directly),
	// whose run is paused, being cancelled or ended, so that the step may
	// not start: nothing was recorded or forwarded, and the task was
	// answered to Conductor as a poll's would be (409). A task of a
	// running run is recorded (its start, then its outcome) and forwarded.
	CodeTaskNotAdmitted = "PROXY_TASK_NOT_ADMITTED"
	// CodeTryTimedOut: an update of an external step's task whose try
	// the log shows ended by its response timeout (the worker reported
	// after it): Conductor timed the task out, or times it out when its
	// paused workflow resumes, as it would have without the pause, and
	// takes no report of it after that. Nothing was recorded or forwarded
	// (409, not to be retried).
	CodeTryTimedOut = "PROXY_TRY_TIMED_OUT"
	// CodeWorkflowMismatch: an update of an external step's task names a
	// workflowInstanceId that is not the task's (Conductor would answer it
	// 200 and change nothing); nothing was recorded or forwarded (400).
	CodeWorkflowMismatch = "PROXY_WORKFLOW_MISMATCH"
	// CodeBadUpdate: the update's body is not a task result (not a JSON
	// object, or a status Conductor has no such value of); nothing was
	// recorded or forwarded (400; Conductor answers such a body 500,
	// which an SDK retries).
	CodeBadUpdate = "PROXY_BAD_UPDATE"
	// CodeUnsupportedMediaType: a task update whose Content-Type is not
	// JSON (application/json or application/*+json), or that has none:
	// Conductor answers it 500 and changes nothing, so nothing was
	// recorded or forwarded (415).
	CodeUnsupportedMediaType = "PROXY_UNSUPPORTED_MEDIA_TYPE"
	// CodeTaskReserved: a poll of a task type the sidecar's own workers
	// execute (sidecar_command, sidecar_http, sidecar_noop,
	// sidecar_sleep), or an update of such a task: those steps' starts
	// and outcomes are the sidecar's to record, so nothing was forwarded
	// (403).
	CodeTaskReserved = "PROXY_TASK_RESERVED"
	// CodeBadRequest: the request's body could not be read.
	CodeBadRequest = "PROXY_BAD_REQUEST"
	// CodeTooManyConnections: the proxy's listener holds
	// Options.MaxConnections open; the connection is answered and closed,
	// nothing was read or forwarded (503, Retry-After).
	CodeTooManyConnections = "TOO_MANY_CONNECTIONS"
	// CodeConductorUnavailable: Conductor did not answer.
	CodeConductorUnavailable = "CONDUCTOR_UNAVAILABLE"
)
