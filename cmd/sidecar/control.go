package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// exitDrainTimeout is the exit code of "pause --wait" when the drain timed
// out (PAUSE_DRAIN_TIMEOUT).
const exitDrainTimeout = 3

// errDrainTimedOut makes Main.Run exit with exitDrainTimeout.
type errDrainTimedOut struct{ runID string }

func (e errDrainTimedOut) Error() string {
	return "PAUSE_DRAIN_TIMEOUT: the drain of run " + e.runID + " timed out; the run is PAUSED with steps still running"
}

// ControlCommand is "sidecar pause|resume|cancel RUN_ID" and
// "sidecar retry RUN_ID STEP_ID".
type ControlCommand struct {
	m      *Main
	action string
}

// Run implements the control subcommands: with a RUN_ID (anywhere among
// the arguments) the single-run form, without one the bulk form.
func (c *ControlCommand) Run(ctx context.Context, args []string) error {
	if c.action == "retry" {
		return c.single(ctx, args)
	}
	if helpRequested(args) {
		return c.help()
	}
	// The bulk form's flags include the single form's: parse with them,
	// quietly, to find a RUN_ID.
	probe := flag.NewFlagSet(c.action, flag.ContinueOnError)
	probe.SetOutput(io.Discard)
	new(clientFlags).register(probe)
	new(bulkFlags).register(probe, c.action)
	if pos, _ := parseArgs(probe, args); len(pos) > 0 {
		return c.single(ctx, args)
	}
	return c.bulk(ctx, args)
}

// singleFlags are the flags of the single-run form.
type singleFlags struct {
	reason, idemKey    string
	timeout, resumeFor time.Duration
	resumeUntil        string
	wait               bool
}

func (c *ControlCommand) singleFlagSet(f *singleFlags, cf *clientFlags) *flag.FlagSet {
	synopsis := c.action + " RUN_ID [--reason R] [--idempotency-key K] [--server URL] [-o json|yaml|name]"
	switch c.action {
	case "pause":
		synopsis = "pause RUN_ID [--timeout D] [--reason R] [--for D | --until TIME] [--wait] [--idempotency-key K] [--server URL] [-o json|yaml|name]"
	case "retry":
		synopsis = "retry RUN_ID STEP_ID [--reason R] [--idempotency-key K] [--server URL] [-o json|yaml|name]"
	}
	fs := c.m.newFlagSet(c.action, synopsis)
	cf.named = true
	cf.register(fs)
	fs.StringVar(&f.reason, "reason", "", "why (recorded in the event's payload)")
	fs.StringVar(&f.idemKey, "idempotency-key", "", "send this Idempotency-Key: repeating the command with the same key returns the first answer")
	if c.action == "pause" {
		fs.DurationVar(&f.timeout, "timeout", 0, "drain timeout of this pause (default: the sidecar's --drain-timeout)")
		fs.DurationVar(&f.resumeFor, "for", 0, "resume the run on its own after this long (e.g. 30m; requestedBy schedule)")
		fs.StringVar(&f.resumeUntil, "until", "", "resume the run on its own at this RFC 3339 time (e.g. 2026-11-23T06:00:00Z)")
		fs.BoolVar(&f.wait, "wait", false, "show in-flight progress until drained (exit 0) or the drain times out (exit 3)")
	}
	return fs
}

// help prints the usage of both forms: the single run's, then the flags
// only the bulk form has.
func (c *ControlCommand) help() error {
	var sf singleFlags
	var cf clientFlags
	single := c.singleFlagSet(&sf, &cf)
	single.Usage()
	bulk, _, _ := c.bulkFlagSet()
	extra := flag.NewFlagSet(c.action, flag.ContinueOnError)
	extra.SetOutput(single.Output())
	bulk.VisitAll(func(f *flag.Flag) {
		if single.Lookup(f.Name) == nil {
			extra.Var(f.Value, f.Name, f.Usage)
		}
	})
	fmt.Fprintf(single.Output(), "\nMany runs at once: sidecar %s\n\nFlags of the bulk form (besides those above):\n", bulkSynopsis(c.action))
	printDefaults(extra)
	return flag.ErrHelp
}

