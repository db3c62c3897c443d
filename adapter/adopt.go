package adapter

// Adoption of existing workflow definitions (docs/workers.md, "Adopting
// existing workflows"): every workflow of an adopted definition becomes a
// run of the log. Its runId is its workflowId; planId and planVersion are
// the definition's name and version; a stepId is a task's reference name.
// Tasks the sidecar gates (the SIMPLE tasks of outside workers, through
// the task proxy) are recorded by the task workers; the others (system
// tasks, and worker tasks that finished before the sidecar saw them) are
// recorded here from what Conductor reports.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// AdoptSpec names a workflow definition whose workflows are adopted:
// Version 0 adopts every version.
type AdoptSpec struct {
	Name    string
	Version int32
}

// String is NAME or NAME:VERSION, as ParseAdoptSpec reads it.
func (s AdoptSpec) String() string {
	if s.Version == 0 {
		return s.Name
	}
	return s.Name + ":" + strconv.Itoa(int(s.Version))
}

// matches reports whether a workflow of definition name, version is
// adopted by s.
func (s AdoptSpec) matches(name string, version int32) bool {
	return s.Name == name && (s.Version == 0 || s.Version == version)
}

// ParseAdoptSpec reads NAME or NAME:VERSION (VERSION an integer >= 1). A
// name that the run event contract refuses as a planId (empty, '|', NUL,
// too long) is refused with ErrInvalidInput.
func ParseAdoptSpec(s string) (AdoptSpec, error) {
	const op = "adopt"
	name, ver, hasVer := strings.Cut(strings.TrimSpace(s), ":")
	if err := statestore.CheckID(name, true); err != nil {
		return AdoptSpec{}, invalidInput(op, "definition name %q %v", name, err)
	}
	spec := AdoptSpec{Name: name}
	if hasVer {
		v, err := strconv.ParseInt(ver, 10, 32)
		if err != nil || v < 1 {
			return AdoptSpec{}, invalidInput(op, "%q: the version must be an integer >= 1, got %q", s, ver)
		}
		spec.Version = int32(v)
	}
	return spec, nil
}

// AdoptedStepID is the stepId of a task of an adopted workflow: its
// reference name, with '%' and '|' percent-encoded ('|' may not appear
// in a stepId; '%' is encoded so that the mapping stays reversible). A
// task inside a DO_WHILE loop (iteration >= 1) gets the iteration as the
// suffix "__N", as Conductor itself names it (Conductor's reference
// names of loop tasks already end in "__N"; it is not added twice).
// Dynamically forked tasks keep the reference names the fork's input gave
// them, unique within a workflow.
func AdoptedStepID(ref string, iteration int32) string {
	id := ref
	if strings.ContainsAny(id, "%|") {
		id = strings.NewReplacer("%", "%25", "|", "%7C").Replace(id)
	}
	if iteration > 0 {
		if suffix := "__" + strconv.Itoa(int(iteration)); !strings.HasSuffix(id, suffix) {
			id += suffix
		}
	}
	return id
}

// stepIDOf is the stepId of t, a task of an adopted workflow: a DO_WHILE
// task itself carries the loop's current iteration, which names its
// inner tasks' iterations, not the loop: its stepId is its reference name.
func stepIDOf(t *model.Task) string {
	if t.TaskType == "DO_WHILE" {
		return AdoptedStepID(t.ReferenceTaskName, 0)
	}
	return AdoptedStepID(t.ReferenceTaskName, t.Iteration)
}

// Adopted runs' identity in the run index: their RequestKey.
const adoptedRequestKeyPrefix = "adopted:"

// IsAdopted reports whether rec is an adopted workflow's run.
func (r *Run) IsAdopted() bool { return strings.HasPrefix(r.RequestKey, adoptedRequestKeyPrefix) }

// Label keys of an adopted run (docs/workers.md, "Labels").
const (
	// LabelCorrelationID carries the workflow's correlationId when it is a
	// valid label value.
	LabelCorrelationID = "correlationId"
	// InputLabels is the workflow input field whose object of strings
	// becomes the run's labels (those that are valid labels).
	InputLabels = "labels"
)

