package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/runlist"
)

// RunsCommand lists runs: "sidecar runs [-l SELECTOR] [--plan P] ...".
type RunsCommand struct{ m *Main }

// Run implements "sidecar runs".
func (c *RunsCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("runs", "runs [-l SELECTOR] [--plan P] [--plan-version V] [--status S[,S]] [--draining] [--tenant T] [--archived] [-o text|wide|json|yaml|name] [--no-headers] [-w]")
	cf := clientFlags{wide: true, named: true}
	cf.register(fs)
	var q runQuery
	q.register(fs)
	watch := fs.Bool("w", false, "after the list, print each run that changes (Ctrl-C to stop)")
	noHeaders := fs.Bool("no-headers", false, "print the table without its header line")
	archived := fs.Bool("archived", false, "after the runs in hot state, list those that left it, from the archive (their status reads COMPLETED/ARCHIVED and so on; -o json marks them archived)")
	if _, err := cf.parse(fs, args); err != nil {
		return err
	}
	client := cf.client()
	lq := q.values()
	if *archived {
		lq.Set("include", httpapi.IncludeArchived)
	}
	list, err := listAll(ctx, client, lq)
	if err != nil && (list == nil || *watch) {
		return err
	}
	// A later page that failed (the archive away, while the runs in hot
	// state were listed): what was read is printed, then the failure.
	partial := err
	for _, u := range list.Unreadable {
		which := fmt.Sprintf("manifest %d", u.From)
		if u.Through != u.From {
			which = fmt.Sprintf("manifests %d to %d", u.From, u.Through)
		}
		fmt.Fprintf(c.m.Stderr, "warning: the archive's %s could not be read (%s): the archived runs listed there are missing here; sidecar archive verify says what is wrong\n", which, u.Code)
	}
	if (cf.output == "json" || cf.output == "yaml") && !*watch {
		if perr := cf.print(c.m.Stdout, list); perr != nil {
			return perr
		}
		return partial
	}
	t := runTable{out: c.m.Stdout, errw: c.m.Stderr, output: cf.output, header: *noHeaders, now: time.Now}
	t.print(list.Runs, true)
	if !*watch {
		if len(list.Runs) == 0 && !cf.structured() && partial == nil {
			fmt.Fprintln(c.m.Stderr, "no runs match")
		}
		return partial
	}
	shown := map[string]bool{}
	for _, r := range list.Runs {
		shown[r.RunID] = true
	}
	return followRuns(ctx, client, q.values(), list.Revision, shown, &t)
}

// runQuery is the filter flags of "runs" (and of the bulk actions).
type runQuery struct {
	selector, plan, planVersion, status, tenant, project, environment string
	draining                                                          bool
}

func (q *runQuery) register(fs interface {
	StringVar(*string, string, string, string)
	BoolVar(*bool, string, bool, string)
}) {
	fs.StringVar(&q.selector, "l", "", `label selector, as kubectl's: "team=data,tier!=gold", "tier in (gold,silver)"`)
	fs.StringVar(&q.plan, "plan", "", "only runs of this planId")
	fs.StringVar(&q.planVersion, "plan-version", "", "only runs of this planVersion")
	fs.StringVar(&q.status, "status", "", "only runs in these statuses (comma separated: RUNNING,PAUSED,...)")
	fs.BoolVar(&q.draining, "draining", false, "only PAUSED runs whose drain is not over (substatus DRAINING)")
	fs.StringVar(&q.tenant, "tenant", "", "only runs of this tenantId")
	fs.StringVar(&q.project, "project", "", "only runs of this projectId")
	fs.StringVar(&q.environment, "environment", "", "only runs of this environmentId")
}

func (q *runQuery) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"labelSelector": q.selector, "planId": q.plan, "planVersion": q.planVersion, "status": q.status,
		"tenantId": q.tenant, "projectId": q.project, "environmentId": q.environment} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if q.draining {
		v.Set("substatus", "DRAINING")
	}
	return v
}

// listAll reads every page of a listing. A page that fails ends it with
// the error and the pages read before (nil when the first failed), their
// Continue the failed page's token.
func listAll(ctx context.Context, client *httpapi.Client, q url.Values) (*httpapi.RunList, error) {
	var all *httpapi.RunList
	for {
		page, err := client.ListRuns(ctx, q)
		if err != nil {
			return all, err
		}
		if all == nil {
			all = page
		} else {
			all.Runs = append(all.Runs, page.Runs...)
			all.Unreadable = append(all.Unreadable, page.Unreadable...)
			all.Continue = page.Continue
		}
		if page.Continue == "" {
			return all, nil
		}
		q.Set("continue", page.Continue)
	}
}

