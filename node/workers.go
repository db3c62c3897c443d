package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/conductor-sdk/conductor-go/sdk/model"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/taskworkers"
)

// What the task workers ask of the rest of the node, each named for what
// it decides.

// runGuard tells the workers whether a task belongs to a run of this
// deployment started with that workflow (taskworkers.Options.Guard).
// A task of an adopted definition's workflow (runId = workflowId) adopts
// the workflow (adopt nil: no definition is adopted).
type runGuard struct {
	runs  *adapter.Runs
	adopt *adapter.Adopter
}

func (g runGuard) check(ctx context.Context, runID, workflowID string) error {
	var err error
	if g.adopt != nil && g.adopt.Adopts(runID, workflowID) {
		err = g.adopt.Ensure(ctx, workflowID)
	} else {
		_, err = g.runs.EnsureStarted(ctx, runID, workflowID)
	}
	switch {
	case errors.Is(err, adapter.ErrConflict):
		// Our run, another workflow: an orphan of a crashed start.
		return fmt.Errorf("%w: %v", taskworkers.ErrForeignWorkflow, err)
	case errors.Is(err, adapter.ErrNotFound):
		// Not a run of this deployment (another sidecar's, on another
		// NATS): leave it to its owner.
		return fmt.Errorf("%w: %v", taskworkers.ErrUnknownRun, err)
	}
	return err
}

// inFlight lists the tasks Conductor still has in progress under this
// worker id, which a restart recovers (taskworkers.Options.Recover).
type inFlight struct {
	runs     *adapter.Runs
	workerID string
}

func (f inFlight) tasks(ctx context.Context) ([]model.Task, error) {
	return f.runs.InFlightTasks(ctx, f.workerID)
}

// externalInFlight lists the tasks of the active runs' external steps
// that Conductor shows in progress, which the workers' watch of outside
// workers covers after a restart (taskworkers.Options.ExternalInFlight).
// Adopted workflows' worker tasks are among them (adopt nil: none adopted).
type externalInFlight struct {
	runs  *adapter.Runs
	adopt *adapter.Adopter
}

func (f externalInFlight) tasks(ctx context.Context) ([]model.Task, error) {
	return f.runs.InProgressTasks(ctx, func(t *model.Task) bool {
		if _, ok := taskworkers.ExternalStep(t); ok {
			return true
		}
		if f.adopt == nil {
			return false
		}
		_, ok := f.adopt.Step(t)
		return ok
	})
}

// taskDone nudges the watcher when a task may have ended its run, and the
// drain monitor when it may have ended a drain (taskworkers.Options.OnTaskDone).
type taskDone struct {
	watcher *adapter.Watcher
	drain   *drain.Controller
	// adopter reads an adopted run back (nil: none adopted).
	adopter *adapter.Adopter
}

func (d taskDone) nudge(runID string, mayEndRun, mayEndDrain bool) {
	if d.adopter != nil {
		d.adopter.Nudge(runID)
	}
	if mayEndRun {
		d.watcher.Nudge(runID)
	}
	if mayEndDrain {
		d.drain.Nudge(runID)
	}
}

// failurePause pauses a run whose step failed for good under
// onStepFailure: pause (taskworkers.Options.PauseOnFailure).
type failurePause struct {
	drain *drain.Controller
	by    string // requestedBy: this sidecar
}

func (p failurePause) pause(ctx context.Context, runID, _, stepID string) error {
	_, err := p.drain.Pause(ctx, runID, drain.PauseRequest{Reason: "stepFailed", StepID: stepID, RequestedBy: p.by})
	return err
}

// wakingStarter starts runs and then wakes the task workers' idle poll
// loops, since Conductor has queued the run's first steps: they start at
// once instead of after the loops' backed-off pause
// (taskworkers.Options.PollIntervalMax).
type wakingStarter struct {
	httpapi.Starter
	wakeup *taskworkers.Wakeup
}

func (s wakingStarter) Start(ctx context.Context, req httpapi.StartRequest) (*httpapi.Started, error) {
	started, err := s.Starter.Start(ctx, req)
	if err == nil {
		s.wakeup.Wake()
	}
	return started, err
}