// adoptedLabels are the labels of an adopted workflow's run: its input's
// "labels" object (string values, valid labels only) and its correlationId
// (when a valid label value) as label correlationId.
func adoptedLabels(wf *model.Workflow) map[string]string {
	labels := map[string]string{}
	if in, ok := wf.Input[InputLabels].(map[string]any); ok {
		for k, v := range in {
			if s, ok := v.(string); ok && len(CheckLabels(map[string]string{k: s})) == 0 {
				labels[k] = s
			}
		}
	}
	if c := wf.CorrelationId; c != "" && len(CheckLabels(map[string]string{LabelCorrelationID: c})) == 0 {
		labels[LabelCorrelationID] = c
	}
	if len(labels) > MaxLabels {
		// The first MaxLabels by key are kept (correlationId among them
		// or not, as its key sorts): the same ones on every replica.
		keys := slices.Sorted(maps.Keys(labels))
		for _, k := range keys[MaxLabels:] {
			delete(labels, k)
		}
	}
	if len(labels) == 0 {
		return nil
	}
	return labels
}

// AdoptedIdentity is the tenant, project and environment of every adopted
// run (a Conductor workflow has none of its own).
type AdoptedIdentity struct {
	TenantID, ProjectID, EnvironmentID string
}

// adoptRun records workflow wf as a run: its index entry (state STARTED,
// runId = workflowId) and the active index, then RunStarted. A workflow
// already adopted is left as it is (its RunStarted appended if missing).
func (r *Runs) adoptRun(ctx context.Context, wf *model.Workflow, id AdoptedIdentity) (*Run, error) {
	if _, err := uuid.Parse(wf.WorkflowId); err != nil || len(wf.WorkflowId) != 36 {
		return nil, invalidInput("adopt", "workflow id %q is not a UUID: it cannot be a runId", wf.WorkflowId)
	}
	started := time.Now().UTC()
	if wf.StartTime > 0 {
		started = time.UnixMilli(wf.StartTime).UTC()
	}
	rec := &Run{
		RunID: wf.WorkflowId, RequestKey: adoptedRequestKeyPrefix + wf.WorkflowId,
		TenantID: id.TenantID, ProjectID: id.ProjectID, EnvironmentID: id.EnvironmentID,
		PlanID: wf.WorkflowName, PlanVersion: strconv.Itoa(int(wf.WorkflowVersion)),
		Labels: adoptedLabels(wf), WorkflowName: wf.WorkflowName, WorkflowVersion: wf.WorkflowVersion,
		WorkflowID: wf.WorkflowId, State: RunStateStarted, CreatedAt: time.Now().UTC(), StartedAt: started,
	}
	rev, err := r.createRun(ctx, rec)
	if errors.Is(err, jetstream.ErrKeyExists) {
		if rec, rev, err = r.get(ctx, wf.WorkflowId); err != nil {
			return nil, err
		}
		if !rec.IsAdopted() {
			return nil, &Error{Code: CodeConflict, Op: "adopt", Message: "run " + rec.RunID + " is a plan run, not an adopted workflow"}
		}
	} else if err != nil {
		return nil, err
	} else {
		r.metrics.adoptedWorkflow()
		r.log.Info("adopted a workflow", zap.String("runId", rec.RunID), zap.String("workflow", rec.WorkflowName),
			zap.Int32("version", rec.WorkflowVersion))
	}
	if rec.State != RunStateFinal {
		if _, err := r.kv.Put(ctx, keyActive+rec.RunID, []byte(rec.RequestKey)); err != nil {
			return nil, registryUnavailable("index active run", err)
		}
	}
	if err := r.ensureRunStarted(ctx, rec, rev); err != nil {
		return nil, err
	}
	return rec, nil
}

// controlTaskTypes are the system tasks that steer a workflow and do no
// work of their own: they are recorded once they end (StepStarted and
// their outcome together), never as in flight, so that a drain does not
// wait for a JOIN, a loop or a WAIT that waits for the tasks it steers or
// for a signal.
var controlTaskTypes = map[string]bool{
	"DECISION": true, "SWITCH": true, "FORK": true, "FORK_JOIN": true, "FORK_JOIN_DYNAMIC": true,
	"JOIN": true, "EXCLUSIVE_JOIN": true, "DO_WHILE": true, "WAIT": true, "HUMAN": true,
	"SET_VARIABLE": true, "TERMINATE": true, "NOOP": true,
}

