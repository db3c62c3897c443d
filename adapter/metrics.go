package adapter

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Conductor operation label values (sidecar_conductor_requests_total{op}).
const (
	opRegisterTaskDefs  = "register_task_defs"
	opRegisterWorkflow  = "register_workflow_def"
	opGetWorkflowDef    = "get_workflow_def"
	opStartWorkflow     = "start_workflow"
	opGetWorkflow       = "get_workflow"
	opPause             = "pause"
	opResume            = "resume"
	opTerminate         = "terminate"
	opRemoveWorkflow    = "remove_workflow"
	opRetry             = "retry"
	opBatchPoll         = "batch_poll"
	opUpdateTask        = "update_task"
	opGetTask           = "get_task"
	opRunningWorkflows  = "running_workflows"
	opDecide            = "decide"
	opHealth            = "health"
	opBulkPause         = "bulk_pause"
	opBulkResume        = "bulk_resume"
	opBulkTerminate     = "bulk_terminate"
	resultOK            = "ok"
	resultCanceled      = "canceled"
	startResultStarted  = "started"
	startResultExisting = "existing"
	startResultError    = "error"
)

var conductorOps = []string{
	opRegisterTaskDefs, opRegisterWorkflow, opGetWorkflowDef, opStartWorkflow, opGetWorkflow, opPause,
	opResume, opTerminate, opRetry, opBatchPoll, opUpdateTask, opGetTask, opRunningWorkflows, opHealth,
	opDecide, opRemoveWorkflow, opBulkPause, opBulkResume, opBulkTerminate,
}

var conductorResults = []string{
	resultOK, CodeEngineUnavailable, CodeNotFound, CodeConflict, CodeEngineRejected, resultCanceled,
}

// Actions of sidecar_run_watcher_actions_total{action}: what the watcher did
// to keep the log in step with Conductor besides the terminal events.
const (
	// actionPauseClosed: RunResumed (requestedBy sidecar) before the
	// RunCompleted of a run that completed in Conductor while PAUSED in
	// the log. This and the conductor_* and converged actions are the
	// pause follower's (drain.Follow*), counted under the same names.
	actionPauseClosed = "pause_closed"
	// actionTerminalRefused: a terminal event that is not valid from the
	// run's state was not appended (Layer 1) or was refused (Layer 2).
	actionTerminalRefused = "terminal_refused"
	// actionConductorPaused, actionConductorResumed: a pause or resume
	// made in Conductor, recorded in the log (requestedBy conductor).
	actionConductorPaused  = "conductor_paused"
	actionConductorResumed = "conductor_resumed"
	// actionConverged: the sidecar's own pause or resume, recorded in the
	// log but not applied to Conductor, applied by the watcher.
	actionConverged = "converged"
	// actionDecide: a workflow RUNNING with every task terminal was asked
	// to decide (PUT /workflow/decide/{id}).
	actionDecide = "decide"
	// actionCancelCompleted: a cancel requested in the log whose workflow
	// still ran in Conductor (the cancel's terminate never reached it)
	// completed by the pause follower: terminate, RunCancelled.
	actionCancelCompleted = "cancel_completed"
	// actionSettledTask: a plan run's task Conductor ended without the
	// step's worker (an update made by hand, a skiptask), recorded as
	// Conductor ended it before the run's end.
	actionSettledTask = "task_ended_in_conductor"
)

var watcherActions = []string{actionPauseClosed, actionTerminalRefused, actionConductorPaused, actionConductorResumed, actionConverged, actionDecide, actionCancelCompleted, actionSettledTask}

// Watcher outcome label values (sidecar_run_watcher_terminal_total{status}).
var watcherStatuses = []string{"COMPLETED", "FAILED", "TIMED_OUT", "TERMINATED", "CANCELLED", "LOST"}

