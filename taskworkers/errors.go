package taskworkers

import "errors"

// Machine codes the worker itself puts in Conductor's reasonForIncompletion
// (the executors' step error codes are in package exec).
const (
	// CodeBadTaskInput: the task's input is not a sidecar step.
	CodeBadTaskInput = "BAD_TASK_INPUT"
	// CodeUnknownExecutor: no executor is registered for the step's
	// executor type. Package exec answers the same code for a Spec it
	// does not know.
	CodeUnknownExecutor = "EXECUTOR_UNKNOWN"
	// CodeForeignWorkflow: the task's workflow is not its run's.
	CodeForeignWorkflow = "FOREIGN_WORKFLOW"
	// CodeStoreUnavailable: StepCompleted or StepFailed could not be
	// recorded, so the task is failed (never completed without its event).
	CodeStoreUnavailable = "STATE_STORE_UNAVAILABLE"
	// CodeJoinNotPassable: a step joined with any_success whose
	// dependencies all failed; the step fails without running.
	CodeJoinNotPassable = "JOIN_NOT_PASSABLE"
	// CodeWorkflowNotFound: the step's task is gone from Conductor with
	// its workflow (removed, or lost) while the step ran; the step is
	// recorded failed with it (the run ends with the same code).
	CodeWorkflowNotFound = "WORKFLOW_NOT_FOUND"
)

// ErrForeignWorkflow is returned by Options.Guard for a task whose workflow
// is not its run's workflow.
var ErrForeignWorkflow = errors.New("taskworkers: the task's workflow is not its run's workflow")

// ErrUnknownRun is returned by Options.Guard for a task of a run this
// sidecar's log and run index do not know: a run of another deployment
// that polls the same Conductor task types (use distinct task domains). Such
// a task is handed back, never run and never failed.
var ErrUnknownRun = errors.New("taskworkers: the task's run is not one of this sidecar's")

// ErrNotAdmitted is returned by Record for an outside worker's update of a
// task the gate never handed out (polled from Conductor directly) whose run
// may not start it now (paused, being cancelled, ended): nothing is
// recorded or forwarded, and the task is answered to Conductor as a poll's
// would be (handed back, or failed for an ended run).
var ErrNotAdmitted = errors.New("taskworkers: the task was not handed out through the gate, and its run may not start it now")

// ErrTryTimedOut is returned by Record for an outside worker's update of
// a try the log shows ended by its response timeout (RunStepTryEnded,
// taskTimedOut): Conductor timed the task out, or times it out when its
// paused workflow resumes, and takes no report of it after that. Nothing
// is recorded or forwarded, so that the try ends as it would without the
// pause.
var ErrTryTimedOut = errors.New("taskworkers: the task's try ended by its response timeout")
