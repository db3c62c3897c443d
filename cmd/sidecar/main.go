// Command sidecar runs next to a Conductor server: it keeps the run event
// log, projects run snapshots and (in later subcommands) runs task workers
// and the draining pause. See README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
)

// Exit codes. 3 is a command's own (pause --wait: the drain timed out;
// archive verify: the archive could not be read). An answer of the API
// that refused the request gets the code of its kind, so that a script
// can tell "retry later" from "no such run" without reading the message.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	// exitNotFound: the API answered 404 (RUN_NOT_FOUND, ...).
	exitNotFound = 4
	// exitConflict: the API answered 409, the run's state refuses the
	// action (INVALID_TRANSITION, RUN_ARCHIVED, ENGINE_CONFLICT, ...).
	exitConflict = 5
	// exitUnavailable: the sidecar or Conductor did not answer, or asked
	// to be called again (502, 503, 504, 429, the connection failed):
	// retry later.
	exitUnavailable = 6
	// exitDenied: the API refused the caller (401, 403).
	exitDenied = 7
)

// errUsage marks an error whose usage text was already printed.
var errUsage = errors.New("usage")

// Main holds the process's standard streams, so that tests can run it.
type Main struct {
	Stdout io.Writer
	Stderr io.Writer

	// flagSets, when set, collects every flag set a command makes
	// (completion.go reads the commands' flags from their "-h").
	flagSets *[]*flag.FlagSet
	// help is set when the arguments ask for help (-h): a command's usage
	// is then every flag; otherwise, after a usage error, its synopsis.
	help bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := &Main{Stdout: os.Stdout, Stderr: os.Stderr}
	os.Exit(m.Run(ctx, os.Args[1:]))
}

// Run runs the subcommand named by args[0] and returns the exit code.
func (m *Main) Run(ctx context.Context, args []string) int {
	// No terminal control character from the API (or anywhere) reaches the
	// terminal raw (escape.go).
	out, errw := &safeWriter{w: m.Stdout}, &safeWriter{w: m.Stderr}
	defer errw.Flush()
	defer out.Flush()
	m = &Main{Stdout: out, Stderr: errw, flagSets: m.flagSets, help: helpRequested(args) || m.help}
	if m.help {
		// Asked-for help is output, as kubectl's: on stdout, exit 0.
		m.Stderr = out
	}
	if len(args) == 0 {
		m.usage()
		return exitUsage
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "key":
		err = (&KeyCommand{m}).Run(ctx, rest)
	case "version", "--version":
		err = (&VersionCommand{m}).Run(ctx, rest)
	case "demo":
		err = (&DemoCommand{m}).Run(ctx, rest)
	case "serve":
		err = (&ServeCommand{m}).Run(ctx, rest)
	case "run":
		err = (&RunCommand{m}).Run(ctx, rest)
	case "status":
		err = (&StatusCommand{m}).Run(ctx, rest)
	case "runs":
		err = (&RunsCommand{m}).Run(ctx, rest)
	case "events":
		err = (&EventsCommand{m}).Run(ctx, rest)
	case "audit":
		err = (&AuditCommand{m}).Run(ctx, rest)
	case "token":
		err = (&TokenCommand{m}).Run(ctx, rest)
	case "bus":
		err = (&BusCommand{m}).Run(ctx, rest)
	case "migrate":
		err = (&MigrateCommand{m}).Run(ctx, rest)
	case "verify":
		err = (&VerifyCommand{m}).Run(ctx, rest)
	case "archive":
		err = (&ArchiveCommand{m}).Run(ctx, rest)
	case "pause", "resume", "cancel", "retry":
		err = (&ControlCommand{m: m, action: args[0]}).Run(ctx, rest)
	case "completion":
		err = (&CompletionCommand{m}).Run(ctx, rest)
	case "help", "-h", "--help", "-help":
		m.usage()
		return exitOK
	default:
		if best := closestCommand(cmd); best != "" {
			fmt.Fprintf(m.Stderr, "sidecar: unknown command %q: did you mean %q? (\"sidecar help\" lists the commands)\n", cmd, best)
			return exitUsage
		}
		fmt.Fprintf(m.Stderr, "sidecar: unknown command %q\n\n", cmd)
		m.usage()
		return exitUsage
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errUsage):
		return exitUsage
	case errors.As(err, new(errDrainTimedOut)):
		fmt.Fprintf(m.Stderr, "sidecar %s: %v\n", args[0], err)
		return exitDrainTimeout
	case errors.As(err, new(errNoMatch)):
		fmt.Fprintf(m.Stderr, "sidecar %s: %v\n", args[0], err)
		return exitNotFound
	case errors.Is(err, pgstore.ErrURLInvalid):
		// A --store URL that cannot be parsed: nothing was sent.
		fmt.Fprintf(m.Stderr, "sidecar %s: %v\n", args[0], err)
		return exitUsage
	case errors.As(err, new(errArchiveUnreadable)):
		fmt.Fprintf(m.Stderr, "sidecar %s: %v\n", args[0], err)
		return exitArchiveUnreadable
	default:
		if !apiCommands[args[0]] {
			fmt.Fprintf(m.Stderr, "sidecar %s: %v\n", args[0], err)
			return exitError
		}
		if jsonOutput(args) {
			writeJSONError(m.Stderr, err)
		} else {
			fmt.Fprintf(m.Stderr, "sidecar %s: %v\n", args[0], err)
		}
		return exitCodeOf(err)
	}
}

