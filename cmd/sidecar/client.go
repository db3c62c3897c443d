package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/conductor-sidecar/sidecar/adapter/httpapi"
)

// clientFlags are the flags every client subcommand takes.
type clientFlags struct {
	server string
	output string
}

func (f *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.server, "server", envOr("SIDECAR_SERVER", "http://127.0.0.1:8787"), "sidecar API address (env SIDECAR_SERVER)")
	fs.StringVar(&f.output, "o", "text", "output format: text or json")
}

func (f *clientFlags) check(fs *flag.FlagSet) error {
	if f.output != "text" && f.output != "json" {
		return usageError(fs, "-o must be text or json")
	}
	return nil
}

func (f *clientFlags) client() *httpapi.Client { return httpapi.NewClient(f.server) }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func optional(v, none string) string {
	if v == "" {
		return none
	}
	return v
}

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}