// waitsForLaterTasks are the control task types that end after tasks
// Conductor created after them: a JOIN (its branches' tasks past their
// first) and a loop (its body's).
var waitsForLaterTasks = map[string]bool{"JOIN": true, "EXCLUSIVE_JOIN": true, "DO_WHILE": true}

// systemTaskTypes are the task types Conductor runs itself; any other
// task type is a worker's (SIMPLE: its type is its definition's name).
var systemTaskTypes = map[string]bool{
	"HTTP": true, "INLINE": true, "LAMBDA": true, "SUB_WORKFLOW": true, "START_WORKFLOW": true, "EVENT": true,
	"JSON_JQ_TRANSFORM": true, "KAFKA_PUBLISH": true, "WAIT_FOR_WEBHOOK": true, "BUSINESS_RULE": true,
}

// IsWorkerTask reports whether a task of type taskType is a worker's
// (SIMPLE), which the task proxy gates, rather than a system task.
func IsWorkerTask(taskType string) bool {
	return !systemTaskTypes[taskType] && !controlTaskTypes[taskType]
}

// AdoptedTaskInput is the assignment of a worker task of an adopted run:
// run ids from rec, the stepId from the reference name and iteration, the
// engine tries from the retries Conductor allows (retriesAllowed; one
// logical attempt), failure policy onStepFailure (--adopt-on-step-failure;
// "" is fail).
func AdoptedTaskInput(rec *Run, t *model.Task, onStepFailure string) *plan.TaskInput {
	if onStepFailure == "" {
		onStepFailure = plan.OnFailureFail
	}
	tries := int(max(t.RetryCount, retriesAllowed(t))) + 1
	step := plan.Step{StepID: stepIDOf(t),
		Executor: plan.ExecutorSpec{Type: plan.ExecutorExternal, TaskType: t.TaskDefName},
		Retries:  plan.RetryPolicy{EngineTries: tries, LogicalAttempts: 1}}
	return &plan.TaskInput{RunID: rec.RunID, TenantID: rec.TenantID, ProjectID: rec.ProjectID, EnvironmentID: rec.EnvironmentID,
		PlanID: rec.PlanID, PlanVersion: rec.PlanVersion, Step: step, EngineTries: tries, LogicalAttempts: 1,
		OnStepFailure: onStepFailure, Sink: true}
}