// Metrics are the adapter's Prometheus metrics:
//
//	sidecar_conductor_requests_total{op, result}       Conductor API calls; result is ok, canceled or an error code
//	sidecar_conductor_request_duration_seconds{op}      their latency
//	sidecar_run_starts_total{result}                    StartRun calls: started, existing, error
//	sidecar_run_watcher_active_runs                     runs the watcher follows (last scan)
//	sidecar_run_watcher_terminal_total{status}          terminal run events appended, by Conductor status
//	sidecar_run_watcher_errors_total                    failed watcher checks
//	sidecar_run_watcher_actions_total{action}           pause_closed, terminal_refused, conductor_paused, conductor_resumed, converged, decide, cancel_completed, task_ended_in_conductor (see watcherActions)
//	sidecar_run_watcher_stuck_runs                      runs whose workflow Conductor leaves RUNNING with every task done
//	sidecar_run_watcher_waiting_runs                    runs with a worker task Conductor has handed to no worker for 10 minutes
//	sidecar_run_orphans_total{action}                   orphan workflows terminated or adopted
//
// There are no per-run labels. A nil *Metrics records nothing. Every label
// combination is created up front so that it exports zero.
type Metrics struct {
	requests map[[2]string]prometheus.Counter
	duration map[string]prometheus.Observer
	starts   map[string]prometheus.Counter
	active   prometheus.Gauge
	terminal map[string]prometheus.Counter
	errors   prometheus.Counter
	orphans  map[string]prometheus.Counter
	actions  map[string]prometheus.Counter
	stuck    prometheus.Gauge
	// waitingRuns: runs waiting for a worker (waiting.go).
	waitingRuns prometheus.Gauge
	adopted     prometheus.Counter
	reads       map[string]prometheus.Counter
	// queued: calls waiting for a place (ClientOptions.MaxConcurrentCalls);
	// places: the bound.
	queued, places prometheus.Gauge
}

// Why the adopter read an adopted workflow back from Conductor
// (sidecar_adopter_reads_total{reason}).
const (
	adoptReadGate     = "gate"     // a task of it passed the proxy's gate (Sync)
	adoptReadNudge    = "nudge"    // an outside worker reported a task of it
	adoptReadPending  = "pending"  // a system task of it is scheduled or in progress
	adoptReadSettle   = "settle"   // its workflow ended (the watcher's settle)
	adoptReadAdoption = "adoption" // first sight
	adoptReadPause    = "pause"    // a pause of it took effect in Conductor (SyncEngineTasks)
	// a SUB_WORKFLOW task of it is in progress and its child may be paused
	// or running again (recordSubWorkflowTry): the child's read
	adoptReadSubWorkflow = "subworkflow"
)

// NewMetrics registers the adapter metrics with reg and returns them. It
// panics, like prometheus.MustRegister, if they are already registered:
// create one Metrics per registry and share it.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sidecar_conductor_requests_total",
		Help: "Conductor API calls by operation and result (ok, canceled, or an adapter error code).",
	}, []string{"op", "result"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sidecar_conductor_request_duration_seconds",
		Help:    "Latency of Conductor API calls (a batch poll includes its long-poll wait).",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"op"})
	starts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sidecar_run_starts_total",
		Help: "StartRun calls by result: started (a new workflow), existing (idempotent repeat), error.",
	}, []string{"result"})
	active := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sidecar_run_watcher_active_runs",
		Help: "Runs the run watcher of this replica follows (non-final runs of the run index that it owns) at its last scan; the sum over replicas is every active run.",
	})
	terminal := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sidecar_run_watcher_terminal_total",
		Help: "Terminal run events the run watcher appended, by the Conductor workflow status it saw (LOST: the workflow is gone).",
	}, []string{"status"})
	errs := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sidecar_run_watcher_errors_total",
		Help: "Run watcher checks that failed (Conductor, store or run index errors); they are retried.",
	})
	orphans := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sidecar_run_orphans_total",
		Help: "Workflows started for a run but not recorded as its workflow: terminated, or adopted as the run's workflow.",
	}, []string{"action"})
	actions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sidecar_run_watcher_actions_total",
		Help: "What the run watcher did to keep the log in step with Conductor: pause_closed (a run completed in Conductor while paused in the log), terminal_refused (a terminal event not valid from the run's state, not appended), conductor_paused and conductor_resumed (a pause or resume made in Conductor, recorded in the log), converged (the sidecar's own pause or resume applied to Conductor by the watcher), decide (a workflow left RUNNING with every task done was asked to decide), cancel_completed (a cancel requested in the log whose terminate never reached Conductor, completed).",
	}, []string{"action"})
	stuck := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sidecar_run_watcher_stuck_runs",
		Help: "Runs whose workflow Conductor left RUNNING with every task terminal, after the watcher asked it to decide; alert STUCK_WORKFLOW.",
	})
	waitingRuns := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sidecar_run_watcher_waiting_runs",
		Help: "Runs of this replica whose RUNNING workflow has a worker task Conductor kept SCHEDULED, handed to no worker, for 10 minutes or more, as the watcher's last full read of each saw it: no worker polls its type, too few do, or Conductor's queue lost it; alert TASK_WAITING_FOR_WORKER.",
	})
	adopted := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sidecar_adopter_adopted_total",
		Help: "Workflows of adopted definitions (--adopt) this replica made runs of the log.",
	})
	reads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sidecar_adopter_reads_total",
		Help: "Reads of an adopted workflow with its tasks, by reason: adoption (first sight), gate (a task of it passed the proxy's gate), nudge (an outside worker reported a task of it), pending (a system task of it is scheduled or in progress), settle (its workflow ended).",
	}, []string{"reason"})
	queued := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sidecar_conductor_calls_waiting",
		Help: "Calls of the sidecar to Conductor waiting for one of its --conductor-max-concurrent-calls places (batch polls aside); above 0 for long, Conductor is slow for the sidecar's load, or the bound is low.",
	})
	places := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sidecar_conductor_call_slots",
		Help: "Calls the sidecar may have at Conductor at once, batch polls aside (--conductor-max-concurrent-calls).",
	})
	reg.MustRegister(requests, duration, starts, active, terminal, errs, orphans, actions, stuck, waitingRuns, adopted, reads, queued, places)

	m := &Metrics{
		requests:    make(map[[2]string]prometheus.Counter),
		duration:    make(map[string]prometheus.Observer),
		starts:      make(map[string]prometheus.Counter),
		active:      active,
		terminal:    make(map[string]prometheus.Counter),
		errors:      errs,
		orphans:     make(map[string]prometheus.Counter),
		actions:     make(map[string]prometheus.Counter),
		stuck:       stuck,
		waitingRuns: waitingRuns,
		adopted:     adopted,
		reads:       make(map[string]prometheus.Counter),
		queued:      queued,
		places:      places,
	}
	for _, r := range []string{adoptReadGate, adoptReadNudge, adoptReadPending, adoptReadSettle, adoptReadAdoption, adoptReadPause, adoptReadSubWorkflow} {
		m.reads[r] = reads.WithLabelValues(r)
	}
	for _, a := range watcherActions {
		m.actions[a] = actions.WithLabelValues(a)
	}
	for _, op := range conductorOps {
		m.duration[op] = duration.WithLabelValues(op)
		for _, r := range conductorResults {
			m.requests[[2]string{op, r}] = requests.WithLabelValues(op, r)
		}
	}
	for _, r := range []string{startResultStarted, startResultExisting, startResultError} {
		m.starts[r] = starts.WithLabelValues(r)
	}
	for _, s := range watcherStatuses {
		m.terminal[s] = terminal.WithLabelValues(s)
	}
	for _, a := range []string{"terminated", "adopted"} {
		m.orphans[a] = orphans.WithLabelValues(a)
	}
	return m
}

