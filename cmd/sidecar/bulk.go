package main

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// bulk runs "sidecar pause|resume|cancel -l SELECTOR ..." : the action on
// every run the filter selects (POST /v1/runs:<action>).
func (c *ControlCommand) bulk(ctx context.Context, args []string) error {
	synopsis := c.action + " -l SELECTOR | --plan P | --all  --reason R [--dry-run] [--idempotency-key K] [-o json]"
	switch c.action {
	case "pause":
		synopsis += " [--timeout D] [--for D | --until TIME] [--wait]"
	case "resume":
		synopsis += " [--max-rate N/s | --batch N --interval D]"
	}
	fs := c.m.newFlagSet(c.action, synopsis)
	var cf clientFlags
	cf.register(fs)
	var q runQuery
	fs.StringVar(&q.selector, "l", "", `label selector, as kubectl's: "team=data,tier!=gold"`)
	fs.StringVar(&q.plan, "plan", "", "only runs of this planId")
	fs.StringVar(&q.planVersion, "plan-version", "", "only runs of this planVersion")
	fs.StringVar(&q.tenant, "tenant", "", "only runs of this tenantId")
	fs.StringVar(&q.project, "project", "", "only runs of this projectId")
	fs.StringVar(&q.environment, "environment", "", "only runs of this environmentId")
	all := fs.Bool("all", false, "act on every run (no filter)")
	reason := fs.String("reason", "", "why (required; recorded in every run's event)")
	dryRun := fs.Bool("dry-run", false, "list the runs that would be acted on, with their in-flight steps; change nothing")
	idemKey := fs.String("idempotency-key", "", "send this Idempotency-Key: repeating the command with the same key returns the first answer")
	var timeout, resumeFor, interval time.Duration
	var resumeUntil, maxRate string
	var batch int64
	var wait bool
	switch c.action {
	case "pause":
		fs.DurationVar(&timeout, "timeout", 0, "drain timeout of these pauses (default: the sidecar's --drain-timeout)")
		fs.DurationVar(&resumeFor, "for", 0, "resume the runs on their own after this long")
		fs.StringVar(&resumeUntil, "until", "", "resume the runs on their own at this RFC 3339 time")
		fs.BoolVar(&wait, "wait", false, "show the drains' progress until all are drained (exit 0) or one timed out (exit 3)")
	case "resume":
		fs.StringVar(&maxRate, "max-rate", "", "resume this many runs a second, evenly (e.g. 10/s): the first now, the rest scheduled; after a restart the rest catch up at this rate")
		fs.Int64Var(&batch, "batch", 0, "resume this many runs now, and as many again every --interval")
		fs.DurationVar(&interval, "interval", 0, "the wait between batches of --batch")
	}
	if _, err := cf.parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError(fs, "give a RUN_ID first, or a filter (-l, --plan, ...) without one, not both")
	}
	if len(q.values()) == 0 && !*all {
		return usageError(fs, "give a RUN_ID, or for many runs a filter (-l, --plan, --tenant, ...) or --all")
	}
	if *reason == "" {
		return usageError(fs, "--reason is required for a bulk %s", c.action)
	}
	req := httpapi.BulkRequest{LabelSelector: q.selector, PlanID: q.plan, PlanVersion: q.planVersion, TenantID: q.tenant,
		ProjectID: q.project, EnvironmentID: q.environment, All: *all, Reason: *reason, DryRun: *dryRun,
		TimeoutSeconds: int64(timeout / time.Second), ResumeAfterSeconds: int64(resumeFor / time.Second),
		Batch: batch, IntervalSeconds: int64(interval / time.Second)}
	if resumeUntil != "" {
		at, err := time.Parse(time.RFC3339Nano, resumeUntil)
		if err != nil {
			return usageError(fs, "--until must be an RFC 3339 time, e.g. 2026-11-23T06:00:00Z")
		}
		req.ResumeAt = at.UTC().Format(time.RFC3339Nano)
	}
	if maxRate != "" {
		n, err := strconv.ParseFloat(strings.TrimSuffix(maxRate, "/s"), 64)
		if err != nil || n <= 0 {
			return usageError(fs, "--max-rate must be a rate such as 10/s")
		}
		req.MaxPerSecond = n
	}
	client := cf.client()
	client.IdempotencyKey = *idemKey
	res, err := client.Bulk(ctx, c.action, req)
	if err != nil {
		return err
	}
	if cf.output == "json" && !wait {
		return printJSON(c.m.Stdout, res)
	}
	if cf.output != "json" {
		printBulk(c.m, res)
	}
	if !wait || *dryRun {
		return nil
	}
	return c.waitBulk(ctx, client, res, cf.output)
}

