package main

import (
	"context"
	"fmt"
	"strings"
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

// Run implements the control subcommands.
func (c *ControlCommand) Run(ctx context.Context, args []string) error {
	synopsis := c.action + " RUN_ID [--reason R] [--idempotency-key K] [--server URL] [-o json]  (or a filter for many runs: " + c.action + " -l SELECTOR --reason R [--dry-run]; -l -h for its flags)"
	switch c.action {
	case "pause":
		synopsis = "pause RUN_ID [--timeout D] [--reason R] [--for D | --until TIME] [--wait] [--idempotency-key K] [--server URL] [-o json]"
	case "retry":
		synopsis = "retry RUN_ID STEP_ID [--reason R] [--idempotency-key K] [--server URL] [-o json]"
	}
	if c.action != "retry" && (len(args) == 0 || strings.HasPrefix(args[0], "-")) && !isHelp(args) {
		return c.bulk(ctx, args)
	}
	fs := c.m.newFlagSet(c.action, synopsis)
	var cf clientFlags
	cf.register(fs)
	reason := fs.String("reason", "", "why (recorded in the event's payload)")
	idemKey := fs.String("idempotency-key", "", "send this Idempotency-Key: repeating the command with the same key returns the first answer")
	var timeout, resumeFor time.Duration
	var resumeUntil string
	var wait bool
	if c.action == "pause" {
		fs.DurationVar(&timeout, "timeout", 0, "drain timeout of this pause (default: the sidecar's --drain-timeout)")
		fs.DurationVar(&resumeFor, "for", 0, "resume the run on its own after this long (e.g. 30m; requestedBy schedule)")
		fs.StringVar(&resumeUntil, "until", "", "resume the run on its own at this RFC 3339 time (e.g. 2026-11-23T06:00:00Z)")
		fs.BoolVar(&wait, "wait", false, "show in-flight progress until drained (exit 0) or the drain times out (exit 3)")
	}
	names := []string{"RUN_ID"}
	if c.action == "retry" {
		names = append(names, "STEP_ID")
	}
	pos, err := cf.parse(fs, args, names...)
	if err != nil {
		return err
	}
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
		if cf.output == "json" {
			return printJSON(c.m.Stdout, v)
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
	return c.wait(ctx, client, runID, cf.output)
}

// wait polls the run until its drain ends.
func (c *ControlCommand) wait(ctx context.Context, client *httpapi.Client, runID, output string) error {
	last := ""
	for {
		v, err := client.Run(ctx, runID)
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s: %s", statusLine(v), v.Message)
		if v.Drain != nil && v.Drain.Draining {
			line += fmt.Sprintf(" in flight: %v (deadline %s)", v.Drain.InFlightStepIDs, v.Drain.Deadline)
		}
		line = escapeText(line)
		if line != last && output != "json" {
			fmt.Fprintln(c.m.Stdout, line)
			last = line
		}
		switch {
		case v.Drain == nil:
			// Not paused any more (resumed or ended while we waited).
			if output == "json" {
				return printJSON(c.m.Stdout, v)
			}
			return nil
		case v.Drain.TimedOut:
			if output == "json" {
				_ = printJSON(c.m.Stdout, v)
			}
			return errDrainTimedOut{runID}
		case !v.Drain.Draining && v.Drain.EndedAt != "":
			if output == "json" {
				return printJSON(c.m.Stdout, v)
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

func statusLine(v *httpapi.RunView) string {
	if v.Substatus != "" {
		return v.Status + " (" + v.Substatus + ")"
	}
	return v.Status
}

// isHelp reports a request for the single-run form's help.
func isHelp(args []string) bool {
	return len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help")
}
