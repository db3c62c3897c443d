package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// AuditCommand lists the control actions of a run from its log: "sidecar
// audit RUN [--since D|TIME]".
type AuditCommand struct{ m *Main }

// auditEntry is one line of the audit: a control action recorded in the
// log (pause, resume, cancel, retry step) or what became of it (a drain's
// end, the cancel done).
type auditEntry struct {
	At     string `json:"at"`
	RunID  string `json:"runId"`
	Action string `json:"action"`
	// By is the requestedBy of the action: the authenticated principal
	// when the API has authentication, else what the request said;
	// "conductor" for an action taken in Conductor, "schedule" for a
	// scheduled resume, "sidecar ..." for the sidecar's own.
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
	Cycle  int64  `json:"cycle,omitempty"`
	StepID string `json:"stepId,omitempty"`
	Detail string `json:"detail,omitempty"`
	RunSeq int64  `json:"runSeq"`
}

// maxAuditRuns bounds the runs "audit -l" reads (one log each).
const maxAuditRuns = 1000

// Run implements "sidecar audit".
func (c *AuditCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("audit", "audit RUN_ID | -l SELECTOR [--plan P] [--since 24h | --since 2026-11-23T06:00:00Z] [--server URL] [-o json]")
	var cf clientFlags
	cf.register(fs)
	since := fs.String("since", "", "only actions at or after this time (RFC 3339), or this long ago (e.g. 24h)")
	var q runQuery
	q.register(fs)
	pos, err := cf.parseUpTo(fs, args, 1)
	if err != nil {
		return err
	}
	if err := checkIDs(fs, []string{"RUN_ID"}, pos); err != nil {
		return err
	}
	var from time.Time
	if *since != "" {
		if d, derr := time.ParseDuration(*since); derr == nil && d > 0 {
			from = time.Now().Add(-d)
		} else if from, err = time.Parse(time.RFC3339Nano, *since); err != nil {
			return usageError(fs, "--since must be a duration (24h) or an RFC 3339 time")
		}
	}
	client := cf.client()
	runIDs := pos
	many := len(pos) == 0
	if many {
		vals := q.values()
		if len(vals) == 0 {
			return usageError(fs, "give a RUN_ID, or a filter (-l, --plan, --status, ...) for many runs")
		}
		if !from.IsZero() {
			// Only the runs touched since: an action is an event of its run.
			vals.Set("updatedSince", from.UTC().Format(time.RFC3339Nano))
		}
		list, err := listAll(ctx, client, vals)
		if err != nil {
			return err
		}
		if len(list.Runs) > maxAuditRuns {
			return usageError(fs, "%d runs match (changed since --since, when given); audit reads at most %d logs: narrow the filter or the time", len(list.Runs), maxAuditRuns)
		}
		for _, r := range list.Runs {
			runIDs = append(runIDs, r.RunID)
		}
	}
	var entries []auditEntry
	for _, id := range runIDs {
		es, err := auditRun(ctx, client, id, from)
		if err != nil {
			return err
		}
		entries = append(entries, es...)
	}
	// Each run's entries are in log order; across runs, by time (parsed:
	// RFC 3339 strings with fractions of varying length do not sort).
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].at().Before(entries[j].at()) })
	if cf.output == "json" {
		if entries == nil {
			entries = []auditEntry{}
		}
		return printJSON(c.m.Stdout, entries)
	}
	if len(entries) == 0 {
		fmt.Fprintln(c.m.Stdout, "no control actions")
		return nil
	}
	tw := tabwriter.NewWriter(c.m.Stdout, 0, 0, 2, ' ', 0)
	head := "TIME\tACTION\tBY\tREASON / DETAIL"
	if many {
		head = "TIME\tRUN\tACTION\tBY\tREASON / DETAIL"
	}
	fmt.Fprintln(tw, head)
	for _, e := range entries {
		why := e.Reason
		if e.Detail != "" {
			why = strings.TrimPrefix(why+"; "+e.Detail, "; ")
		}
		at, by, why := escapeText(e.At), escapeText(orDash(e.By)), escapeText(orDash(why))
		if many {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", at, escapeText(e.RunID), e.Action, by, why)
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", at, e.Action, by, why)
		}
	}
	return tw.Flush()
}

// auditRun reads a run's log and returns its control actions from from on.
func auditRun(ctx context.Context, client *httpapi.Client, runID string, from time.Time) ([]auditEntry, error) {
	var entries []auditEntry
	cursor := int64(0)
	for {
		page, err := client.Events(ctx, runID, cursor, 1000)
		if err != nil {
			return nil, err
		}
		for i := range page.Events {
			if e, ok := auditOf(&page.Events[i]); ok && !before(e.At, from) {
				e.RunID = runID
				entries = append(entries, e)
			}
		}
		cursor = page.NextAfterSeq
		if len(page.Events) < 1000 {
			return entries, nil
		}
	}
}

func (e *auditEntry) at() time.Time {
	t, _ := time.Parse(time.RFC3339Nano, e.At)
	return t
}

func before(at string, from time.Time) bool {
	if from.IsZero() {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	return err == nil && t.Before(from)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orZero(v *float64) float64 {
	if v == nil {
		return 0
	}
	return *v
}

// auditOf turns a control event into an audit entry.
func auditOf(r *statestore.RunEventRecord) (auditEntry, bool) {
	e := auditEntry{At: r.PersistedAt, RunSeq: r.RunSeq}
	tp, _ := statestore.DecodePayload(r.EventType, r.Payload)
	switch p := tp.(type) {
	case *statestore.RunPausedPayload:
		e.By, e.Reason = p.RequestedBy, p.Reason
		e.Action, e.Cycle, e.StepID = "pause", r.LogicalAttemptID, p.StepID
		var timeout int64
		if p.DrainTimeoutSeconds != nil {
			timeout = *p.DrainTimeoutSeconds
		}
		e.Detail = fmt.Sprintf("cycle %d, drain timeout %ds", r.LogicalAttemptID, timeout)
		if p.StepID != "" {
			e.Detail += ", step " + p.StepID + " failed"
		}
		if p.ResumeAt != "" {
			e.Detail += ", resumes at " + p.ResumeAt
		}
	case *statestore.RunResumedPayload:
		e.By, e.Reason = p.RequestedBy, p.Reason
		e.Action, e.Cycle = "resume", r.LogicalAttemptID
		e.Detail = fmt.Sprintf("cycle %d", r.LogicalAttemptID)
	case *statestore.RunCancelRequestedPayload:
		e.By, e.Reason = p.RequestedBy, p.Reason
		e.Action = "cancel"
	case *statestore.RunStepRetryRequestedPayload:
		e.By, e.Reason = p.RequestedBy, p.Reason
		e.Action, e.StepID = "retry step", p.StepID
		e.Detail = "step " + p.StepID
	case *statestore.RunDrainCompletedPayload:
		e.Action, e.Cycle = "drain completed", r.LogicalAttemptID
		e.Detail = fmt.Sprintf("cycle %d, waited %.1fs", r.LogicalAttemptID, orZero(p.WaitedSeconds))
	case *statestore.RunDrainTimedOutPayload:
		e.Action, e.Cycle = "drain timed out", r.LogicalAttemptID
		e.Detail = fmt.Sprintf("PAUSE_DRAIN_TIMEOUT, cycle %d, still running: %s", r.LogicalAttemptID, strings.Join(p.InFlightStepIDs, ", "))
	case *statestore.RunCancelledPayload:
		e.By, e.Reason = p.RequestedBy, p.Reason
		e.Action = "cancelled"
	default:
		return e, false
	}
	return e, true
}
