package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

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
	}
	return pos, nil
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
