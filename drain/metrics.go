package drain

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the drain controller's Prometheus metrics. A nil *Metrics
// records nothing. No label carries a run id.
type Metrics struct {
	draining    prometheus.Gauge
	inFlight    prometheus.Gauge
	duration    *prometheus.HistogramVec
	timeouts    prometheus.Counter
	pauseRecord prometheus.Histogram
	engineCalls prometheus.Histogram
	runs        *prometheus.GaugeVec
	scheduled   prometheus.Counter
	paused      *prometheus.GaugeVec
}

// watchedStatuses are the statuses sidecar_runs_active always reports
// (zero when no run has them), so a panel never loses a series.
var watchedStatuses = []string{"PENDING", "RUNNING", "PAUSED", "CANCELLING"}

// NewMetrics registers the drain metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		draining: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_drain_runs_draining", Help: "Runs PAUSED with steps still in flight (substatus DRAINING).",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_drain_inflight_steps", Help: "In-flight steps of draining runs.",
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sidecar_drain_duration_seconds", Help: "Pause to end of drain, by how it ended (drained, timed_out, resumed, cancelled).",
			Buckets: []float64{0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800},
		}, []string{"outcome"}),
		timeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_drain_timeouts_total", Help: "PAUSE_DRAIN_TIMEOUT: drains whose deadline passed with steps still running.",
		}),
		pauseRecord: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sidecar_drain_pause_record_seconds", Help: "Pause request to RunPaused persisted.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		engineCalls: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sidecar_drain_engine_pause_seconds", Help: "Conductor's pause call.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sidecar_runs_paused", Help: "Paused runs this replica owns, by where the pause came from (operator: the API; step_failed: a held failure; conductor: paused in Conductor), as of the last full pass.",
		}, []string{"origin"}),
		scheduled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_drain_scheduled_resumes_total", Help: "Scheduled resumes (requestedBy schedule) this replica carried out; replicas racing for one may both count it, the log has one RunResumed.",
		}),
		runs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sidecar_runs_active", Help: "Runs the sidecar watches (started, not yet terminal), by status; CANCELLING is a run whose cancel is requested but not yet recorded done.",
		}, []string{"status"}),
	}
	for _, s := range watchedStatuses {
		m.runs.WithLabelValues(s)
	}
	for _, o := range []string{"drained", "timed_out", "resumed", "cancelled"} {
		m.duration.WithLabelValues(o)
	}
	for _, o := range pauseOrigins {
		m.paused.WithLabelValues(o)
	}
	reg.MustRegister(m.draining, m.inFlight, m.duration, m.timeouts, m.pauseRecord, m.engineCalls, m.runs, m.scheduled, m.paused)
	return m
}

// drainGauges sets the draining runs and their in-flight steps.
func (m *Metrics) drainGauges(draining, inFlight int) {
	if m == nil {
		return
	}
	m.draining.Set(float64(draining))
	m.inFlight.Set(float64(inFlight))
}

// statusGauges sets the active runs by status (the full pass).
func (m *Metrics) statusGauges(n *runCounts) {
	if m == nil {
		return
	}
	for _, s := range watchedStatuses {
		m.runs.WithLabelValues(s).Set(float64(n.byStatus[s]))
	}
	for s, c := range n.byStatus {
		m.runs.WithLabelValues(s).Set(float64(c))
	}
	for _, o := range pauseOrigins {
		m.paused.WithLabelValues(o).Set(float64(n.pausedBy[o]))
	}
}

func (m *Metrics) drainEnded(outcome string, d time.Duration) {
	if m != nil {
		m.duration.WithLabelValues(outcome).Observe(d.Seconds())
	}
}

func (m *Metrics) scheduledResume() {
	if m != nil {
		m.scheduled.Inc()
	}
}

func (m *Metrics) timeout() {
	if m != nil {
		m.timeouts.Inc()
	}
}

func (m *Metrics) pauseRecorded(d time.Duration) {
	if m != nil {
		m.pauseRecord.Observe(d.Seconds())
	}
}

func (m *Metrics) enginePause(d time.Duration) {
	if m != nil {
		m.engineCalls.Observe(d.Seconds())
	}
}