func (m *Metrics) request(op, result string, start time.Time) {
	if m == nil {
		return
	}
	if c, ok := m.requests[[2]string{op, result}]; ok {
		c.Inc()
	}
	if o, ok := m.duration[op]; ok {
		o.Observe(time.Since(start).Seconds())
	}
}

func (m *Metrics) start(result string) {
	if m != nil {
		m.starts[result].Inc()
	}
}

func (m *Metrics) setActive(n int) {
	if m != nil {
		m.active.Set(float64(n))
	}
}

func (m *Metrics) setWaitingRuns(n int) {
	if m != nil {
		m.waitingRuns.Set(float64(n))
	}
}

func (m *Metrics) setStuck(n int) {
	if m != nil {
		m.stuck.Set(float64(n))
	}
}

// watcherAction counts action; an action the watcher does not know (a
// pause follower's newer one) is not counted.
func (m *Metrics) watcherAction(action string) {
	if c, ok := m.counter(action); ok {
		c.Inc()
	}
}

func (m *Metrics) counter(action string) (prometheus.Counter, bool) {
	if m == nil {
		return nil, false
	}
	c, ok := m.actions[action]
	return c, ok
}

func (m *Metrics) terminalEvent(status string) {
	if m == nil {
		return
	}
	if c, ok := m.terminal[status]; ok {
		c.Inc()
	}
}

func (m *Metrics) watcherError() {
	if m != nil {
		m.errors.Inc()
	}
}

func (m *Metrics) adoptedWorkflow() {
	if m != nil {
		m.adopted.Inc()
	}
}

func (m *Metrics) adoptRead(reason string) {
	if m != nil {
		m.reads[reason].Inc()
	}
}

func (m *Metrics) orphan(action string) {
	if m != nil {
		m.orphans[action].Inc()
	}
}

// waiting adds d to the calls waiting for a place.
func (m *Metrics) waiting(d int) {
	if m != nil {
		m.queued.Add(float64(d))
	}
}

// bound records the calls the client may have at Conductor at once.
func (m *Metrics) bound(n int) {
	if m != nil {
		m.places.Set(float64(n))
	}
}
