package taskworkers

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the workers' Prometheus metrics. A nil *Metrics records
// nothing. No label carries a run or step id.
type Metrics struct {
	polledTasks  *prometheus.CounterVec
	polls        *prometheus.CounterVec
	pollErrors   *prometheus.CounterVec
	steps        *prometheus.CounterVec
	stepDuration *prometheus.HistogramVec
	startLatency prometheus.Histogram
	handedBackBy *prometheus.CounterVec
	writes       *prometheus.HistogramVec
	updateErrors prometheus.Counter
	outboxEvents prometheus.Gauge
	fenceRetries prometheus.Counter
}

// NewMetrics registers the worker metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		polledTasks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_worker_tasks_polled_total", Help: "Tasks received from Conductor polls.",
		}, []string{"task_type"}),
		polls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_worker_polls_total", Help: "Batch polls sent to Conductor, answered or not (polls per step: this over sidecar_worker_tasks_polled_total).",
		}, []string{"task_type"}),
		pollErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_worker_poll_errors_total", Help: "Failed Conductor polls.",
		}, []string{"task_type"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_worker_steps_total", Help: "Step executions by executor and outcome (completed, failed, retried; refused: the log already had another outcome of the attempt, which was reported instead; ended_in_conductor: interrupted because Conductor ended the task meanwhile, an action taken in Conductor).",
		}, []string{"executor", "outcome"}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sidecar_worker_step_duration_seconds", Help: "Time from poll to outcome of a step execution.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 10),
		}, []string{"executor"}),
		startLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sidecar_worker_step_start_latency_seconds", Help: "Task scheduled in Conductor to StepStarted recorded.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		handedBackBy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_worker_tasks_handed_back_total", Help: "Tasks handed back to Conductor unstarted, by reason: paused (the run is paused), held (a step failed under onStepFailure pause), foreign_workflow (refused: not the run's workflow), unknown_run (a run of another deployment), run_ended (refused: a task of a run whose log already ended, made by a restart, rerun or retry in Conductor), cancelling (the run's cancel is requested and not ended: the terminate ends the task), lost_poll_answer (Conductor gave it to a poll whose answer never arrived).",
		}, []string{"reason"}),
		writes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sidecar_worker_event_write_seconds", Help: "Event append latency by event type and result.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"event_type", "result"}),
		updateErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_worker_task_update_errors_total", Help: "Failed task updates to Conductor (retried).",
		}),
		outboxEvents: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_worker_outbox_events", Help: "StepStarted events queued in the outbox (failed open).",
		}),
		fenceRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_worker_fence_retries_total", Help: "StepStarted appends refused because the run moved on after the gate read it (RUN_CHANGED), then decided again.",
		}),
	}
	for _, r := range []string{handBackPaused, handBackHeld, handBackForeign, handBackUnknown, handBackRunEnded, handBackCancelling} {
		m.handedBackBy.WithLabelValues(r)
	}
	reg.MustRegister(m.polledTasks, m.polls, m.pollErrors, m.steps, m.stepDuration, m.startLatency, m.handedBackBy, m.writes, m.updateErrors, m.outboxEvents, m.fenceRetries)
	return m
}

// Reasons of sidecar_worker_tasks_handed_back_total.
const (
	handBackPaused   = "paused"
	handBackHeld     = "held"
	handBackForeign  = "foreign_workflow"
	handBackUnknown  = "unknown_run"
	handBackRunEnded = "run_ended"
	// handBackCancelling: the run's cancel is requested, not yet ended.
	handBackCancelling = "cancelling"
	handBackLost       = "lost_poll_answer"
	handBackKept       = "outcome_not_recorded"
)

// taskTypes creates the per-task-type series of the polled types at zero,
// so that dashboards and alerts see them before the first poll or error.
func (m *Metrics) taskTypes(types []string) {
	if m == nil {
		return
	}
	for _, t := range types {
		m.polledTasks.WithLabelValues(t)
		m.polls.WithLabelValues(t)
		m.pollErrors.WithLabelValues(t)
	}
}

func (m *Metrics) polled(taskType string, n int) {
	if m != nil && n > 0 {
		m.polledTasks.WithLabelValues(taskType).Add(float64(n))
	}
}

func (m *Metrics) poll(taskType string) {
	if m != nil {
		m.polls.WithLabelValues(taskType).Inc()
	}
}

func (m *Metrics) pollError(taskType string) {
	if m != nil {
		m.pollErrors.WithLabelValues(taskType).Inc()
	}
}

func (m *Metrics) stepDone(executor, outcome string, took time.Duration) {
	if m != nil {
		m.steps.WithLabelValues(executor, outcome).Inc()
		m.stepDuration.WithLabelValues(executor).Observe(took.Seconds())
	}
}

// stepRefused counts an outcome the producer guard refused.
func (m *Metrics) stepRefused(executor string) {
	if m != nil {
		m.steps.WithLabelValues(executor, "refused").Inc()
	}
}

// stepStartLatency observes scheduled (Conductor's scheduledTime, epoch ms)
// to now, the moment StepStarted was recorded.
func (m *Metrics) stepStartLatency(scheduledMs int64, _ time.Time) {
	if m != nil && scheduledMs > 0 {
		if d := time.Since(time.UnixMilli(scheduledMs)); d >= 0 {
			m.startLatency.Observe(d.Seconds())
		}
	}
}

func (m *Metrics) handedBack(reason string) {
	if m != nil {
		m.handedBackBy.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) eventWrite(eventType string, err error, took time.Duration) {
	if m != nil {
		result := "ok"
		if err != nil {
			result = "error"
		}
		m.writes.WithLabelValues(eventType, result).Observe(took.Seconds())
	}
}

func (m *Metrics) updateError() {
	if m != nil {
		m.updateErrors.Inc()
	}
}

func (m *Metrics) outboxSize(n int) {
	if m != nil {
		m.outboxEvents.Set(float64(n))
	}
}

func (m *Metrics) fenceRetry() {
	if m != nil {
		m.fenceRetries.Inc()
	}
}