// taskEvents are the events that bring the log's view of one step (st,
// nil when the log has none) up to Conductor's task t. adoption is true
// on the first read of a workflow the sidecar had not seen: a worker task
// already in progress is recorded as started then (its worker got it
// before the sidecar could gate it); afterwards only the proxy's gate
// starts a worker task. wf is the status of Conductor's workflow. pending
// reports a system task whose end is still to be recorded from
// Conductor's report (not a control task's: controlOpen), or a try whose
// retry Conductor has yet to decide.
func taskEvents(rec *Run, t *model.Task, st *statestore.StepSnapshot, adoption bool, wf model.WorkflowStatus) (evs []*statestore.RunEventWrite, pending bool, err error) {
	paused := wf == model.PausedWorkflow
	stepID := stepIDOf(t)
	if statestore.CheckID(stepID, true) != nil {
		return nil, false, nil // an empty or oversized reference name: not a step of the log
	}
	engine := int64(t.RetryCount) + 1
	// The step's logical attempt in the log: 1, or the operator's retry
	// of a held step (RETRY_STEP), whose task Conductor ran, or was
	// ended by hand, as that attempt.
	logical := int64(1)
	if st != nil {
		logical = st.LogicalAttemptID
	}
	if st != nil && st.Status == statestore.StepStatusPending && st.RetryRequested {
		// The operator's retry of a held step, which Conductor ended
		// (by hand): one try of its own, as when a worker runs it,
		// whatever the held task's retryCount (docs/workers.md).
		engine = 1
	}
	ref := statestore.RunRef{RunID: rec.RunID, TenantID: rec.TenantID, ProjectID: rec.ProjectID,
		EnvironmentID: rec.EnvironmentID, PlanID: rec.PlanID, PlanVersion: rec.PlanVersion}
	add := func(p statestore.Payload) {
		if err != nil {
			return
		}
		var ev *statestore.RunEventWrite
		if ev, err = statestore.NewEvent(ref, p.EventType(), stepID, engine, logical, p); err == nil {
			evs = append(evs, ev)
		}
	}
	started := st != nil && st.Status != statestore.StepStatusPending
	ended := st != nil && (st.Status == statestore.StepStatusSuccess || st.Status == statestore.StepStatusFailed || st.Status == statestore.StepStatusSkipped)
	start := func() {
		if !started {
			add(statestore.StepStartedPayload{EngineStartedAt: statestore.EngineTime(t.StartTime), EngineTaskID: t.TaskId})
		}
	}
	worker := IsWorkerTask(t.TaskType)
	switch status := string(t.Status); status {
	case "SCHEDULED":
		if worker || controlTaskTypes[t.TaskType] {
			return nil, false, nil
		}
		// Conductor runs a system task it scheduled whatever the
		// workflow's pause, and 3.21 shows an HTTP task SCHEDULED, with no
		// start time, while it makes the call: it is in flight.
		start()
		return evs, true, err
	case "IN_PROGRESS":
		switch {
		case worker && !(adoption && !started):
			// The proxy's gate starts it and records its outcome.
			return nil, false, nil
		case controlTaskTypes[t.TaskType]:
			return nil, false, nil
		}
		start()
		return evs, true, err
	case "COMPLETED":
		if ended {
			return nil, false, nil
		}
		start()
		add(statestore.StepCompletedPayload{EngineEndedAt: statestore.EngineTime(t.EndTime), EngineTaskID: t.TaskId})
	case "SKIPPED":
		if started || ended {
			return nil, false, nil
		}
		add(statestore.StepSkippedPayload{Reason: "Conductor skipped the task"})
	case "FAILED", "FAILED_WITH_TERMINAL_ERROR", "TIMED_OUT", "CANCELED", "COMPLETED_WITH_ERRORS":
		if ended || (t.Retried && status != "COMPLETED_WITH_ERRORS") {
			// Conductor retries it: the step is in flight until a try ends it.
			return nil, false, nil
		}
		if wf == model.RunningWorkflow && retriesLeft(t) {
			// Conductor retries it, and has not decided so yet: 3.32 shows
			// a try FAILED before the decide that marks it retried and
			// schedules the retry. Recording the failure now would fail
			// the step in the log while Conductor retries it (and the
			// gate would fail each retry from the log). The run's next
			// read sees the retry, or the workflow's end.
			return nil, true, nil
		}
		if paused && (status == "FAILED" || status == "TIMED_OUT") {
			// Conductor decides nothing for a PAUSED workflow: whether it
			// retries this try (a dead worker's, failed by the proxy's
			// watch) is decided at resume. Recorded then, or as retried.
			return nil, false, nil
		}
		if status == "CANCELED" && !started && !(controlTaskTypes[t.TaskType] && t.StartTime > 0) {
			// Never ran. A control task is recorded once it ends, so
			// one canceled with its workflow (a loop, a JOIN, a WAIT
			// under way: it has a start time) ran.
			return nil, false, nil
		}
		start()
		add(statestore.StepFailedPayload{EngineEndedAt: statestore.EngineTime(t.EndTime), EngineTaskID: t.TaskId,
			Error: statestore.EngineTaskFailure(status, t.ReasonForIncompletion)})
	default:
		return nil, false, nil
	}
	return evs, false, err
}

// retriesLeft reports whether Conductor retries task t, which ended: as
// its decider does, a try that FAILED or TIMED_OUT of a task that is not
// one of its control tasks, while fewer tries were retried than the
// workflow task's retryCount, or else its definition's, allows. A
// workflow task's retryCount of 0 cannot be told from none (the client's
// model drops it), so the definition's counts then.
func retriesLeft(t *model.Task) bool {
	if (t.Status != "FAILED" && t.Status != "TIMED_OUT") || controlTaskTypes[t.TaskType] {
		return false
	}
	return t.RetryCount < retriesAllowed(t)
}

// retriesAllowed is how many times Conductor retries a try of t: its
// workflow task's retryCount, or else its definition's (0 without either).
func retriesAllowed(t *model.Task) int32 {
	if t.WorkflowTask == nil {
		return 0
	}
	if t.WorkflowTask.RetryCount > 0 {
		return t.WorkflowTask.RetryCount
	}
	if d := t.WorkflowTask.TaskDefinition; d != nil {
		return d.RetryCount
	}
	return 0
}

