package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"

	"github.com/conductor-sidecar/sidecar/httpapi"
)

// errNoBus: the sidecar serves no event bus (its bus endpoints are not
// there).
var errNoBus = errors.New("no event bus: the sidecar runs without sinks (serve --bus-sink; README.md)")

// noBus turns the API's answer for a missing bus endpoint into errNoBus.
func noBus(err error) error {
	var ae *httpapi.Error
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound && ae.Code == httpapi.CodeNotFound {
		return errNoBus
	}
	return err
}

// BusCommand shows the event bus and replays its dead letters:
//
//	sidecar bus                                   the sinks: cursor, lag, dead letters
//	sidecar bus deadletters [--sink S]            the dead letters, oldest first
//	sidecar bus replay --sink S [--key K ...]         deliver them again (all of S's without keys)
type BusCommand struct{ m *Main }

// Run implements "sidecar bus".
func (c *BusCommand) Run(ctx context.Context, args []string) error {
	sub := ""
	if len(args) > 0 && (args[0] == "deadletters" || args[0] == "replay") {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "deadletters":
		return c.deadLetters(ctx, args)
	case "replay":
		return c.replay(ctx, args)
	}
	fs := c.m.newFlagSet("bus", "bus [deadletters [--sink S] | replay --sink S [--key K ...]] [--server URL] [-o json]")
	var cf clientFlags
	cf.register(fs)
	if _, err := cf.parse(fs, args); err != nil {
		return err
	}
	st, err := cf.client().Bus(ctx)
	if errors.Is(noBus(err), errNoBus) {
		fmt.Fprintln(c.m.Stderr, errNoBus.Error())
		return nil
	}
	if err != nil {
		return err
	}
	if cf.output == "json" {
		return printJSON(c.m.Stdout, st)
	}
	tw := tabwriter.NewWriter(c.m.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SINK\tVOCABULARY\tCURSOR\tBEHIND\tDEAD LETTERS")
	for _, s := range st.Sinks {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\n", escapeText(s.Name), escapeText(s.Vocabulary), s.Cursor, s.LastSeq-min(s.LastSeq, s.Cursor), s.DeadLetters)
	}
	return tw.Flush()
}

func (c *BusCommand) deadLetters(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("bus deadletters", "bus deadletters [--sink S] [--limit N] [--server URL] [-o json]")
	var cf clientFlags
	cf.register(fs)
	sink := fs.String("sink", "", "only this sink's")
	limit := fs.Int("limit", 1000, "at most this many")
	if _, err := cf.parse(fs, args); err != nil {
		return err
	}
	client := cf.client()
	var all []httpapi.DeadLetterList
	q := url.Values{"sink": {*sink}}
	n := 0
	for n < *limit {
		q.Set("limit", strconv.Itoa(min(*limit-n, httpapi.MaxDeadLetterLimit)))
		page, err := client.DeadLetters(ctx, q)
		if err != nil {
			return noBus(err)
		}
		all = append(all, *page)
		n += len(page.DeadLetters)
		if page.Next == "" {
			break
		}
		q.Set("after", page.Next)
	}
	if cf.output == "json" {
		for _, p := range all {
			for _, d := range p.DeadLetters {
				if err := printJSONLine(c.m.Stdout, d); err != nil {
					return err
				}
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(c.m.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tEVENT\tRUN\tATTEMPTS\tDEAD AT\tERROR")
	for _, p := range all {
		for _, d := range p.DeadLetters {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", escapeText(d.Key), escapeText(d.EventType), escapeText(d.RunID), d.Attempts, d.DeadAt.Format("2006-01-02T15:04:05Z"), escapeText(d.Error))
		}
	}
	return tw.Flush()
}

func (c *BusCommand) replay(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("bus replay", "bus replay --sink S [--key K ...] [--server URL] [-o json]")
	var cf clientFlags
	cf.register(fs)
	sink := fs.String("sink", "", "the sink whose dead letters to deliver again (required)")
	var keys []string
	fs.Var(&listValue{p: &keys}, "key", "a dead letter's key (repeat, or comma separated; none: all of the sink's)")
	if _, err := cf.parse(fs, args); err != nil {
		return err
	}
	if *sink == "" {
		return usageError(fs, "--sink is required")
	}
	res, err := cf.client().Replay(ctx, httpapi.ReplayRequest{Sink: *sink, Keys: keys})
	if err != nil {
		return noBus(err)
	}
	if cf.output == "json" {
		if err := printJSON(c.m.Stdout, res); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(c.m.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tOUTCOME\tERROR")
		for _, r := range res.Results {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", escapeText(r.Key), escapeText(r.Outcome), escapeText(r.Error))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	// Exit 1 unless every dead letter asked for was delivered: one kept
	// (failed again) or not found (another tenant's, or no such key).
	if failed, missing := res.Counts["failed"], res.Counts["not_found"]; failed+missing > 0 {
		return fmt.Errorf("%d of %d dead letters not delivered: %d failed again (kept), %d not found", failed+missing, len(res.Results), failed, missing)
	}
	return nil
}