// flagSuggester is a flag set's output that follows the flag package's
// "flag provided but not defined: -X" with the flag X is a slip of a
// letter or two from, if any.
type flagSuggester struct {
	w  io.Writer
	fs *flag.FlagSet
}

func (s *flagSuggester) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	name, ok := strings.CutPrefix(strings.TrimSpace(string(p)), "flag provided but not defined: -")
	if !ok || err != nil {
		return n, err
	}
	best, dist := "", 3
	s.fs.VisitAll(func(f *flag.Flag) {
		if d := editDistance(strings.TrimPrefix(name, "-"), f.Name); d < dist {
			best, dist = f.Name, d
		}
	})
	if best != "" {
		fmt.Fprintf(s.w, "did you mean --%s?\n", best)
	}
	return n, nil
}

// commands are the CLI's commands (Run's cases).
var commands = []string{"key", "version", "demo", "serve", "run", "status", "runs", "events", "audit", "token", "bus",
	"migrate", "verify", "archive", "pause", "resume", "cancel", "retry", "completion", "help"}

// closestCommand is the command cmd is a slip of a letter or two from,
// or "" when none is.
func closestCommand(cmd string) string {
	best, dist := "", 3
	for _, c := range commands {
		if d := editDistance(cmd, c); d < dist {
			best, dist = c, d
		}
	}
	return best
}

// apiCommands are the commands that call the control API: their failures
// exit with the kind of the API's answer (exitCodeOf) and, with -o json,
// are written as JSON.
var apiCommands = map[string]bool{"run": true, "status": true, "runs": true, "events": true, "audit": true, "bus": true,
	"pause": true, "resume": true, "cancel": true, "retry": true}

// exitCodeOf is the exit code of an API command that failed with err: the
// kind of the API's answer, exitUnavailable when the API did not answer,
// or exitError.
func exitCodeOf(err error) int {
	var ae *httpapi.Error
	if errors.As(err, &ae) {
		if ae.Foreign() && ae.Status != http.StatusTooManyRequests && ae.Status < 500 {
			// Not an answer of the sidecar's API (its errors carry a
			// code): another server at --server, whose 404 is no "no such
			// run". Gateways' 5xx and 429 stay "retry later".
			return exitError
		}
		switch ae.Status {
		case http.StatusNotFound:
			return exitNotFound
		case http.StatusConflict:
			return exitConflict
		case http.StatusUnauthorized, http.StatusForbidden:
			return exitDenied
		case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return exitUnavailable
		}
		return exitError
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return exitUnavailable // the API did not answer
	}
	return exitError
}

// jsonOutput reports whether args ask for -o json: a failure is then
// written as a JSON object too.
func jsonOutput(args []string) bool {
	for i, a := range args {
		switch {
		case a == "--":
			return false
		case (a == "-o" || a == "--o") && i+1 < len(args):
			if args[i+1] == "json" {
				return true
			}
		case a == "-o=json" || a == "--o=json":
			return true
		}
	}
	return false
}

// writeJSONError writes err as one line {"error": {...}}: the API's
// status, code and message when it answered, else code
// SIDECAR_UNAVAILABLE (the API did not answer) or ERROR.
func writeJSONError(w io.Writer, err error) {
	type body struct {
		Status  int    `json:"status,omitempty"`
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field,omitempty"`
	}
	b := body{Code: "ERROR", Message: err.Error()}
	var ae *httpapi.Error
	var ue *url.Error
	switch {
	case errors.As(err, &ae):
		b = body{Status: ae.Status, Code: ae.Code, Message: ae.Message, Field: ae.Field}
	case errors.As(err, &ue):
		b.Code = "SIDECAR_UNAVAILABLE"
	}
	line, _ := json.Marshal(map[string]body{"error": b})
	fmt.Fprintf(w, "%s\n", line)
}