// recordTasks appends what the log lacks of wf's tasks (taskEvents, in
// Conductor's order); pending reports a system task whose end is still to
// be recorded (or a worker task in progress while the run drains), control a control task still open (a JOIN waiting for its
// branches, a loop, a WAIT).
//
// gatedTaskID, when set, is the task whose poll through the proxy adopts
// the workflow: Conductor shows it IN_PROGRESS (the proxy's poll took it),
// but no worker has it yet, so the mid-flight rule leaves it to the gate.
func (r *Runs) recordTasks(ctx context.Context, snaps SnapshotReader, rec *Run, wf *model.Workflow, adoption bool, gatedTaskID string) (pending, control bool, err error) {
	snap, err := snaps.ProjectSnapshot(ctx, rec.RunID)
	if err != nil {
		return true, false, fmt.Errorf("adapter: snapshot of adopted run %s: %w", rec.RunID, err)
	}
	if statestore.IsTerminalRunStatus(snap.Status) {
		return false, false, nil
	}
	// A worker task in progress while the run's pause drains is followed
	// too: a worker that reports straight to Conductor (one that had its
	// task before adoption) ends it only in Conductor's report, and the
	// drain waits for that.
	draining := snap.Status == statestore.RunStatusPaused && snap.Pause != nil && snap.Pause.DrainEndedAt == ""
	record := func(t *model.Task) error {
		// The mid-flight rule starts a worker task only while the log has
		// the run RUNNING: a read as at adoption of a run the log has
		// PAUSED (after a restart) records no StepStarted inside the pause.
		midFlight := adoption && snap.Status == statestore.RunStatusRunning && (gatedTaskID == "" || t.TaskId != gatedTaskID)
		st := snap.Step(stepIDOf(t))
		if snap.Status == statestore.RunStatusPaused && IsWorkerTask(t.TaskType) && (st == nil || st.Status == statestore.StepStatusPending) {
			// A worker task the gate never started (its worker polls
			// Conductor directly), ended or not: recorded once the log has
			// the run running again, never started inside the pause.
			return nil
		}
		evs, p, err := taskEvents(rec, t, st, midFlight, wf.Status)
		pending = pending || p || (draining && IsWorkerTask(t.TaskType) && t.Status == "IN_PROGRESS")
		control = control || (controlTaskTypes[t.TaskType] && (t.Status == "SCHEDULED" || t.Status == "IN_PROGRESS"))
		if err != nil {
			return err
		}
		for _, ev := range evs {
			// Appended on the state it was decided on: a run that moved on
			// meanwhile (the proxy recorded the step, the run ended) is
			// decided again.
			var applies bool
			snap, _, err = statestore.Fenced(ctx, statestore.ReadFirst(snap, snaps), r.emitter, rec.RunID, func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
				applies = statestore.Decide(s, ev.EventType, ev.StepID, ev.LogicalAttemptID).Outcome == statestore.Apply
				if !applies {
					return nil, nil // the log moved on: nothing to add
				}
				return ev, nil
			})
			if err != nil {
				return fmt.Errorf("adapter: record task %s of adopted run %s: %w", t.TaskId, rec.RunID, err)
			}
			if !applies {
				break
			}
			if snap, err = snaps.ProjectSnapshot(ctx, rec.RunID); err != nil {
				return err
			}
		}
		if snap, err = r.recordSubWorkflowTry(ctx, snaps, snap, t); err != nil {
			return err
		}
		snap, err = r.recordTimedOutTry(ctx, snaps, snap, t)
		return err
	}
	// In Conductor's order, but for a JOIN or a loop that ended: Conductor
	// creates a JOIN before the tasks of its branches that follow their
	// first, and a loop before its body's tasks, so one read that finds
	// them all ended would record the JOIN's end before the start of a task
	// it waited for. Such a task is recorded once the tasks that began
	// before its end are, before the first that began at or after it. (Not
	// the control tasks that end as they schedule what follows them, a
	// SWITCH, a FORK: Conductor may set their end a moment after the start
	// of the tasks they scheduled.)
	var ended []*model.Task
	flush := func(before int64) error {
		slices.SortStableFunc(ended, func(a, b *model.Task) int { return cmp.Compare(a.EndTime, b.EndTime) })
		for len(ended) > 0 && (before < 0 || ended[0].EndTime <= before) {
			t := ended[0]
			ended = ended[1:]
			if err := record(t); err != nil {
				return err
			}
		}
		return nil
	}
	for i := range wf.Tasks {
		t := &wf.Tasks[i]
		if waitsForLaterTasks[t.TaskType] && t.EndTime > 0 && t.Status != "SCHEDULED" && t.Status != "IN_PROGRESS" {
			ended = append(ended, t)
			continue
		}
		if began := max(t.StartTime, t.ScheduledTime); began > 0 {
			if err := flush(began); err != nil {
				return true, control, err
			}
		}
		if err := record(t); err != nil {
			return true, control, err
		}
	}
	if err := flush(-1); err != nil {
		return true, control, err
	}
	return pending, control, nil
}