// single runs the action on one run.
func (c *ControlCommand) single(ctx context.Context, args []string) error {
	var f singleFlags
	var cf clientFlags
	fs := c.singleFlagSet(&f, &cf)
	names := []string{"RUN_ID"}
	if c.action == "retry" {
		names = append(names, "STEP_ID")
	}
	pos, err := cf.parse(fs, args, names...)
	if err != nil {
		return err
	}
	reason, idemKey := &f.reason, &f.idemKey
	timeout, resumeFor, resumeUntil, wait := f.timeout, f.resumeFor, f.resumeUntil, f.wait
	runID, stepID := pos[0], ""
	if c.action == "retry" {
		stepID = pos[1]
	}
	if timeout < 0 || (timeout > 0 && timeout < time.Second) {
		return usageError(fs, "--timeout must be at least 1s")
	}
	var until time.Time
	switch {
	case resumeFor != 0 && resumeUntil != "":
		return usageError(fs, "give --for or --until, not both")
	case resumeFor < 0 || (resumeFor > 0 && resumeFor < time.Second):
		return usageError(fs, "--for must be at least 1s")
	case resumeUntil != "":
		if until, err = time.Parse(time.RFC3339Nano, resumeUntil); err != nil {
			return usageError(fs, "--until must be an RFC 3339 time, e.g. 2026-11-23T06:00:00Z")
		}
	}
	client := cf.client()
	client.IdempotencyKey = *idemKey
	if wait {
		if _, err := client.Run(ctx, runID); deniedRead(err) {
			return waitDenied(c.action, err)
		}
	}
	var v *httpapi.RunView
	switch c.action {
	case "pause":
		v, err = client.PauseWith(ctx, runID, httpapi.PauseOptions{TimeoutSeconds: int64(timeout / time.Second), Reason: *reason,
			ResumeAt: until, ResumeAfter: resumeFor})
	case "resume":
		v, err = client.ResumeWith(ctx, runID, *reason)
	case "cancel":
		v, err = client.Cancel(ctx, runID, *reason)
	case "retry":
		v, err = client.RetryStep(ctx, runID, stepID, *reason)
	}
	if err != nil {
		return err
	}
	if !wait {
		if cf.structured() {
			return cf.print(c.m.Stdout, v, v.RunID)
		}
		if v.Notice != "" {
			fmt.Fprintf(c.m.Stdout, "note: %s\n", escapeText(v.Notice))
		}
		if !v.Replayed {
			fmt.Fprintf(c.m.Stdout, "%s: %s\n", escapeText(statusLine(v)), escapeText(v.Message))
			return nil
		}
		// A repeat of an earlier request: its answer is the run as it was
		// then; say so, and show the run as it is now.
		fmt.Fprintf(c.m.Stdout, "replayed: this Idempotency-Key was answered before; then: %s: %s\n", escapeText(statusLine(v)), escapeText(v.Message))
		now, err := client.Run(ctx, runID)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.m.Stdout, "now: %s: %s\n", escapeText(statusLine(now)), escapeText(now.Message))
		return nil
	}
	if v.Notice != "" && cf.output == "text" {
		fmt.Fprintf(c.m.Stdout, "note: %s\n", escapeText(v.Notice))
	}
	return c.wait(ctx, client, &cf, runID)
}

// deniedRead tells whether a read failed because the token may not read
// runs (it lacks the viewer role).
func deniedRead(err error) bool {
	var ae *httpapi.Error
	return errors.As(err, &ae) && !ae.Foreign() && ae.Status == http.StatusForbidden
}

// waitDenied is the refusal of an action with --wait by a token that may
// act but not read: nothing was done, since the drain could not be
// followed (an action done and then reported denied would be taken for
// one refused).
func waitDenied(action string, err error) error {
	return fmt.Errorf("--wait follows the drain by reading runs, which needs the viewer role; nothing was done (%s without --wait, or with a token that has viewer too): %w", action, err)
}

// errNoMatch makes Main.Run exit with exitNotFound: a bulk action's
// filter matched no run.
type errNoMatch struct{ action string }

func (e errNoMatch) Error() string {
	return "no run matches the filter; nothing was done (sidecar runs with the same filter lists what it selects)"
}

// wait polls the run until its drain ends. It prints a line when the
// run's status or its steps in flight change, with the time left to the
// drain's deadline then.
func (c *ControlCommand) wait(ctx context.Context, client *httpapi.Client, cf *clientFlags, runID string) error {
	last := ""
	for {
		v, err := client.Run(ctx, runID)
		if err != nil {
			return err
		}
		state, line := waitLine(v, time.Now())
		if state != last && cf.output == "text" {
			fmt.Fprintln(c.m.Stdout, escapeText(line))
		}
		last = state
		switch {
		case v.Drain == nil:
			// Not paused any more (resumed or ended while we waited).
			if cf.structured() {
				return cf.print(c.m.Stdout, v, v.RunID)
			}
			return nil
		case v.Drain.TimedOut:
			if cf.structured() {
				_ = cf.print(c.m.Stdout, v, v.RunID)
			}
			return errDrainTimedOut{runID}
		case !v.Drain.Draining && v.Drain.EndedAt != "":
			if cf.structured() {
				return cf.print(c.m.Stdout, v, v.RunID)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitLine is the progress of a run's drain: state is its status and steps
// in flight (a line is printed when it changes), line adds the time left
// to the drain's deadline.
func waitLine(v *httpapi.RunView, now time.Time) (state, line string) {
	state = fmt.Sprintf("%s: %s", statusLine(v), v.Message)
	if v.Drain != nil && v.Drain.Draining {
		state += fmt.Sprintf(" in flight: %v", v.Drain.InFlightStepIDs)
	}
	line = state
	if v.Drain != nil && v.Drain.Draining && v.Drain.Deadline != "" {
		line += " (deadline in " + left(now, v.Drain.Deadline) + ")"
	}
	return state, line
}

func statusLine(v *httpapi.RunView) string {
	if v.Substatus != "" {
		return v.Status + " (" + v.Substatus + ")"
	}
	return v.Status
}
