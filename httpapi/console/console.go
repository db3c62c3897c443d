// Package console is the sidecar's web console: hand-written HTML, CSS and
// JavaScript modules, embedded in the binary (no build step, nothing
// loaded from elsewhere). The page calls the /v1 API of the server that
// serves it; httpapi serves the console at /ui with its sessions.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed static
var static embed.FS

// ContentSecurityPolicy is sent with every console answer: scripts,
// styles and connections of the console's own origin only, no inline
// script or style, no framing, no form posted elsewhere.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Assets returns the console's files (index.html, and assets/...).
func Assets() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	return sub
}

// SecurityHeaders sets the headers every console answer carries.
func SecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// Handler serves GET /ui/...: the files under /ui/assets/, and the page
// (index.html) for every other path, so that each view's URL (/ui/runs,
// /ui/runs/RUN_ID, ...) can be opened, pasted and reloaded.
func Handler() http.Handler {
	files := Assets()
	assets := http.StripPrefix("/ui/", http.FileServerFS(files))
	page, _ := fs.ReadFile(files, "index.html")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		SecurityHeaders(w.Header())
		if strings.HasPrefix(r.URL.Path, "/ui/assets/") && !strings.HasSuffix(r.URL.Path, "/") {
			w.Header().Set("Cache-Control", "no-cache")
			assets.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(page)
	})
}