// recordTimedOutTry ends in the log the try of t, a worker task Conductor
// timed out and retries, when the log still has the step in flight at
// t's try (RunStepTryEnded, taskTimedOut): nobody runs it any more, and a
// drain must not wait for it. The proxy ends the tries it handed out
// itself; this is for a start no poll of it accounts for: the mid-flight
// rule's, of a task polled through the proxy by a worker that hung up
// before the answer came (the proxy hands such a task back, but a
// hand-back that did not reach Conductor leaves it to the timeout), or
// taken by a worker that polls Conductor directly and died. The try that follows is
// the gate's to start. It returns the run's state after what it recorded.
func (r *Runs) recordTimedOutTry(ctx context.Context, snaps SnapshotReader, snap *statestore.RunSnapshot, t *model.Task) (*statestore.RunSnapshot, error) {
	if !IsWorkerTask(t.TaskType) || t.Status != "TIMED_OUT" || !t.Retried {
		return snap, nil
	}
	stepID, engine := stepIDOf(t), int64(t.RetryCount)+1
	inFlight := func(s *statestore.RunSnapshot) *statestore.StepSnapshot {
		st := s.Step(stepID)
		if st == nil || st.Status != statestore.StepStatusRunning || st.Idle || st.EngineAttemptID != engine || statestore.IsTerminalRunStatus(s.Status) {
			return nil
		}
		return st
	}
	if inFlight(snap) == nil {
		return snap, nil
	}
	snap, _, err := statestore.Fenced(ctx, statestore.ReadFirst(snap, snaps), statestore.TryAppender{Emit: r.emitter, Runs: snaps, StepID: stepID}, snap.RunID,
		func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
			st := inFlight(s)
			if st == nil {
				return nil, nil // the log moved on
			}
			return statestore.NewTryEvent(s, statestore.RunStepTryEndedPayload{StepID: stepID, StepLogicalAttemptID: st.LogicalAttemptID,
				EngineAttemptID: engine, Reason: statestore.TryEndedTaskTimedOut})
		})
	if err != nil {
		return snap, fmt.Errorf("adapter: record the timed-out try of task %s of adopted run %s: %w", t.TaskId, snap.RunID, err)
	}
	return snaps.ProjectSnapshot(ctx, snap.RunID)
}

// maxSubWorkflowDepth bounds how many levels of nested sub-workflows
// subWorkflowIdle reads: a SUB_WORKFLOW task deeper than that counts as
// running.
const maxSubWorkflowDepth = 4

