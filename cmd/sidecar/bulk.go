package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// bulkFlags are the flags of the bulk form of pause, resume and cancel.
type bulkFlags struct {
	q                            runQuery
	all, dryRun, wait            bool
	reason, idemKey              string
	timeout, resumeFor, interval time.Duration
	resumeUntil, maxRate         string
	batch                        int64
}

func (b *bulkFlags) register(fs *flag.FlagSet, action string) {
	fs.StringVar(&b.q.selector, "l", "", `label selector, as kubectl's: "team=data,tier!=gold"`)
	fs.StringVar(&b.q.plan, "plan", "", "only runs of this planId")
	fs.StringVar(&b.q.planVersion, "plan-version", "", "only runs of this planVersion")
	fs.StringVar(&b.q.tenant, "tenant", "", "only runs of this tenantId")
	fs.StringVar(&b.q.project, "project", "", "only runs of this projectId")
	fs.StringVar(&b.q.environment, "environment", "", "only runs of this environmentId")
	fs.BoolVar(&b.all, "all", false, "act on every run (no filter)")
	fs.StringVar(&b.reason, "reason", "", "why (required, but not for --dry-run; recorded in every run's event)")
	fs.BoolVar(&b.dryRun, "dry-run", false, "list the runs that would be acted on, with their in-flight steps; change nothing")
	fs.StringVar(&b.idemKey, "idempotency-key", "", "send this Idempotency-Key: repeating the command with the same key returns the first answer")
	switch action {
	case "pause":
		fs.DurationVar(&b.timeout, "timeout", 0, "drain timeout of these pauses (default: the sidecar's --drain-timeout)")
		fs.DurationVar(&b.resumeFor, "for", 0, "resume the runs on their own after this long")
		fs.StringVar(&b.resumeUntil, "until", "", "resume the runs on their own at this RFC 3339 time")
		fs.BoolVar(&b.wait, "wait", false, "show the drains' progress until all are drained (exit 0) or one timed out (exit 3)")
	case "resume":
		fs.StringVar(&b.maxRate, "max-rate", "", "resume this many runs a second, evenly (e.g. 10/s): the first now, the rest scheduled; after a restart the rest catch up at this rate")
		fs.Int64Var(&b.batch, "batch", 0, "resume this many runs now, and as many again every --interval")
		fs.DurationVar(&b.interval, "interval", 0, "the wait between batches of --batch")
	}
}

// bulkSynopsis is the bulk form's usage line.
func bulkSynopsis(action string) string {
	synopsis := action + " -l SELECTOR | --plan P | --all  --reason R [--dry-run] [--idempotency-key K] [-o json|yaml|name]"
	switch action {
	case "pause":
		synopsis += " [--timeout D] [--for D | --until TIME] [--wait]"
	case "resume":
		synopsis += " [--max-rate N/s | --batch N --interval D]"
	}
	return synopsis
}

// bulkFlagSet is the bulk form's flag set.
func (c *ControlCommand) bulkFlagSet() (*flag.FlagSet, *bulkFlags, *clientFlags) {
	fs := c.m.newFlagSet(c.action, bulkSynopsis(c.action))
	cf := &clientFlags{named: true}
	cf.register(fs)
	b := &bulkFlags{}
	b.register(fs, c.action)
	return fs, b, cf
}

// bulk runs "sidecar pause|resume|cancel -l SELECTOR ..." : the action on
// every run the filter selects (POST /v1/runs:<action>).
func (c *ControlCommand) bulk(ctx context.Context, args []string) error {
	fs, b, cf := c.bulkFlagSet()
	if _, err := cf.parse(fs, args); err != nil {
		return err
	}
	q, all, reason, dryRun, idemKey := b.q, &b.all, &b.reason, &b.dryRun, &b.idemKey
	timeout, resumeFor, interval, resumeUntil, maxRate, batch, wait := b.timeout, b.resumeFor, b.interval, b.resumeUntil, b.maxRate, b.batch, b.wait
	if len(q.values()) == 0 && !*all {
		return usageError(fs, "give a RUN_ID, or for many runs a filter (-l, --plan, --tenant, ...) or --all")
	}
	if *reason == "" && !*dryRun {
		// A preview changes nothing and needs no justification.
		return usageError(fs, "--reason is required for a bulk %s (a --dry-run needs none)", c.action)
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
	if wait && !*dryRun {
		if _, err := client.ListRuns(ctx, url.Values{"status": {"PAUSED"}}); deniedRead(err) {
			return waitDenied(c.action, err)
		}
	}
	res, err := client.Bulk(ctx, c.action, req)
	if err != nil {
		return err
	}
	if len(res.Runs) == 0 && !*all {
		// A filter that selects nothing is most often a typo: a script
		// must not take it for the action done.
		return errNoMatch{c.action}
	}
	if cf.structured() && !wait {
		return cf.print(c.m.Stdout, res, bulkNames(res)...)
	}
	if !cf.structured() {
		printBulk(c.m, res)
	}
	if !wait || *dryRun {
		return nil
	}
	return c.waitBulk(ctx, client, res, cf.output)
}

// bulkNames are the runs of a bulk answer, for -o name.
func bulkNames(res *httpapi.BulkResult) []string {
	names := make([]string, len(res.Runs))
	for i, r := range res.Runs {
		names[i] = r.RunID
	}
	return names
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
		case r.Outcome == httpapi.OutcomeQueued:
			detail = "waits for admission, not paused: it starts when capacity frees (cancel it to keep it from starting)"
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
	fmt.Fprintf(m.Stdout, "%s: %s: %s\n", what, countOf(len(res.Runs), "run"), strings.Join(outcomes, ", "))
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
		p := progressOf(want, list.Runs, time.Now())
		if p.state != last && output == "text" {
			fmt.Fprintln(c.m.Stdout, p.line)
		}
		last = p.state
		if p.drained+p.timedOut+p.gone == len(want) {
			if p.timedOut > 0 {
				return errDrainTimedOut{runID: fmt.Sprintf("(%d of the runs)", p.timedOut)}
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

// bulkProgress is the progress of a bulk pause's drains: state counts them
// (a line is printed when it changes, not as time passes), line adds the
// time left of the slowest.
type bulkProgress struct {
	drained, timedOut, gone int
	state, line             string
}

// progressOf is the progress of the drains of the runs in want, from the
// PAUSED runs listed at now.
func progressOf(want map[string]bool, runs []httpapi.ListedRun, now time.Time) bulkProgress {
	p := bulkProgress{gone: len(want)}
	inFlight := 0
	var slowest time.Time // the latest p90 among the drains
	unknown := 0          // drains without an estimate
	for _, r := range runs {
		if !want[r.RunID] {
			continue
		}
		p.gone--
		switch {
		case r.DrainTimedOut:
			p.timedOut++
		case r.Substatus == "":
			p.drained++
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
	p.state = fmt.Sprintf("drained %d/%d, steps in flight %d, drain timed out %d, no longer paused %d", p.drained, len(want), inFlight, p.timedOut, p.gone)
	p.line = p.state
	if !slowest.IsZero() {
		p.line += ", slowest drained in " + max(slowest.Sub(now), 0).Round(time.Second).String() + " (p90)"
	}
	if unknown > 0 {
		p.line += fmt.Sprintf(", %d without an estimate", unknown)
	}
	return p
}
