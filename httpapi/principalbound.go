package httpapi

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// DefaultMaxRequestsPerPrincipal is Options.MaxRequestsPerPrincipal of
// serve by default: as many as serve has places at Conductor, so that the
// bound refuses only what would wait for a place anyway.
const DefaultMaxRequestsPerPrincipal = 64

// inProgress counts each principal's writing requests (starts, control
// actions, replays) being answered, and refuses one beyond the bound:
// one principal's flood is answered 429 at once instead of queueing for
// Conductor's places and the log's writes beside every other principal's
// requests. Requests without authentication are one principal.
type inProgress struct {
	max int // 0: no bound
	mu  sync.Mutex
	n   map[string]int
}

// take counts a request of principal name in, or reports that name has
// max of them in progress already.
func (b *inProgress) take(name string) bool {
	if b.max <= 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n[name] >= b.max {
		return false
	}
	if b.n == nil {
		b.n = map[string]int{}
	}
	b.n[name]++
	return true
}

// give counts a request of principal name out.
func (b *inProgress) give(name string) {
	if b.max <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n[name]--; b.n[name] <= 0 {
		delete(b.n, name)
	}
}

// tooManyRequests is the answer to a request beyond the bound.
func (b *inProgress) tooManyRequests(name string) *apiError {
	who := "requests without authentication"
	if name != "" {
		who = "principal " + name
	}
	return &apiError{status: http.StatusTooManyRequests, Code: CodeTooManyRequests, retryAfter: time.Second,
		Message: fmt.Sprintf("%s has %d writing requests in progress, the most one principal may have (serve --api-max-requests-per-principal); retry when one has been answered, or act on many runs with one bulk request", who, b.max)}
}
