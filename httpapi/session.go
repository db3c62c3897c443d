package httpapi

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"slices"
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
	// MaxSessions bounds the sessions kept; a login of a principal
	// holding none of them is refused (503 SESSIONS_FULL) until one ends.
	MaxSessions = 10000
	// MaxSessionsPerPrincipal bounds the sessions of one principal: its
	// next login ends its oldest session (by login time).
	MaxSessionsPerPrincipal = 16
)

// sessions keeps the console's sessions by the SHA-256 of their cookie
// value. It is safe for concurrent use.
type sessions struct {
	mu   sync.Mutex
	byID map[[sha256.Size]byte]*session
	// byPrincipal holds the keys of each principal's sessions in login
	// order.
	byPrincipal map[string][][sha256.Size]byte
	now         func() time.Time
	// max and perPrincipal bound the sessions of the table and of one
	// principal.
	max, perPrincipal int
}

type session struct {
	// principal is the name of the principal the session was opened by.
	principal string
	// authHeader is "Bearer " and the token the session was opened with.
	authHeader string
	csrf       string
	opened     time.Time
	lastUsed   time.Time
}

func newSessions() *sessions {
	return &sessions{byID: map[[sha256.Size]byte]*session{}, byPrincipal: map[string][][sha256.Size]byte{}, now: time.Now, max: MaxSessions, perPrincipal: MaxSessionsPerPrincipal}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

// open starts a session of principal for token and returns its cookie
// value and CSRF token. A principal holding perPrincipal sessions has its
// oldest (by login) ended to make room, so that no principal takes more
// than its share of the table; ok is false when the table still holds
// max sessions after the expired ones are dropped.
func (ss *sessions) open(principal, token string) (id, csrf string, ok bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := ss.now()
	if mine := ss.byPrincipal[principal]; len(mine) >= ss.perPrincipal {
		ss.drop(mine[0]) // the oldest: kept in login order
	}
	if len(ss.byID) >= ss.max {
		for k, s := range ss.byID {
			if s.expired(now) {
				ss.drop(k)
			}
		}
		if len(ss.byID) >= ss.max {
			return "", "", false
		}
	}
	id, csrf = randomToken(), randomToken()
	k := sha256.Sum256([]byte(id))
	ss.byID[k] = &session{principal: principal, csrf: csrf, opened: now, lastUsed: now, authHeader: "Bearer " + token}
	ss.byPrincipal[principal] = append(ss.byPrincipal[principal], k)
	return id, csrf, true
}

// drop ends the session of key k; ss.mu is held.
func (ss *sessions) drop(k [sha256.Size]byte) {
	s := ss.byID[k]
	if s == nil {
		return
	}
	delete(ss.byID, k)
	mine := slices.DeleteFunc(ss.byPrincipal[s.principal], func(o [sha256.Size]byte) bool { return o == k })
	if len(mine) == 0 {
		delete(ss.byPrincipal, s.principal)
	} else {
		ss.byPrincipal[s.principal] = mine
	}
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
		ss.drop(k)
		return nil
	}
	s.lastUsed = now
	return s
}

// close ends the session of cookie value id.
func (ss *sessions) close(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.drop(sha256.Sum256([]byte(id)))
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

// sessionCookie is the cookie of session id (maxAge < 0 deletes it),
// Secure over TLS or when secure (Options.SecureCookies).
func sessionCookie(r *http.Request, id string, maxAge int, secure bool) *http.Cookie {
	return &http.Cookie{Name: SessionCookie, Value: id, Path: "/", HttpOnly: true, Secure: r.TLS != nil || secure,
		SameSite: http.SameSiteStrictMode, MaxAge: maxAge}
}
