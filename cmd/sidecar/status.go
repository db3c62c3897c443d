package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// StatusCommand shows a run's state: "sidecar status RUN".
type StatusCommand struct{ m *Main }

// Run implements "sidecar status".
func (c *StatusCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("status", "status RUN_ID [--server URL] [-o json]")
	var cf clientFlags
	cf.register(fs)
	pos, err := cf.parse(fs, args, "RUN_ID")
	if err != nil {
		return err
	}
	runID := pos[0]
	v, err := cf.client().Run(ctx, runID)
	if err != nil {
		return err
	}
	if cf.output == "json" {
		return printJSON(c.m.Stdout, v)
	}
	status := v.Status
	if v.Substatus != "" {
		status += " (" + v.Substatus + ")"
	}
	if v.QueuePosition > 0 {
		status += fmt.Sprintf(" (position %d)", v.QueuePosition)
	}
	fmt.Fprintf(c.m.Stdout, "run       %s\nstatus    %s\nmessage   %s\nplan      %s %s\nengine    %s\n",
		v.RunID, status, v.Message, v.PlanID, v.PlanVersion, optional(v.EngineRunRef, "-"))
	if len(v.Labels) > 0 {
		fmt.Fprintf(c.m.Stdout, "labels    %s\n", labelString(v.Labels))
	}
	if v.Inconsistent {
		fmt.Fprintf(c.m.Stdout, "WARNING   inconsistent: %d invalid transitions ignored\n", len(v.InvalidEvents))
	}
	if d := v.Drain; d != nil {
		inFlight := "none"
		if len(d.InFlightStepIDs) > 0 {
			inFlight = strings.Join(d.InFlightStepIDs, ", ")
		}
		fmt.Fprintf(c.m.Stdout, "drain     cycle %d, paused %s, deadline %s, in flight: %s\n", d.Cycle, d.PausedAt, d.Deadline, inFlight)
		if p := v.Pause; p != nil && p.Reason != "" {
			reason := p.Reason
			if p.StepID != "" {
				reason += " (step " + p.StepID + ")"
			}
			fmt.Fprintln(c.m.Stdout, "reason    "+reason)
		}
		if e := v.DrainETA; e != nil {
			if len(e.Unknown) > 0 {
				fmt.Fprintf(c.m.Stdout, "eta       unknown: no history enough for %s (3 earlier durations at least)\n", strings.Join(e.Unknown, ", "))
			} else {
				now := time.Now()
				fmt.Fprintf(c.m.Stdout, "eta       drained in %s (even odds) to %s (9 in 10): %s .. %s, from %d earlier durations\n",
					left(now, e.P50), left(now, e.P90), e.P50, e.P90, e.Samples)
			}
		}
		if p := v.Pause; p != nil && p.ResumeAt != "" {
			fmt.Fprintf(c.m.Stdout, "resumes   on its own at %s (scheduled; a resume or a new pause cancels it)\n", p.ResumeAt)
		}
	}
	if v.PausedSeconds > 0 {
		fmt.Fprintf(c.m.Stdout, "paused    %.0fs in all\n", v.PausedSeconds)
	}
	for _, s := range v.Steps {
		line := fmt.Sprintf("step      %-24s %-8s attempt %d", s.StepID, s.Status, s.LogicalAttemptID)
		switch {
		case s.Held && s.Status == "FAILED":
			line += "  HELD (retry it: sidecar retry " + v.RunID + " " + s.StepID + ")"
		case s.RetryRequested:
			line += "  retry requested"
		}
		if s.Error != nil {
			line += "  " + s.Error.Code + ": " + strings.TrimSpace(s.Error.Message)
		}
		fmt.Fprintln(c.m.Stdout, line)
	}
	return nil
}
