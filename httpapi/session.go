package httpapi

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"sync"
	"time"
)

// The console's browser sessions. POST /ui/login exchanges a bearer token
// for a session: an HttpOnly, SameSite=Strict cookie (Secure over TLS)
// holding a random id the server keeps (hashed) with the token, and a
// CSRF token the console's script reads from GET /ui/session (same origin
// only) and sends as X-CSRF-Token with every request that is not a GET.
// Each request of a session is authenticated again with the token kept,
// so a token removed from the tokens file (and SIGHUP) ends its sessions.
const (
	// SessionCookie is the name of the console's session cookie.
	SessionCookie = "sidecar_session"
	// CSRFHeader carries a session's CSRF token on a console request that
	// changes something.
	CSRFHeader = "X-CSRF-Token"
	// SessionIdle ends a session not used for this long.
	SessionIdle = time.Hour
	// SessionMax ends a session this long after its login, used or not.
	SessionMax = 12 * time.Hour
	// MaxSessions bounds the sessions kept; a login beyond is refused
	// (503) until one ends.
	MaxSessions = 10000
	// MaxSessionsPerPrincipal bounds the sessions of one principal.
	MaxSessionsPerPrincipal = 16
)

// sessions keeps the console's sessions by the SHA-256 of their cookie
// value. It is safe for concurrent use.
type sessions struct {
	mu   sync.Mutex
	byID map[[sha256.Size]byte]*session
	now  func() time.Time
	// max and perPrincipal bound the sessions of the table and of one
	// principal.
	max, perPrincipal int
}

type session struct {
	// authHeader is "Bearer " and the token the session was opened with.
	authHeader string
	csrf       string
	opened     time.Time
	lastUsed   time.Time
}

func newSessions() *sessions {
	return &sessions{byID: map[[sha256.Size]byte]*session{}, now: time.Now, max: MaxSessions, perPrincipal: MaxSessionsPerPrincipal}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

// open starts a session for token and returns its cookie value and CSRF
// token; ok is false when MaxSessions are open.
func (ss *sessions) open(token string) (id, csrf string, ok bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := ss.now()
	if len(ss.byID) >= ss.max {
		for k, s := range ss.byID {
			if s.expired(now) {
				delete(ss.byID, k)
			}
		}
		if len(ss.byID) >= ss.max {
			return "", "", false
		}
	}
	id, csrf = randomToken(), randomToken()
	ss.byID[sha256.Sum256([]byte(id))] = &session{csrf: csrf, opened: now, lastUsed: now, authHeader: "Bearer " + token}
	return id, csrf, true
}

func (s *session) expired(now time.Time) bool {
	return now.Sub(s.lastUsed) > SessionIdle || now.Sub(s.opened) > SessionMax
}

// get returns the live session of cookie value id, marking it used.
func (ss *sessions) get(id string) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	k := sha256.Sum256([]byte(id))
	s := ss.byID[k]
	if s == nil {
		return nil
	}
	now := ss.now()
	if s.expired(now) {
		delete(ss.byID, k)
		return nil
	}
	s.lastUsed = now
	return s
}

// close ends the session of cookie value id.
func (ss *sessions) close(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.byID, sha256.Sum256([]byte(id)))
}

// checkCSRF reports whether r, a request of session s, may change
// something: a safe method, or the session's CSRF token in CSRFHeader.
func (s *session) checkCSRF(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		return true
	}
	got := r.Header.Get(CSRFHeader)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

// sessionCookie is the cookie of session id (maxAge < 0 deletes it).
func sessionCookie(r *http.Request, id string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: SessionCookie, Value: id, Path: "/", HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode, MaxAge: maxAge}
}
