package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// apiConfig is the control API's security configuration: authentication,
// authorization and TLS of the listener.
type apiConfig struct {
	// TokensFile lists the principals (hashed bearer tokens, client
	// certificate names) with their roles and scopes.
	TokensFile string
	// TLSCert and TLSKey serve the API over TLS.
	TLSCert, TLSKey string
	// ClientCA requires client certificates signed by it (mTLS).
	ClientCA string
	// InsecureNoAuth allows a non-loopback --listen without authentication.
	InsecureNoAuth bool
	// ConsoleSecureCookie marks the console's session cookie Secure on a
	// plain HTTP listener too: behind a proxy that terminates TLS.
	ConsoleSecureCookie bool
	// MetricsListen, when set, serves GET /metrics alone on this address,
	// without authentication (httpapi.MetricsServer), for a Prometheus
	// that cannot present a token.
	MetricsListen string
	// AllowedHosts are the host names, comma separated, a request's Host
	// may name besides loopback names and IP addresses.
	AllowedHosts string
	// NotifySecretFile holds the shared secret of Conductor's workflow
	// status notifications; set, the API serves their intake
	// (httpapi.NotifyPath).
	NotifySecretFile string

	// MaxConnections bounds the connections each listener (the API, the
	// metrics listener) keeps open; 0 derives it from the descriptor
	// limit (maxConnections).
	MaxConnections int
	// maxConnectionsEnv is the problem of a SIDECAR_MAX_CONNECTIONS that
	// is not a number (apply returns it).
	maxConnectionsEnv error
	// MaxRequestsPerPrincipal bounds each principal's writing requests
	// in progress (0: no bound).
	MaxRequestsPerPrincipal int

	creds *httpapi.Credentials // loaded by apply, reloaded on SIGHUP
}

// registerFlags binds the API security flags to fs.
func (c *apiConfig) registerFlags(fs *flag.FlagSet, env *envSettings) {
	str := func(p *string, name, usage string) { stringFlag(fs, p, name, usage) }
	str(&c.TokensFile, "tokens-file", "principals of the control API: hashed bearer tokens and client certificate names with roles and scopes (docs/security.md); reloaded on SIGHUP")
	str(&c.TLSCert, "tls-cert", "certificate (PEM) of the API listener, with --tls-key")
	str(&c.TLSKey, "tls-key", "key (PEM) of the API listener")
	str(&c.ClientCA, "client-ca", "CA (PEM) whose client certificates the API requires and accepts (mTLS; needs --tls-cert and --tokens-file)")
	str(&c.MetricsListen, "metrics-listen", "also serve GET /metrics, and nothing else, on this address WITHOUT authentication, for Prometheus (guard it with a network policy; empty: off)")
	str(&c.AllowedHosts, "api-allowed-hosts", "host names, comma separated, the API answers besides localhost and IP addresses (e.g. a pod's service name); without --tokens-file any other Host is refused (DNS rebinding), with it only when this is set")
	str(&c.NotifySecretFile, "conductor-notify-secret-file", fmt.Sprintf("file holding the shared secret (%d+ visible ASCII characters) Conductor sends in %s with its workflow status notifications; set, the API takes them at %s (docs/conductor.md, \"Status notifications\")", httpapi.MinNotifySecretBytes, httpapi.NotifySecretHeader, httpapi.NotifyPath))
	fs.Var(&intValue{&c.MaxConnections}, "max-connections", fmt.Sprintf("connections the API listener (and the metrics and task proxy listeners) each keep open at most; beyond, a connection is answered 503 TOO_MANY_CONNECTIONS and closed; 0: a third of the descriptor limit less %d (docs/operations.md) (env %s)", descriptorReserve, envName("max-connections")))
	if v, ok := os.LookupEnv(envName("max-connections")); ok {
		if err := fs.Set("max-connections", v); err != nil {
			c.maxConnectionsEnv = fmt.Errorf("%s=%q: %w (0 derives the bound from the descriptor limit)", envName("max-connections"), v, err)
		}
	}
	fs.Var(&intValue{&c.MaxRequestsPerPrincipal}, "api-max-requests-per-principal", "writing requests (starts, control actions, replays) one principal may have in progress at once; beyond, 429 TOO_MANY_REQUESTS with Retry-After (requests without authentication count as one principal; 0: no bound) (env "+envName("api-max-requests-per-principal")+")")
	env.set(fs, "api-max-requests-per-principal")
	boolFlag(fs, env, &c.ConsoleSecureCookie, "console-secure-cookie", "mark the console's session cookie Secure (sent over HTTPS only) although --listen serves plain HTTP: behind a proxy that terminates TLS (with --tls-cert it always is)")
	boolFlag(fs, env, &c.InsecureNoAuth, "insecure-no-auth", "serve the API off loopback WITHOUT authentication: anyone who reaches it may start, pause and cancel runs")
}

