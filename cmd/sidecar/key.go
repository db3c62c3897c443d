package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// KeyCommand prints the idempotencyKey of an event (Run Events Contract
// §3.1). Omitting --step-id means a run-level event.
type KeyCommand struct{ m *Main }

// Run implements "sidecar key".
func (c *KeyCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("key", "key --run-id R [--step-id S] --attempt N --event-type T [--extension] --plan-id P --plan-version V")
	runID := fs.String("run-id", "", "runId (required)")
	stepID := fs.String("step-id", "", "stepId of a step-level event; omit for a run-level event")
	attempt := fs.Int64("attempt", 0, "logicalAttemptId, an integer >= 1 (required)")
	eventType := fs.String("event-type", "", "eventType, e.g. StepStarted (required)")
	planID := fs.String("plan-id", "", "planId (required)")
	planVersion := fs.String("plan-version", "", "planVersion (required)")
	extension := fs.Bool("extension", false, "--event-type is an extension type of your own, not of the contract: compute its key anyway")
	if err := parse(fs, args); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{
		{"run-id", *runID}, {"event-type", *eventType}, {"plan-id", *planID}, {"plan-version", *planVersion},
	} {
		if f.v == "" {
			return usageError(fs, "--%s is required", f.name)
		}
	}
	if *attempt < 1 {
		return usageError(fs, "--attempt must be an integer >= 1")
	}
	in := statestore.KeyInput{RunID: *runID, StepID: *stepID, LogicalAttemptID: *attempt,
		EventType: *eventType, PlanID: *planID, PlanVersion: *planVersion}
	if err := in.Validate(); err != nil {
		var e *statestore.Error
		if errors.As(err, &e) {
			return usageError(fs, "%s %s", flagOf(e.Field), e.Message)
		}
		return usageError(fs, "%v", err)
	}
	if !statestore.IsKnownEvent(in.EventType) && !*extension {
		// The contract allows unknown types (stored, never applied), but a
		// typo is the likelier cause: a wrong key is worse than none.
		return usageError(fs, "--event-type %q is not an event type of the contract or its extensions (%s); pass --extension if it is a type of your own",
			in.EventType, strings.Join(knownEventTypes(), ", "))
	}
	_, err := fmt.Fprintln(c.m.Stdout, in.Key())
	return err
}

// knownEventTypes are the event types the projector gives semantics, sorted.
func knownEventTypes() []string {
	var out []string
	for _, t := range statestore.RunTransitions {
		out = append(out, t.Event)
	}
	for t := range statestore.StepTransitions {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

func flagOf(field string) string {
	switch field {
	case "runId":
		return "--run-id"
	case "stepId":
		return "--step-id"
	case "eventType":
		return "--event-type"
	case "planId":
		return "--plan-id"
	case "planVersion":
		return "--plan-version"
	case "logicalAttemptId":
		return "--attempt"
	}
	return field
}
