package proxy

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// route is what the proxy does with a request.
type route int

const (
	// routeRefused: not a call workers make; answered 403
	// CodeRouteNotForwarded (unless Options.ForwardAll).
	routeRefused route = iota
	// routeForward: forwarded to Conductor unchanged.
	routeForward
	routePoll
	routeBatchPoll
	routeUpdate
	routeUpdateV2
	routeUpdateByRef
)

// reservedTaskIDs are the second segments of /tasks/X that are
// Conductor's own endpoints, not a task id: GET /tasks/search reads
// every workflow's tasks, /tasks/queue/... are the queues' admin calls.
var reservedTaskIDs = map[string]bool{"poll": true, "search": true, "search-v2": true, "queue": true,
	"externalstoragelocation": true, "update-v2": true}

// routeOf tells what the proxy does with a request for path (the
// request's path after its token segment, with or without the /api
// prefix). The calls the official SDKs' workers make (docs/workers.md,
// "Bring your own workers", lists them with the SDKs that make them) are
// intercepted or forwarded; with forwardAll anything else is forwarded
// too, otherwise refused.
func routeOf(method, path string, forwardAll bool) route {
	p := strings.TrimPrefix(path, "/api")
	if rt := workerRoute(method, p); rt != routeRefused {
		return rt
	}
	if forwardAll {
		return routeForward
	}
	return routeRefused
}

// workerRoute is routeOf for the workers' calls (p without /api), or
// routeRefused.
func workerRoute(method, p string) route {
	if p == "/tasks/" && method == http.MethodPost {
		return routeUpdate // the trailing slash some clients add
	}
	if !cleanPath(p) {
		// Conductor's server resolves "..", "." and ";" parameters: a
		// task route must not lead elsewhere.
		return routeRefused
	}
	seg := strings.Split(strings.TrimPrefix(p, "/"), "/")
	get, post := method == http.MethodGet, method == http.MethodPost
	switch {
	case seg[0] == "health" && len(seg) == 1 && get:
		return routeForward
	case seg[0] == "token" && len(seg) == 1 && post:
		// An SDK given Conductor credentials (key id and secret)
		// exchanges them here for its own token.
		return routeForward
	case seg[0] == "metadata" && len(seg) >= 2 && seg[1] == "taskdefs":
		switch {
		case len(seg) == 2 && (get || post || method == http.MethodPut):
			return routeForward // list, register, update
		case len(seg) == 3 && get:
			return routeForward // one definition
		}
		return routeRefused
	case seg[0] != "tasks":
		return routeRefused
	}
	switch len(seg) {
	case 1:
		if post {
			return routeUpdate
		}
	case 2:
		switch {
		case post && seg[1] == "update-v2":
			return routeUpdateV2
		case get && seg[1] == "externalstoragelocation":
			return routeForward
		case get && !reservedTaskIDs[seg[1]]:
			return routeForward // GET /tasks/{taskId}
		}
	case 3:
		switch {
		case get && seg[1] == "poll":
			return routePoll
		case seg[2] == "log" && (get || post) && !reservedTaskIDs[seg[1]]:
			return routeForward
		case seg[2] == "ack" && post && !reservedTaskIDs[seg[1]]:
			return routeForward // older SDKs
		}
	case 4:
		if get && seg[1] == "poll" && seg[2] == "batch" {
			return routeBatchPoll
		}
	}
	if post && !reservedTaskIDs[seg[1]] && isUpdateByRef(p) {
		return routeUpdateByRef
	}
	return routeRefused
}

// cleanPath reports whether p has no empty, "." or ".." segment and no
// character a server may read as a path parameter or separator (";",
// "\"), so that Conductor resolves it to the path the rule saw.
func cleanPath(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, ";\\") {
		return false
	}
	for _, s := range strings.Split(p[1:], "/") {
		if s == "" || s == "." || s == ".." {
			return false
		}
	}
	return true
}

// refusals logs refused requests, at most one line a second: a worker
// that keeps calling a refused route shows in the log without filling it.
type refusals struct {
	mu      sync.Mutex
	last    time.Time
	skipped int
}

func (r *refusals) log(l *zap.Logger, method, path string) {
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.last) < time.Second {
		r.skipped++
		r.mu.Unlock()
		return
	}
	skipped := r.skipped
	r.last, r.skipped = now, 0
	r.mu.Unlock()
	l.Warn("refused a request the task proxy does not forward (--conductor-proxy-forward-all forwards it)",
		zap.String("method", method), zap.String("path", path), zap.Int("refusedNotLogged", skipped))
}