// validate returns the problems of the API settings; listen is --listen.
func (c *apiConfig) validate(listen string) []string {
	var p []string
	if c.MaxRequestsPerPrincipal < 0 {
		p = append(p, fmt.Sprintf("--api-max-requests-per-principal %d: give 0 (no bound) or more", c.MaxRequestsPerPrincipal))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		p = append(p, "--tls-cert and --tls-key go together")
	}
	if c.ClientCA != "" && (c.TLSCert == "" || c.TokensFile == "") {
		p = append(p, "--client-ca needs --tls-cert/--tls-key (mTLS) and --tokens-file (which maps certificate names to roles)")
	}
	if c.MetricsListen != "" {
		if msg := listenProblem("--metrics-listen", c.MetricsListen, "0.0.0.0:9787"); msg != "" {
			p = append(p, msg)
		} else if c.MetricsListen == listen {
			p = append(p, "--metrics-listen "+c.MetricsListen+" is --listen's address: give the metrics listener a port of its own")
		}
	}
	for _, h := range c.allowedHosts() {
		if strings.ContainsAny(h, ":/[] ") {
			p = append(p, fmt.Sprintf("--api-allowed-hosts: %q: give host names without scheme or port, comma separated", h))
		}
	}
	if c.NotifySecretFile != "" {
		if _, err := readNotifySecret(c.NotifySecretFile); err != nil {
			p = append(p, "--conductor-notify-secret-file: "+err.Error())
		}
	}
	if msg := listenProblem("--listen", listen, "127.0.0.1:8787, or 0.0.0.0:8787 in a container"); msg != "" {
		p = append(p, msg)
	} else if c.TokensFile == "" && !c.InsecureNoAuth && !loopbackListen(listen) {
		p = append(p, fmt.Sprintf("--listen %s is not on loopback and the API has no authentication: give --tokens-file (docs/security.md), or pass --insecure-no-auth to serve it open anyway", listen))
	}
	return p
}

// listenProblem says why addr cannot be flag's listener address ("" when
// it can): HOST:PORT, the port a number from 0 to 65535 (0: any free
// port), e.g. example.
func listenProblem(flag, addr, example string) string {
	_, port, err := net.SplitHostPort(addr)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
		return fmt.Sprintf("%s %q: want HOST:PORT with a port from 0 to 65535 (e.g. %s)", flag, addr, example)
	}
	return ""
}

// loopbackListen reports whether addr binds loopback only.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// allowedHosts is --api-allowed-hosts, split.
func (c *apiConfig) allowedHosts() []string {
	var out []string
	for _, h := range strings.Split(c.AllowedHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// readNotifySecret reads the notification secret from path: its content
// without surrounding white space, at least MinNotifySecretBytes visible
// ASCII characters (it travels in an HTTP header).
func readNotifySecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	secret := strings.TrimSpace(string(b))
	if len(secret) < httpapi.MinNotifySecretBytes {
		return nil, fmt.Errorf("%s holds %d characters; give at least %d (e.g. openssl rand -hex 32)", path, len(secret), httpapi.MinNotifySecretBytes)
	}
	for _, r := range secret {
		if r <= ' ' || r > '~' {
			return nil, fmt.Errorf("%s: the secret must be visible ASCII characters only (it is sent as an HTTP header value; e.g. openssl rand -hex 32)", path)
		}
	}
	return []byte(secret), nil
}

// apply sets the security options of the API server.
func (c *apiConfig) apply(o *httpapi.Options, log *zap.Logger) error {
	o.AllowedHosts = c.allowedHosts()
	o.MaxRequestsPerPrincipal = c.MaxRequestsPerPrincipal
	o.SecureCookies = c.ConsoleSecureCookie
	if c.maxConnectionsEnv != nil {
		return c.maxConnectionsEnv
	}
	nofile, err := descriptorLimit()
	if err != nil {
		return err
	}
	if o.MaxConnections, err = maxConnections(c.MaxConnections, nofile); err != nil {
		return err
	}
	log.Info("bounding the connections of each listener", zap.Int("maxConnections", o.MaxConnections), zap.Uint64("descriptorLimit", nofile))
	if c.NotifySecretFile != "" {
		secret, err := readNotifySecret(c.NotifySecretFile)
		if err != nil {
			return fmt.Errorf("--conductor-notify-secret-file: %w", err)
		}
		o.NotifySecret = secret
		log.Info("taking Conductor's workflow status notifications", zap.String("path", httpapi.NotifyPath), zap.String("secretFile", c.NotifySecretFile))
	}
	if c.TokensFile != "" {
		creds, err := httpapi.LoadCredentials(c.TokensFile)
		if err != nil {
			return err
		}
		c.creds, o.Auth = creds, creds
		log.Info("control API requires authentication", zap.String("tokensFile", c.TokensFile), zap.Int("principals", creds.Len()))
	} else {
		log.Warn("control API is UNAUTHENTICATED: anyone who reaches --listen may start, pause and cancel runs (give --tokens-file; docs/security.md)")
	}
	if c.TLSCert == "" {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.ClientCA != "" {
		pem, err := os.ReadFile(c.ClientCA)
		if err != nil {
			return fmt.Errorf("--client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return errors.New("--client-ca " + c.ClientCA + ": no PEM certificate in it")
		}
		// A certificate is verified when given; a caller may still use a
		// bearer token instead (probes, the CLI).
		tc.ClientCAs, tc.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	o.TLSConfig = tc
	return nil
}

// reload reads the tokens file again (SIGHUP). A bad file keeps the
// principals in use.
func (c *apiConfig) reload(log *zap.Logger) {
	if c.creds == nil {
		return
	}
	if msg := checkSecretFile("--tokens-file", c.TokensFile); msg != "" {
		// Refused at start, so refused here too: someone else may have
		// written the principals it now holds.
		log.Error("tokens file not reloaded; the previous principals stay in use", zap.String("error", msg))
		return
	}
	if err := c.creds.Reload(); err != nil {
		log.Error("tokens file not reloaded; the previous principals stay in use", zap.Error(err))
		return
	}
	log.Info("tokens file reloaded", zap.Int("principals", c.creds.Len()))
}