func (m *Main) usage() {
	fmt.Fprint(m.Stderr, `sidecar runs next to a Conductor server and keeps each run's append-only event log.

Usage:
  sidecar <command> [flags]

Commands:
  serve     run the sidecar: task workers, event log, run watcher, control API
  run       submit a plan as a run:      sidecar run submit PLAN_FILE
  status    show a run's state:          sidecar status RUN_ID
  runs      list runs:                   sidecar runs [-l SELECTOR] [--plan P] [--status S] [-o wide] [-w]
  events    print a run's event log:     sidecar events RUN_ID [--follow]
  audit     a run's control actions:     sidecar audit RUN_ID [--since 24h]
  pause     pause a run (draining):      sidecar pause RUN_ID [--timeout 5m] [--wait]
  resume    resume a paused run:         sidecar resume RUN_ID
  cancel    cancel a run:                sidecar cancel RUN_ID
  retry     ready a held step's next attempt (onStepFailure: pause); resume runs it:
                                         sidecar retry RUN_ID STEP_ID
  bus       the event bus's sinks; dead letters and their replay:
                                         sidecar bus [deadletters [--sink S] | replay --sink S [--key K ...]]
  migrate   apply the PostgreSQL schema as its owner: sidecar migrate --store postgres://OWNER@... [--runtime-role R]
  verify    check the PostgreSQL log's hash chain: sidecar verify --store postgres://... [RUN_ID...]
  archive   check a run archive, read an archived run:
                                         sidecar archive verify --archive URL | archive events --archive URL RUN_ID
  demo      append a small run to the JetStream event log and show its snapshot
  key       print the idempotencyKey of an event
  token     make an API token and its tokens-file entry: sidecar token new --name N --roles R
  version   print the version
  completion  print a shell completion script: sidecar completion bash|zsh

Flags may come before or after a command's arguments ("sidecar status RUN_ID -o json");
after "--" every argument is an argument.

Exit status: 0 done; 1 failed; 2 usage; 3 pause --wait: the drain timed out, archive
verify: the archive could not be read. A command the API refused: 4 not found, 5 the
run's state refuses it (409), 6 unavailable, retry later (the sidecar or Conductor did
not answer, 429, 502, 503, 504), 7 denied (401, 403); with -o json the failure is one
JSON object on stderr: {"error": {"status", "code", "message"}}.

Examples:
  sidecar run submit plan.json -l team=data,tier=gold
  sidecar runs -l team=data -w
  sidecar pause RUN_ID --reason "db maintenance" --wait
  sidecar pause -l team=data --dry-run
  source <(sidecar completion bash)

Run "sidecar <command> -h" for a command's flags and examples.
`)
}

// newFlagSet returns a flag set that reports errors instead of exiting and
// prints usage to the command's stderr: after a usage error the synopsis
// and how to see the flags, so that the line saying what is wrong stays on
// the screen; on -h every flag and the examples.
func (m *Main) newFlagSet(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(&flagSuggester{w: m.Stderr, fs: fs})
	fs.Usage = func() {
		if !m.help {
			fmt.Fprintf(fs.Output(), "Usage: sidecar %s\nRun \"sidecar %s -h\" for its flags and examples.\n", synopsis, name)
			return
		}
		fmt.Fprintf(fs.Output(), "Usage: sidecar %s\n\nFlags:\n", synopsis)
		printDefaults(fs)
		if ex := examples[name]; ex != "" {
			fmt.Fprintf(fs.Output(), "\nExamples:\n%s", ex)
		}
	}
	if m.flagSets != nil {
		*m.flagSets = append(*m.flagSets, fs)
	}
	return fs
}

// secretFlags are the flags whose value is a secret: their default (from
// the environment) is never shown.
var secretFlags = map[string]bool{"token": true}

// printDefaults prints fs's flags like flag.PrintDefaults, without the
// secrets their defaults may hold (taken from the environment): a secret
// flag's default is left out, and a URL's password is masked.
func printDefaults(fs *flag.FlagSet) {
	saved := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		saved[f.Name] = f.DefValue
		switch {
		case secretFlags[f.Name]:
			f.DefValue = ""
		case strings.Contains(f.DefValue, "@"):
			f.DefValue = redactURL(f.DefValue)
		}
	})
	defer fs.VisitAll(func(f *flag.Flag) { f.DefValue = saved[f.Name] })
	fs.PrintDefaults()
}

// usageError prints msg and the flag set's usage, and returns errUsage.
func usageError(fs *flag.FlagSet, format string, args ...any) error {
	fmt.Fprintf(fs.Output(), "sidecar %s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	fs.Usage()
	return errUsage
}

// parse parses args, a command's flags without positional arguments, and
// maps flag errors to errUsage (flag already printed them).
func parse(fs *flag.FlagSet, args []string) error {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError(fs, "unexpected argument %q", pos[0])
	}
	return nil
}

// parseArgs parses args with the flags anywhere among the positional
// arguments, as kubectl does: "status RUN_ID -o json" and "status -o json
// RUN_ID" are the same; after "--" every argument is positional. It returns
// the positional arguments, those before a bad flag too; a bad flag is
// errUsage (flag printed it), -h flag.ErrHelp.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return pos, err
			}
			return pos, errUsage
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// helpRequested reports a -h (or --help) among args before any "--".
func helpRequested(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help", "help":
			return a != "help" || len(args) == 1
		}
	}
	return false
}
