package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
)

// natsConfig is how serve reaches NATS securely: the embedded server's
// listener for other replicas, and the credentials and TLS of a connection
// to an external server (--nats-url).
type natsConfig struct {
	// Listen opens the embedded server to other replicas (empty: no TCP
	// listener at all).
	Listen string
	// PasswordFile holds the password of the NATS user: of the embedded
	// server's user "sidecar" with Listen, of User on an external server.
	PasswordFile string
	// User is the user name on an external server (with PasswordFile).
	User string
	// Creds is a NATS credentials file (JWT and nkey seed).
	Creds string
	// NKey is a file holding an nkey seed.
	NKey string
	// CA, Cert and Key configure TLS to an external server: the CA that
	// signed the server's certificate, and a client certificate.
	CA, Cert, Key string
	// InsecureNoAuth allows a non-loopback --nats-url without credentials.
	InsecureNoAuth bool
}

func (c *natsConfig) registerFlags(fs *flag.FlagSet, env *envSettings) {
	str := func(p *string, name, usage string) { stringFlag(fs, p, name, usage) }
	str(&c.Listen, "nats-listen", "open the embedded NATS server to other replicas on this address (needs --nats-password-file); empty: in-process only")
	str(&c.PasswordFile, "nats-password-file", "file with the NATS password: of user sidecar on the embedded listener, or of --nats-user on --nats-url")
	str(&c.User, "nats-user", "NATS user on --nats-url (with --nats-password-file; default sidecar)")
	str(&c.Creds, "nats-creds", "NATS credentials file (JWT + nkey) for --nats-url")
	str(&c.NKey, "nats-nkey", "file with an nkey seed for --nats-url")
	str(&c.CA, "nats-ca", "CA certificate (PEM) that signed the NATS server's certificate")
	str(&c.Cert, "nats-cert", "client certificate (PEM) for NATS TLS (with --nats-key)")
	str(&c.Key, "nats-key", "client key (PEM) for NATS TLS (with --nats-cert)")
	boolFlag(fs, env, &c.InsecureNoAuth, "nats-insecure-no-auth", "allow a non-loopback --nats-url without credentials: anyone who reaches that server can rewrite the log")
}

// validate returns the problems of the NATS settings; natsURL is --nats-url.
func (c *natsConfig) validate(natsURL string) []string {
	var p []string
	creds := 0
	for _, f := range []string{c.PasswordFile, c.Creds, c.NKey} {
		if f != "" {
			creds++
		}
	}
	if natsURL == "" {
		if c.Listen != "" && c.PasswordFile == "" {
			p = append(p, "--nats-listen needs --nats-password-file: other replicas authenticate as user sidecar with that password")
		}
		if c.Listen != "" {
			if msg := listenProblem("--nats-listen", c.Listen, "0.0.0.0:4222"); msg != "" {
				p = append(p, msg)
			}
		}
		for _, f := range []struct{ name, v string }{{"--nats-creds", c.Creds}, {"--nats-nkey", c.NKey}, {"--nats-user", c.User}, {"--nats-ca", c.CA}, {"--nats-cert", c.Cert}} {
			if f.v != "" {
				p = append(p, f.name+" applies to an external server (--nats-url); the embedded one uses --nats-password-file")
			}
		}
		return p
	}
	if c.Listen != "" {
		p = append(p, "--nats-listen is for the embedded server; with --nats-url the cluster is already reachable")
	}
	if creds > 1 {
		p = append(p, "give one of --nats-password-file, --nats-creds, --nats-nkey")
	}
	if c.User != "" && c.PasswordFile == "" {
		p = append(p, "--nats-user needs --nats-password-file")
	}
	if (c.Cert == "") != (c.Key == "") {
		p = append(p, "--nats-cert and --nats-key go together")
	}
	if _, err := natsURLs(natsURL); err != nil {
		return append(p, err.Error())
	}
	if creds == 0 && c.Cert == "" && !c.InsecureNoAuth && !loopbackNATS(natsURL) && !urlHasUser(natsURL) {
		p = append(p, fmt.Sprintf("--nats-url %s is not on loopback and no NATS credentials are given: pass --nats-creds, --nats-nkey or --nats-password-file (deploy/nats/sidecar.conf), or --nats-insecure-no-auth", redactURL(natsURL)))
	}
	return p
}

