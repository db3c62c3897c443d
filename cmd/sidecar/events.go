package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/vocab"
)

// EventsCommand prints a run's event log: "sidecar events RUN [--follow]".
type EventsCommand struct{ m *Main }

// Run implements "sidecar events".
func (c *EventsCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("events", "events RUN_ID [--follow] [--after-seq N] [--vocabulary core|noetl] [--server URL] [-o json]")
	var cf clientFlags
	cf.register(fs)
	// Events stream: -o json is JSON Lines, an object per event as it
	// comes (jq takes it as is; jq -s makes an array).
	fs.Lookup("o").Usage = "output format: text, or json: one JSON object per line (JSON Lines), as --follow prints them"
	follow := fs.Bool("follow", false, "keep printing new events until the run ends (or Ctrl-C)")
	after := fs.Int64("after-seq", 0, "print events with runSeq greater than this")
	interval := fs.Duration("interval", 500*time.Millisecond, "poll interval with --follow")
	vocabulary := fs.String("vocabulary", "", "print the log as Core Events Specification v1.0 events (core) or NoETL Runtime Event Model v10 events (noetl), one JSON object per line")
	pos, err := cf.parse(fs, args, "RUN_ID")
	if err != nil {
		return err
	}
	runID := pos[0]
	client := cf.client()
	if *vocabulary != "" {
		if *follow || *after != 0 {
			return usageError(fs, "--vocabulary translates the whole log: not with --follow or --after-seq")
		}
		if *vocabulary != vocab.Core && *vocabulary != vocab.NoETL {
			return usageError(fs, "--vocabulary must be %s or %s", vocab.Core, vocab.NoETL)
		}
		return c.translate(ctx, client, runID, *vocabulary)
	}
	cursor := *after
	for {
		page, err := client.Events(ctx, runID, cursor, 1000)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, r := range page.Events {
			if err := c.print(cf.output, &r); err != nil {
				return err
			}
		}
		cursor = page.NextAfterSeq
		if len(page.Events) == 1000 {
			continue
		}
		if !*follow {
			return nil
		}
		v, err := client.Run(ctx, runID)
		if err == nil && statestore.IsTerminalRunStatus(v.Status) && v.LastEventSeq <= cursor {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*interval):
		}
	}
}

func (c *EventsCommand) print(output string, r *statestore.RunEventRecord) error {
	if output == "json" {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(c.m.Stdout, string(b))
		return err
	}
	step, which := "-", fmt.Sprintf("attempt %d.%d", r.LogicalAttemptID, r.EngineAttemptID)
	if r.StepID != "" {
		step = r.StepID
	} else {
		// A run-level event: its number counts events of its kind in the
		// run (a pause's cycle, a try event's), and the step some of them
		// concern is in the payload.
		which = fmt.Sprintf("#%d", r.LogicalAttemptID)
		switch r.EventType {
		case statestore.RunPaused, statestore.RunResumed, statestore.RunDrainCompleted, statestore.RunDrainTimedOut:
			which = fmt.Sprintf("cycle %d", r.LogicalAttemptID)
		}
		var p struct {
			StepID               string `json:"stepId"`
			StepLogicalAttemptID int64  `json:"stepLogicalAttemptId"`
			EngineAttemptID      int64  `json:"engineAttemptId"`
		}
		if json.Unmarshal(r.Payload, &p) == nil && p.StepID != "" {
			attempt := fmt.Sprintf("attempt %d", p.StepLogicalAttemptID)
			if p.EngineAttemptID > 0 {
				attempt += fmt.Sprintf(".%d", p.EngineAttemptID) // the try a try event is of
			}
			step, which = p.StepID, attempt+", "+which
		}
	}
	_, err := fmt.Fprintf(c.m.Stdout, "%6d  %-30s  %-20s  %-20s  %s\n",
		r.RunSeq, escapeText(r.PersistedAt), escapeText(r.EventType), escapeText(step), which)
	return err
}

// translate prints the whole log of runID in vocabulary v.
func (c *EventsCommand) translate(ctx context.Context, client *httpapi.Client, runID, v string) error {
	var recs []statestore.RunEventRecord
	cursor := int64(0)
	for {
		page, err := client.Events(ctx, runID, cursor, 1000)
		if err != nil {
			return err
		}
		recs = append(recs, page.Events...)
		cursor = page.NextAfterSeq
		if len(page.Events) < 1000 {
			break
		}
	}
	events, err := vocab.Translate(v, recs)
	if err != nil {
		return err
	}
	for _, e := range events {
		if err := printJSONLine(c.m.Stdout, e); err != nil {
			return err
		}
	}
	return nil
}
