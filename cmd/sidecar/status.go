package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// StatusCommand shows a run's state: "sidecar status RUN".
type StatusCommand struct{ m *Main }

// Run implements "sidecar status".
func (c *StatusCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("status", "status RUN_ID [--server URL] [-o json|yaml|name]")
	cf := clientFlags{named: true}
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
	if cf.structured() {
		return cf.print(c.m.Stdout, v, v.RunID)
	}
	status := v.Status
	if v.Substatus != "" {
		status += " (" + v.Substatus + ")"
	}
	if v.QueuePosition > 0 {
		status += fmt.Sprintf(" (position %d)", v.QueuePosition)
	}
	if v.Archived {
		status += " (archived: read from the archive, it left hot state; control actions answer RUN_ARCHIVED)"
	}
	// Every string from the API is escaped: one field, one line (escape.go).
	e := escapeText
	fmt.Fprintf(c.m.Stdout, "run       %s\nstatus    %s\nmessage   %s\nplan      %s %s\nengine    %s\n",
		e(v.RunID), e(status), e(v.Message), e(v.PlanID), e(v.PlanVersion), e(optional(v.EngineRunRef, "-")))
	if len(v.Labels) > 0 {
		fmt.Fprintf(c.m.Stdout, "labels    %s\n", e(labelString(v.Labels)))
	}
	if v.Inconsistent {
		fmt.Fprintf(c.m.Stdout, "WARNING   inconsistent: %d invalid transitions ignored\n", len(v.InvalidEvents))
	}
	if d := v.Drain; d != nil {
		inFlight := "none"
		if len(d.InFlightStepIDs) > 0 {
			inFlight = strings.Join(d.InFlightStepIDs, ", ")
		}
		fmt.Fprintf(c.m.Stdout, "drain     cycle %d, paused %s, deadline %s, in flight: %s\n", d.Cycle, e(d.PausedAt), e(d.Deadline), e(inFlight))
		if p := v.Pause; p != nil && p.Reason != "" {
			reason := p.Reason
			if p.StepID != "" {
				reason += " (step " + p.StepID + ")"
			}
			fmt.Fprintln(c.m.Stdout, "reason    "+e(reason))
		}
		if e := v.DrainETA; e != nil {
			if len(e.Unknown) > 0 {
				fmt.Fprintf(c.m.Stdout, "eta       unknown: no history enough for %s (3 earlier durations at least)\n", escapeText(strings.Join(e.Unknown, ", ")))
			} else {
				now := time.Now()
				fmt.Fprintf(c.m.Stdout, "eta       drained in %s (even odds) to %s (9 in 10): %s .. %s, from %d earlier durations\n",
					left(now, e.P50), left(now, e.P90), escapeText(e.P50), escapeText(e.P90), e.Samples)
			}
		}
		if p := v.Pause; p != nil && p.ResumeAt != "" {
			fmt.Fprintf(c.m.Stdout, "resumes   on its own at %s (scheduled; a resume or a new pause cancels it)\n", e(p.ResumeAt))
		}
	}
	if v.PausedSeconds > 0 {
		fmt.Fprintf(c.m.Stdout, "paused    %.0fs in all\n", v.PausedSeconds)
	}
	var idle map[string]string // why each idle step's try ended
	for _, s := range v.Steps {
		if s.Idle && s.Status == statestore.StepStatusRunning {
			idle = tryEndReasons(ctx, cf.client(), runID)
			break
		}
	}
	for _, s := range v.Steps {
		status := s.Status
		if s.Idle && s.Status == statestore.StepStatusRunning {
			status = "IDLE"
		}
		line := fmt.Sprintf("step      %-24s %-8s attempt %d", e(s.StepID), e(status), s.LogicalAttemptID)
		switch {
		case status == "IDLE":
			why := "try ended"
			if r := idle[tryKey(s.StepID, s.LogicalAttemptID)]; r != "" {
				why += ": " + e(r)
			}
			if statestore.IsTerminalRunStatus(v.Status) {
				line += "  (" + why + "; the run ended before another try)"
			} else {
				line += "  (" + why + "; waits for its next try, not in flight)"
			}
		case s.Held && s.Status == "FAILED":
			line += "  HELD (retry it: " + shellCommand("retry", v.RunID, s.StepID) + ")"
		case s.RetryRequested:
			line += "  retry requested"
		}
		if s.Error != nil {
			line += "  " + e(s.Error.Code) + ": " + e(strings.TrimSpace(s.Error.Message))
		}
		fmt.Fprintln(c.m.Stdout, line)
	}
	return nil
}

// tryEndReasons reads the run's log for the reason of each idle step's
// last RunStepTryEnded, by tryKey; the snapshot says only that the step is
// idle. A log that cannot be read gives none (the line then says less).
func tryEndReasons(ctx context.Context, client *httpapi.Client, runID string) map[string]string {
	reasons := map[string]string{}
	var after int64
	for {
		page, err := client.Events(ctx, runID, after, 0)
		if err != nil || len(page.Events) == 0 {
			return reasons
		}
		for _, e := range page.Events {
			if e.EventType != statestore.RunStepTryEnded {
				continue
			}
			var p struct {
				StepID               string `json:"stepId"`
				StepLogicalAttemptID int64  `json:"stepLogicalAttemptId"`
				Reason               string `json:"reason"`
			}
			if json.Unmarshal(e.Payload, &p) == nil {
				reasons[tryKey(p.StepID, p.StepLogicalAttemptID)] = p.Reason
			}
		}
		if page.NextAfterSeq <= after {
			return reasons
		}
		after = page.NextAfterSeq
	}
}

func tryKey(stepID string, attempt int64) string { return fmt.Sprintf("%s|%d", stepID, attempt) }
