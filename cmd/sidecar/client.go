package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

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
	// named: -o yaml and -o name are accepted too (the command prints a
	// resource or a list of them; name prints their ids, one a line).
	named bool
}

// formats are the -o values the command takes.
func (f *clientFlags) formats() []string {
	out := []string{"text"}
	if f.wide {
		out = append(out, "wide")
	}
	out = append(out, "json")
	if f.named {
		out = append(out, "yaml", "name")
	}
	return out
}

// structured reports an -o that prints data rather than text.
func (f *clientFlags) structured() bool {
	return f.output == "json" || f.output == "yaml" || f.output == "name"
}

// print prints v as -o asks: json, yaml, or names (the ids of what v
// holds, one a line).
func (f *clientFlags) print(w io.Writer, v any, names ...string) error {
	switch f.output {
	case "yaml":
		return printYAML(w, v)
	case "name":
		for _, n := range names {
			if _, err := fmt.Fprintln(w, escapeText(n)); err != nil {
				return err
			}
		}
		return nil
	}
	return printJSON(w, v)
}

// printYAML prints v as YAML, its fields in the order of its JSON.
func printYAML(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return err
	}
	blockStyle(&doc)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	return enc.Close()
}

// blockStyle drops the flow style ({...}, "...") that parsing JSON gives
// the nodes, so that the YAML reads as YAML.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

func (f *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.server, "server", envOr("SIDECAR_SERVER", "http://127.0.0.1:8787"), "sidecar API address (env SIDECAR_SERVER)")
	fs.StringVar(&f.output, "o", "text", "output format: "+strings.Join(f.formats(), ", "))
	fs.StringVar(&f.token, "token", envOr("SIDECAR_TOKEN", ""), "bearer token for the API (env SIDECAR_TOKEN)")
	fs.StringVar(&f.caCert, "ca-cert", envOr("SIDECAR_CA_CERT", ""), "CA certificate (PEM) of an https --server (env SIDECAR_CA_CERT)")
}

func (f *clientFlags) check(fs *flag.FlagSet) error {
	if !slices.Contains(f.formats(), f.output) {
		return usageError(fs, "-o must be one of %s", strings.Join(f.formats(), ", "))
	}
	if f.server != "" && !strings.Contains(f.server, "://") {
		// host:port, as kubectl takes it: https with a CA, else http.
		scheme := "http://"
		if f.caCert != "" {
			scheme = "https://"
		}
		f.server = scheme + f.server
	}
	if u, err := url.Parse(f.server); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return usageError(fs, "--server %q: want an address such as http://127.0.0.1:8787 or 127.0.0.1:8787", redactURL(f.server))
	} else if u.User != nil {
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
// named by names (each required), and the flags, before, between or after
// them.
func (f *clientFlags) parse(fs *flag.FlagSet, args []string, names ...string) ([]string, error) {
	pos, err := f.parseUpTo(fs, args, len(names))
	if err != nil {
		return nil, err
	}
	if len(pos) < len(names) {
		return nil, usageError(fs, "%s is required", names[len(pos)])
	}
	return pos, checkIDs(fs, names, pos)
}

// parseUpTo parses a client subcommand's arguments with at most n
// positional arguments.
func (f *clientFlags) parseUpTo(fs *flag.FlagSet, args []string, n int) ([]string, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) > n {
		return nil, usageError(fs, "unexpected argument %q", pos[n])
	}
	if err := f.check(fs); err != nil {
		return nil, err
	}
	return pos, nil
}

// checkIDs refuses a positional argument named *_ID that breaks the
// contract's id rule, rather than sending it.
func checkIDs(fs *flag.FlagSet, names, pos []string) error {
	for i, name := range names {
		if i < len(pos) && strings.HasSuffix(name, "_ID") {
			if err := statestore.CheckID(pos[i], true); err != nil {
				return usageError(fs, "%s %.64q %v", name, pos[i], err)
			}
		}
	}
	return nil
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