// password reads PasswordFile: its first line, without surrounding space.
func (c *natsConfig) password() (string, error) {
	b, err := os.ReadFile(c.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("--nats-password-file: %w", err)
	}
	pw := strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
	if pw == "" {
		return "", errors.New("--nats-password-file " + c.PasswordFile + " is empty")
	}
	return pw, nil
}

// anonymous reports whether a connection to --nats-url carries neither
// credentials nor a client certificate (connectOptions adds none).
func (c *natsConfig) anonymous() bool {
	return c.Creds == "" && c.NKey == "" && c.PasswordFile == "" && c.CA == "" && c.Cert == ""
}

// connectOptions are the nats.go options of a connection to --nats-url.
func (c *natsConfig) connectOptions() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case c.Creds != "":
		opts = append(opts, nats.UserCredentials(c.Creds))
	case c.NKey != "":
		o, err := nats.NkeyOptionFromSeed(c.NKey)
		if err != nil {
			return nil, fmt.Errorf("--nats-nkey: %w", err)
		}
		opts = append(opts, o)
	case c.PasswordFile != "":
		pw, err := c.password()
		if err != nil {
			return nil, err
		}
		user := c.User
		if user == "" {
			user = "sidecar"
		}
		opts = append(opts, nats.UserInfo(user, pw))
	}
	if c.CA != "" {
		opts = append(opts, nats.RootCAs(c.CA))
	}
	if c.Cert != "" {
		opts = append(opts, nats.ClientCert(c.Cert, c.Key))
	}
	return opts, nil
}

func loopbackNATS(raw string) bool {
	us, err := natsURLs(raw)
	if err != nil {
		return false
	}
	for _, u := range us {
		host := u.Hostname()
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return false
		}
	}
	return true
}

// urlHasUser reports whether every URL of the list carries a user (and
// maybe a password or token) in its userinfo.
func urlHasUser(raw string) bool {
	us, err := natsURLs(raw)
	if err != nil {
		return false
	}
	for _, u := range us {
		if u.User == nil {
			return false
		}
	}
	return true
}

// natsURLs parses a --nats-url list as nats.go does: comma separated, a
// server without a scheme is nats://, and its schemes are nats, tls, ws
// and wss. An entry that is none of these is an error naming it (nats.go
// would take http://host:4222 as nats://host:4222).
func natsURLs(raw string) ([]*url.URL, error) {
	var out []*url.URL
	for _, one := range strings.Split(raw, ",") {
		one = strings.TrimSpace(one)
		if one != "" && !strings.Contains(one, "://") {
			one = "nats://" + one
		}
		u, err := url.Parse(one)
		if err == nil && u.Hostname() == "" {
			err = errors.New("no host")
		}
		if err == nil && u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss" {
			err = fmt.Errorf("scheme %s", u.Scheme)
		}
		if err != nil {
			return nil, fmt.Errorf("--nats-url %s: want nats://host:port (or tls://, ws://, wss://), comma separated (%v)", redactURL(raw), err)
		}
		out = append(out, u)
	}
	return out, nil
}

// redactURL masks the password of every URL of a comma-separated list for
// messages and usage text, and a user without a password too (NATS takes a
// token there), except in a PostgreSQL URL, whose user is a role name. A
// URL that does not parse loses everything between its scheme and its
// last '@'.
func redactURL(raw string) string {
	var out []string
	for _, one := range strings.Split(raw, ",") {
		one = strings.TrimSpace(one)
		if u, err := url.Parse(one); err == nil {
			if _, hasPw := u.User.Password(); u.User != nil && !hasPw && u.Scheme != "postgres" && u.Scheme != "postgresql" {
				u.User = url.User("xxxxx")
			}
			out = append(out, u.Redacted())
			continue
		}
		if at := strings.LastIndex(one, "@"); at >= 0 {
			scheme, _, _ := strings.Cut(one, "://")
			if scheme == one {
				scheme = ""
			} else {
				scheme += "://"
			}
			one = scheme + "xxxxx" + one[at:]
		}
		out = append(out, one)
	}
	return strings.Join(out, ",")
}