func printBulk(m *Main, res *httpapi.BulkResult) {
	tw := tabwriter.NewWriter(m.Stdout, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "RUN\tPLAN\tWAS\tOUTCOME\tDETAIL")
	for _, r := range res.Runs {
		was := r.Status
		if r.Substatus != "" {
			was += "/" + r.Substatus
		}
		detail := "-"
		switch {
		case r.Error != nil:
			detail = r.Error.Code + ": " + r.Error.Message
		case r.ResumeAt != "":
			detail = "resumes at " + r.ResumeAt
		case len(r.InFlightStepIDs) > 0:
			detail = "in flight: " + strings.Join(r.InFlightStepIDs, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", escapeText(r.RunID), escapeText(r.PlanID), escapeText(was), escapeText(r.Outcome), escapeText(detail))
	}
	_ = tw.Flush()
	outcomes := make([]string, 0, len(res.Counts))
	for o, n := range res.Counts {
		outcomes = append(outcomes, fmt.Sprintf("%s %d", o, n))
	}
	sort.Strings(outcomes)
	what := res.Action
	if res.DryRun {
		what += " (dry run: nothing was changed)"
	}
	fmt.Fprintf(m.Stdout, "%s: %d runs: %s\n", what, len(res.Runs), strings.Join(outcomes, ", "))
}

// waitBulk follows the drains of the runs a bulk pause paused, from the
// run list: drained / total and the steps still in flight.
func (c *ControlCommand) waitBulk(ctx context.Context, client *httpapi.Client, res *httpapi.BulkResult, output string) error {
	want := map[string]bool{}
	for _, r := range res.Runs {
		if r.Outcome == httpapi.OutcomePaused || r.Outcome == httpapi.OutcomeAlreadyPaused {
			want[r.RunID] = true
		}
	}
	last := ""
	for {
		list, err := listAll(ctx, client, url.Values{"status": {"PAUSED"}})
		if err != nil {
			return err
		}
		drained, inFlight, timedOut, gone := 0, 0, 0, len(want)
		now := time.Now()
		var slowest time.Time // the latest p90 among the drains
		unknown := 0          // drains without an estimate
		for _, r := range list.Runs {
			if !want[r.RunID] {
				continue
			}
			gone--
			switch {
			case r.DrainTimedOut:
				timedOut++
			case r.Substatus == "":
				drained++
			default:
				inFlight += r.InFlight
				if e := r.DrainETA; e == nil || len(e.Unknown) > 0 {
					unknown++
				} else if t, err := time.Parse(time.RFC3339Nano, e.P90); err == nil && t.After(slowest) {
					slowest = t
				}
			}
		}
		// A run no longer PAUSED (resumed or ended meanwhile) is not waited for.
		line := fmt.Sprintf("drained %d/%d, steps in flight %d, drain timed out %d, no longer paused %d", drained, len(want), inFlight, timedOut, gone)
		if !slowest.IsZero() {
			line += ", slowest drained in " + max(slowest.Sub(now), 0).Round(time.Second).String() + " (p90)"
		}
		if unknown > 0 {
			line += fmt.Sprintf(", %d without an estimate", unknown)
		}
		if line != last && output != "json" {
			fmt.Fprintln(c.m.Stdout, line)
			last = line
		}
		if drained+timedOut+gone == len(want) {
			if timedOut > 0 {
				return errDrainTimedOut{runID: fmt.Sprintf("(%d of the runs)", timedOut)}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
