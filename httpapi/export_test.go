package httpapi

import "sort"

// Routes returns the routes the server serves, "METHOD /path" sorted (the
// OpenAPI document, docs/openapi.yaml, must list exactly these).
func (s *Server) Routes() []string {
	var out []string
	for path, methods := range s.allow {
		for _, m := range methods {
			out = append(out, m+" "+path)
		}
	}
	sort.Strings(out)
	return out
}

// SetPartBytes sets the most one entry of the bucket holds, so that a
// test keeps an answer in parts without making it megabytes long.
func (k *KVReplies) SetPartBytes(n int) { k.partBytes = n }

// PruneNext makes the next Claim prune, however recent the last prune.
func (p *PostgresReplies) PruneNext() { p.lastPrune.Store(0) }

// SetSessionLimits sets the console's session bounds (the table's and
// each principal's), so that a test fills the table with a few logins.
func (s *Server) SetSessionLimits(total, perPrincipal int) {
	s.sessions.max, s.sessions.perPrincipal = total, perPrincipal
}

// HoldWritingRequests counts n writing requests of principal name in
// progress, as if they were being answered, so that a test sees the
// bound's answer without holding requests open.
func (s *Server) HoldWritingRequests(name string, n int) {
	for range n {
		s.writing.take(name)
	}
}
