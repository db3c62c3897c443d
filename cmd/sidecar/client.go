package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// clientFlags are the flags every client subcommand takes.
type clientFlags struct {
	server string
	output string
	token  string
	caCert string
	roots  *x509.CertPool // from caCert, by check
	// wide: -o wide is accepted too (a table with more columns).
	wide bool
}

func (f *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.server, "server", envOr("SIDECAR_SERVER", "http://127.0.0.1:8787"), "sidecar API address (env SIDECAR_SERVER)")
	formats := "text or json"
	if f.wide {
		formats = "text, wide or json"
	}
	fs.StringVar(&f.output, "o", "text", "output format: "+formats)
	fs.StringVar(&f.token, "token", envOr("SIDECAR_TOKEN", ""), "bearer token for the API (env SIDECAR_TOKEN)")
	fs.StringVar(&f.caCert, "ca-cert", envOr("SIDECAR_CA_CERT", ""), "CA certificate (PEM) of an https --server (env SIDECAR_CA_CERT)")
}

func (f *clientFlags) check(fs *flag.FlagSet) error {
	if f.output != "text" && f.output != "json" && (!f.wide || f.output != "wide") {
		return usageError(fs, "-o must be text or json%s", map[bool]string{true: " or wide"}[f.wide])
	}
	if u, err := url.Parse(f.server); err == nil && u.User != nil {
		// The API takes bearer tokens; a password in the URL would only
		// end up in error messages.
		return usageError(fs, "--server %s: give the address without credentials, and the token with --token or SIDECAR_TOKEN", redactURL(f.server))
	}
	if f.caCert != "" {
		pem, err := os.ReadFile(f.caCert)
		if err != nil {
			return usageError(fs, "--ca-cert: %v", err)
		}
		f.roots = x509.NewCertPool()
		if !f.roots.AppendCertsFromPEM(pem) {
			return usageError(fs, "--ca-cert %s: no PEM certificate in it", f.caCert)
		}
	}
	return nil
}

// parse parses a client subcommand's arguments: the positional arguments
// named by names first (each required), then the flags.
func (f *clientFlags) parse(fs *flag.FlagSet, args []string, names ...string) ([]string, error) {
	pos := make([]string, len(names))
	for i := range names {
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			pos[i], args = args[0], args[1:]
		}
	}
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	if err := f.check(fs); err != nil {
		return nil, err
	}
	for i, name := range names {
		if pos[i] == "" {
			return nil, usageError(fs, "%s is required", name)
		}
		// Run and step ids follow the contract's one id rule; a bad one is
		// refused here rather than sent.
		if strings.HasSuffix(name, "_ID") {
			if err := statestore.CheckID(pos[i], true); err != nil {
				return nil, usageError(fs, "%s %.64q %v", name, pos[i], err)
			}
		}
	}
	return pos, nil
}

func (f *clientFlags) client() *httpapi.Client {
	c := httpapi.NewClient(f.server)
	c.Token = f.token
	if f.roots != nil {
		c.HTTP.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.roots, MinVersion: tls.VersionTLS12}}
	}
	return c
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printJSONLine prints v as one line of JSON.
func printJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

func optional(v, none string) string {
	if v == "" {
		return none
	}
	return v
}
