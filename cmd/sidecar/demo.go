package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// DemoCommand appends one small run to the real JetStream event log
// (embedded NATS server, data on disk) through the EventIdRegistry, shows
// the duplicate handling, a rejected event and the draining pause in the
// projected snapshot, and prints the final snapshot.
type DemoCommand struct{ m *Main }

// Run implements "sidecar demo".
func (c *DemoCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("demo", "demo [--data-dir DIR] [--run-id R]")
	dataDir := fs.String("data-dir", envOr("SIDECAR_DATA_DIR", "./data"), "embedded NATS store directory (env SIDECAR_DATA_DIR)")
	runID := fs.String("run-id", "", "runId of the demo run (default: a new UUID)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *runID == "" {
		*runID = "demo-" + uuid.NewString()
	}
	log := zap.NewNop()
	srv, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: *dataDir, Logger: log})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	store, err := natsstore.Open(ctx, js, natsstore.Options{Logger: log})
	if err != nil {
		return err
	}
	defer store.Close()
	reg, err := registry.Open(ctx, js, registry.Options{Logger: log})
	if err != nil {
		return err
	}
	d := &demo{out: c.m, store: store, emit: registry.NewEmitter(reg, store), runID: *runID}
	fmt.Fprintf(c.m.Stdout, "event log: JetStream stream %s in %s (fsync on every write)\nrun: %s\n\n", store.Stream(), *dataDir, *runID)
	return d.run(ctx)
}

type demo struct {
	out   *Main
	store statestore.Store
	emit  *registry.Emitter
	runID string
}

func (d *demo) run(ctx context.Context) error {
	drainTimeout, waited := int64(300), 0.01
	steps := []func() error{
		func() error {
			return d.append(ctx, statestore.RunStarted, "", 1, &statestore.RunStartedPayload{EngineType: "mock", EngineRunRef: "mock://demo/" + d.runID})
		},
		func() error { return d.append(ctx, statestore.StepStarted, "extract", 1, nil) },
		func() error { return d.append(ctx, statestore.StepStarted, "load", 1, nil) },
		func() error {
			return d.append(ctx, statestore.RunPaused, "", 1, &statestore.RunPausedPayload{Reason: "maintenance", RequestedBy: "demo", DrainTimeoutSeconds: &drainTimeout})
		},
		func() error { return d.show(ctx) },
		func() error { return d.append(ctx, statestore.StepCompleted, "extract", 1, nil) },
		func() error {
			fmt.Fprintln(d.out.Stdout, "retrying the same StepCompleted (same idempotencyKey):")
			return d.append(ctx, statestore.StepCompleted, "extract", 1, nil)
		},
		func() error { return d.append(ctx, statestore.StepCompleted, "load", 1, nil) },
		func() error {
			return d.append(ctx, statestore.RunDrainCompleted, "", 1, &statestore.RunDrainCompletedPayload{WaitedSeconds: &waited})
		},
		func() error { return d.show(ctx) },
		func() error { return d.rejected(ctx) },
		func() error {
			return d.append(ctx, statestore.RunResumed, "", 1, &statestore.RunResumedPayload{RequestedBy: "demo"})
		},
		func() error { return d.append(ctx, statestore.StepStarted, "publish", 1, nil) },
		func() error { return d.append(ctx, statestore.StepCompleted, "publish", 1, nil) },
		func() error { return d.append(ctx, statestore.RunCompleted, "", 1, nil) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	snap, err := d.store.ProjectSnapshot(ctx, d.runID)
	if err != nil {
		return err
	}
	if snap.Status != statestore.RunStatusCompleted || snap.Inconsistent {
		return fmt.Errorf("run ended %s (inconsistent=%v), want COMPLETED", snap.Status, snap.Inconsistent)
	}
	b, _ := json.MarshalIndent(snap, "", "  ")
	fmt.Fprintf(d.out.Stdout, "\nfinal snapshot:\n%s\n", b)
	return nil
}

func (d *demo) event(eventType, stepID string, attempt int64, payload any) (*statestore.RunEventWrite, error) {
	return statestore.NewEvent(statestore.RunRef{RunID: d.runID, TenantID: "tenant_demo", ProjectID: "proj_demo",
		EnvironmentID: "dev", PlanID: "plan_demo", PlanVersion: "1"}, eventType, stepID, 1, attempt, payload)
}

func (d *demo) append(ctx context.Context, eventType, stepID string, attempt int64, payload any) error {
	w, err := d.event(eventType, stepID, attempt, payload)
	if err != nil {
		return err
	}
	res, err := d.emit.Emit(ctx, w)
	if err != nil {
		return fmt.Errorf("append %s: %w", eventType, err)
	}
	what := "persisted"
	if res.Idempotent {
		what = "duplicate: existing record returned, nothing written"
	}
	label := eventType
	if stepID != "" {
		label += " " + stepID
	}
	fmt.Fprintf(d.out.Stdout, "  runSeq %-5d %-26s eventId %s  %s\n", res.RunSeq, label, res.EventID, what)
	return nil
}

func (d *demo) show(ctx context.Context) error {
	s, err := d.store.ProjectSnapshot(ctx, d.runID)
	if err != nil {
		return err
	}
	sub := s.Substatus
	if sub == "" {
		sub = "-"
	}
	fmt.Fprintf(d.out.Stdout, "  => status %s, substatus %s, in flight %v\n", s.Status, sub, s.InFlight())
	return nil
}

func (d *demo) rejected(ctx context.Context) error {
	w, err := d.event(statestore.StepStarted, "bad|step", 1, nil)
	if err != nil {
		return err
	}
	w.EventID = uuid.NewString()
	_, err = d.store.Append(ctx, w)
	var e *statestore.Error
	if !errors.As(err, &e) {
		return fmt.Errorf("a stepId with '|' was not rejected: %v", err)
	}
	fmt.Fprintf(d.out.Stdout, "  rejected: %s (field %s): %s\n", e.Code, e.Field, e.Message)
	return nil
}
