package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/httpapi/console"
)

// ConsoleSession is GET /ui/session and the answer of POST /ui/login: who
// the console acts as. CSRFToken is set for a cookie session; the console
// sends it as X-CSRF-Token with every request that changes something.
type ConsoleSession struct {
	// Auth is false when the API runs without authentication (local use):
	// no login, every role.
	Auth      bool     `json:"auth"`
	Name      string   `json:"name,omitempty"`
	Roles     []string `json:"roles"`
	Scope     Scope    `json:"scope"`
	CSRFToken string   `json:"csrfToken,omitempty"`
	// Expires is when the cookie session ends at the latest.
	Expires string `json:"expires,omitempty"`
}

var loginSchema = plan.JSONObject(map[string]plan.Schema{"token": plan.JSONString})

// consoleRoutes serves the console at /ui: the page and its assets to
// anyone (they hold no data), and the session endpoints.
func (s *Server) consoleRoutes() {
	page := console.Handler()
	s.mux.Handle("GET /ui/", page)
	s.mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/runs", http.StatusFound)
	})
	s.mux.HandleFunc("GET /ui/session", s.uiHandler("ui_session", s.consoleSession))
	s.mux.HandleFunc("POST /ui/login", s.uiHandler("ui_login", s.login))
	s.mux.HandleFunc("POST /ui/logout", s.uiHandler("ui_logout", s.logout))
}

// uiHandler serves a session endpoint: no-store, the console's security
// headers and the browser checks of the API.
func (s *Server) uiHandler(name string, h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		console.SecurityHeaders(rec.Header())
		rec.Header().Set("Cache-Control", "no-store")
		r.Body = http.MaxBytesReader(rec, r.Body, MaxControlBodyBytes)
		err := s.checkBrowser(r)
		if err == nil {
			err = h(rec, r)
		}
		if err != nil {
			s.writeErr(rec, name, err)
		}
		s.requests.WithLabelValues(name, strconv.Itoa(rec.status)).Inc()
		s.latency.WithLabelValues(name).Observe(time.Since(began).Seconds())
	}
}

func (s *Server) consoleSession(w http.ResponseWriter, r *http.Request) error {
	if s.opts.Auth == nil {
		return writeJSON(w, http.StatusOK, ConsoleSession{Roles: []string{RoleAdmin}})
	}
	if p, err := s.opts.Auth.Authenticate(r); err == nil { // a client certificate (or a bearer token)
		return writeJSON(w, http.StatusOK, ConsoleSession{Auth: true, Name: p.Name, Roles: p.Roles, Scope: p.Scope})
	}
	c, err := r.Cookie(SessionCookie)
	if err != nil {
		return errUnauthenticated(w)
	}
	sess := s.sessions.get(c.Value)
	if sess == nil {
		return errUnauthenticated(w)
	}
	p, err := s.sessionPrincipal(r, sess)
	if err != nil {
		s.sessions.close(c.Value)
		return errUnauthenticated(w)
	}
	return writeJSON(w, http.StatusOK, ConsoleSession{Auth: true, Name: p.Name, Roles: p.Roles, Scope: p.Scope,
		CSRFToken: sess.csrf, Expires: sess.opened.Add(SessionMax).UTC().Format(time.RFC3339)})
}

// login serves POST /ui/login {"token": "..."}: a bearer token listed in
// the tokens file opens a cookie session.
func (s *Server) login(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Token string `json:"token"`
	}
	if err := decodeBody(r, loginSchema, &body); err != nil {
		return err
	}
	if s.opts.Auth == nil {
		return badRequest("token", "this sidecar's API runs without authentication: the console needs no login")
	}
	if body.Token == "" {
		return badRequest("token", "token is required")
	}
	probe := r.Clone(r.Context())
	probe.Header = http.Header{"Authorization": {"Bearer " + body.Token}}
	probe.TLS = nil // the token must stand on its own: a session outlives the connection
	p, err := s.opts.Auth.Authenticate(probe)
	if err != nil {
		if ok, heldBack := s.refusedLogins.Take(time.Now()); ok {
			s.log.Warn("refused a console sign-in: the token is in no principal of the tokens file", zap.String("remoteAddr", r.RemoteAddr), zap.Int("refusedNotLogged", heldBack))
		}
		return errUnauthenticated(w)
	}
	id, csrf, ok := s.sessions.open(p.Name, body.Token)
	if !ok {
		return &apiError{status: http.StatusServiceUnavailable, retryAfter: time.Minute, Code: CodeSessionsFull,
			Message: fmt.Sprintf("the console's %d sessions are all open; sign out of unused ones or use the bearer token directly, and try again later", s.sessions.max)}
	}
	http.SetCookie(w, sessionCookie(r, id, int(SessionMax/time.Second), s.opts.SecureCookies))
	return writeJSON(w, http.StatusOK, ConsoleSession{Auth: true, Name: p.Name, Roles: p.Roles, Scope: p.Scope, CSRFToken: csrf,
		Expires: time.Now().Add(SessionMax).UTC().Format(time.RFC3339)})
}

// logout serves POST /ui/logout: the session ends (its CSRF token is
// required, as for any change).
func (s *Server) logout(w http.ResponseWriter, r *http.Request) error {
	c, err := r.Cookie(SessionCookie)
	if err != nil {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if sess := s.sessions.get(c.Value); sess != nil {
		if !sess.checkCSRF(r) {
			return errCSRF()
		}
		s.sessions.close(c.Value)
	}
	http.SetCookie(w, sessionCookie(r, "", -1, s.opts.SecureCookies))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// sessionPrincipal authenticates a request of session sess: its CSRF
// token when the request changes something, then the session's token
// against the credentials in use now.
func (s *Server) sessionPrincipal(r *http.Request, sess *session) (*Principal, error) {
	if !sess.checkCSRF(r) {
		return nil, errCSRF()
	}
	probe := r.Clone(r.Context())
	probe.Header = http.Header{"Authorization": {sess.authHeader}}
	probe.TLS = nil
	return s.opts.Auth.Authenticate(probe)
}

// cookiePrincipal is the principal of r's session cookie, for a request
// that carries neither a bearer token nor a client certificate the
// credentials know.
func (s *Server) cookiePrincipal(r *http.Request) (*Principal, error) {
	if r.Header.Get("Authorization") != "" {
		return nil, ErrUnauthenticated
	}
	c, err := r.Cookie(SessionCookie)
	if err != nil {
		return nil, ErrUnauthenticated
	}
	sess := s.sessions.get(c.Value)
	if sess == nil {
		return nil, ErrUnauthenticated
	}
	p, err := s.sessionPrincipal(r, sess)
	if errors.Is(err, ErrUnauthenticated) {
		// Its token was removed from the tokens file: the session ends,
		// and the token put back does not bring it back.
		s.sessions.close(c.Value)
	}
	return p, err
}

func errCSRF() error {
	return &apiError{status: http.StatusForbidden, Code: CodeCSRF,
		Message: "a console session's request that changes something needs the session's " + CSRFHeader + " header (GET /ui/session gives it)"}
}

func errUnauthenticated(w http.ResponseWriter) error {
	w.Header().Set("WWW-Authenticate", `Bearer realm="sidecar"`)
	return &apiError{status: http.StatusUnauthorized, Code: CodeUnauthenticated, Message: "a bearer token (or a client certificate) listed in the tokens file is required"}
}