// followRuns prints the runs that change after revision until ctx ends:
// those that match the filter, and once more those shown before that
// left it (their new status says where they went).
func followRuns(ctx context.Context, client *httpapi.Client, q url.Values, revision uint64, shown map[string]bool, t *runTable) error {
	q.Del("continue")
	q.Set("watch", "true")
	q.Set("timeoutSeconds", "30")
	backoff := time.Second
	for {
		q.Set("revision", strconv.FormatUint(revision, 10))
		page, err := client.ListRuns(ctx, q)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			var ae *httpapi.Error
			if errors.As(err, &ae) && ae.Status < 500 {
				return err
			}
			fmt.Fprintf(t.errw, "watch: %v (again in %s)\n", err, backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = time.Second
		var rows []httpapi.ListedRun
		for _, r := range page.Runs {
			switch {
			case r.Matches == nil || *r.Matches:
				shown[r.RunID] = true
				rows = append(rows, r)
			case shown[r.RunID]:
				delete(shown, r.RunID)
				rows = append(rows, r)
			}
		}
		t.print(rows, false)
		revision = page.Revision
	}
}

// runTable prints runs as kubectl prints resources: a table (text, wide),
// or each run as JSON (one a line), YAML (documents) or its id (name). A
// watch's later rows line up with the first screen's columns.
type runTable struct {
	out    io.Writer
	errw   io.Writer
	output string
	header bool  // printed once (or not wanted: --no-headers)
	widths []int // of the columns so far
	now    func() time.Time
}

func (t *runTable) print(rows []httpapi.ListedRun, first bool) {
	switch t.output {
	case "json":
		for _, r := range rows {
			_ = printJSONLine(t.out, r)
		}
		return
	case "yaml":
		for _, r := range rows {
			fmt.Fprintln(t.out, "---")
			_ = printYAML(t.out, r)
		}
		return
	case "name":
		for _, r := range rows {
			fmt.Fprintln(t.out, escapeText(r.RunID))
		}
		return
	}
	if len(rows) == 0 && !first {
		return
	}
	wide := t.output == "wide"
	var lines [][]string
	if !t.header {
		cols := []string{"RUN", "PLAN", "STATUS", "STEPS", "IN-FLIGHT", "DRAIN ETA", "AGE"}
		if wide {
			cols = append(cols, "VERSION", "TENANT", "LABELS", "PAUSE REASON", "RESUMES")
		}
		lines = append(lines, cols)
		t.header = true
	}
	for _, r := range rows {
		status := r.Status
		if r.Substatus != "" {
			status += "/" + r.Substatus
		}
		if r.Archived {
			status += "/ARCHIVED" // left hot state: read-only, from the archive
		}
		e := escapeText // every string from the API: one cell, one line
		line := []string{e(r.RunID), e(r.PlanID), e(status), stepsCell(&r.Row), strconv.Itoa(r.InFlight),
			e(etaString(t.now(), r.DrainETA)), e(age(t.now(), r.CreatedAt))}
		if wide {
			line = append(line, e(r.PlanVersion), e(r.TenantID), e(optional(labelString(r.Labels), "-")),
				e(optional(r.PauseReason, "-")), e(optional(r.ResumeAt, "-")))
		}
		lines = append(lines, line)
	}
	for _, l := range lines {
		for i, cell := range l {
			if i == len(t.widths) {
				t.widths = append(t.widths, 0)
			}
			t.widths[i] = max(t.widths[i], utf8.RuneCountInString(cell))
		}
	}
	var b strings.Builder
	for _, l := range lines {
		b.Reset()
		for i, cell := range l {
			if i == len(l)-1 {
				b.WriteString(cell)
				break
			}
			b.WriteString(cell)
			b.WriteString(strings.Repeat(" ", t.widths[i]-utf8.RuneCountInString(cell)+3))
		}
		fmt.Fprintln(t.out, b.String())
	}
}

// countOf is n noun, with noun in the plural unless n is 1: "1 run",
// "2 runs".
func countOf[N int | int64 | uint64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// stepsCell is a run's STEPS: its steps done of its plan's, done/? when
// the sidecar could not read the plan.
func stepsCell(r *runlist.Row) string {
	if r.PlanSteps == 0 {
		return fmt.Sprintf("%d/?", r.Done)
	}
	return fmt.Sprintf("%d/%d", r.Done, max(r.PlanSteps, r.Steps))
}

// age prints the time since at as kubectl does: 42s, 5m, 3h, 2d.
func age(now time.Time, at string) string {
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(int(d/time.Second), 0))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

func labelString(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + l[k]
	}
	return strings.Join(keys, ",")
}

// etaString prints a drain estimate as the time left at p50/p90 ("12s/30s"),
// "unknown" without history, "-" without a drain.
func etaString(now time.Time, eta *runlist.ETA) string {
	if eta == nil {
		return "-"
	}
	if len(eta.Unknown) > 0 {
		return "unknown"
	}
	return left(now, eta.P50) + "/" + left(now, eta.P90)
}

// left is the time from now to at, rounded to the second.
func left(now time.Time, at string) string {
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return "?"
	}
	return max(t.Sub(now), 0).Round(time.Second).String()
}