// recordSubWorkflowTry brings the log's view of t, when it is a
// SUB_WORKFLOW task in progress, in line with its child workflow: the
// task does not end while the child is paused, so while the run's pause
// drains and the child is paused with nothing of it running, the step is
// idle (RunStepTryEnded, subWorkflowPaused) and the drain does not wait
// for it; once the run runs again and so does the child, it is in flight
// again (RunStepTryStarted). The child is read only in those two cases.
// It returns the run's state after what it recorded.
func (r *Runs) recordSubWorkflowTry(ctx context.Context, snaps SnapshotReader, snap *statestore.RunSnapshot, t *model.Task) (*statestore.RunSnapshot, error) {
	if t.TaskType != "SUB_WORKFLOW" || t.Status != "IN_PROGRESS" || t.SubWorkflowId == "" {
		return snap, nil
	}
	stepID := stepIDOf(t)
	st := snap.Step(stepID)
	if st == nil || st.Status != statestore.StepStatusRunning {
		return snap, nil
	}
	draining := snap.Status == statestore.RunStatusPaused && snap.Pause != nil && snap.Pause.DrainEndedAt == ""
	if !(draining && !st.Idle) && !(snap.Status == statestore.RunStatusRunning && st.Idle) {
		return snap, nil
	}
	r.metrics.adoptRead(adoptReadSubWorkflow)
	idle, err := r.subWorkflowIdle(ctx, t.SubWorkflowId, maxSubWorkflowDepth)
	if err != nil || idle == st.Idle {
		return snap, err
	}
	snap, _, err = statestore.Fenced(ctx, statestore.ReadFirst(snap, snaps), statestore.TryAppender{Emit: r.emitter, Runs: snaps, StepID: stepID}, snap.RunID,
		func(s *statestore.RunSnapshot) (*statestore.RunEventWrite, error) {
			st := s.Step(stepID)
			if st == nil || st.Status != statestore.StepStatusRunning || st.Idle == idle || statestore.IsTerminalRunStatus(s.Status) {
				return nil, nil // the log moved on
			}
			if idle {
				return statestore.NewTryEvent(s, statestore.RunStepTryEndedPayload{StepID: stepID, StepLogicalAttemptID: st.LogicalAttemptID,
					Reason: statestore.TryEndedSubWorkflowPaused})
			}
			if s.Status != statestore.RunStatusRunning {
				return nil, nil // RunStepTryStarted only while the run runs
			}
			return statestore.NewTryEvent(s, statestore.RunStepTryStartedPayload{StepID: stepID, StepLogicalAttemptID: st.LogicalAttemptID})
		})
	if err != nil {
		return snap, fmt.Errorf("adapter: record sub-workflow %s of adopted run %s: %w", t.SubWorkflowId, snap.RunID, err)
	}
	return snaps.ProjectSnapshot(ctx, snap.RunID)
}

// subWorkflowIdle reports whether workflow id is paused with nothing of it
// running: no task in progress (control tasks aside, as in taskEvents) and
// no system task scheduled (Conductor runs one whatever the pause). A
// SUB_WORKFLOW task in progress is idle when its own child is, down to
// depth levels.
func (r *Runs) subWorkflowIdle(ctx context.Context, id string, depth int) (bool, error) {
	wf, err := r.conductor.WorkflowTasks(ctx, id)
	if err != nil {
		return false, err
	}
	if wf.Status != model.PausedWorkflow {
		return false, nil
	}
	for i := range wf.Tasks {
		t := &wf.Tasks[i]
		switch {
		case controlTaskTypes[t.TaskType]:
		case t.Status == "IN_PROGRESS" && t.TaskType == "SUB_WORKFLOW" && t.SubWorkflowId != "" && depth > 1:
			if idle, err := r.subWorkflowIdle(ctx, t.SubWorkflowId, depth-1); err != nil || !idle {
				return false, err
			}
		case t.Status == "IN_PROGRESS", t.Status == "SCHEDULED" && !IsWorkerTask(t.TaskType):
			return false, nil
		}
	}
	return true, nil
}

// AdoptedOutside counts, by definition (NAME:VERSION), the active adopted
// runs whose definition none of specs adopts: runs adopted by an earlier
// process with other --adopt flags, whose tasks this one no longer records
// (their end is still recorded by the run watcher). One read of the run
// index per active run.
func (r *Runs) AdoptedOutside(ctx context.Context, specs []AdoptSpec) (map[string]int, error) {
	ids, err := r.ActiveRunIDs(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	var errs []error
	for _, id := range ids {
		rec, _, err := r.get(ctx, id)
		if err != nil {
			if !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		if !rec.IsAdopted() || rec.State == RunStateFinal || slices.ContainsFunc(specs, func(s AdoptSpec) bool { return s.matches(rec.WorkflowName, rec.WorkflowVersion) }) {
			continue
		}
		out[fmt.Sprintf("%s:%d", rec.WorkflowName, rec.WorkflowVersion)]++
	}
	return out, errors.Join(errs...)
}
