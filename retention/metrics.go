package retention

import "github.com/prometheus/client_golang/prometheus"

// Metrics are retention's metrics. A nil *Metrics records nothing.
type Metrics struct {
	archived  prometheus.Counter
	removed   prometheus.Counter
	failures  *prometheus.CounterVec
	failing   prometheus.Gauge
	waiting   prometheus.Gauge
	lastOK    prometheus.Gauge
	archiveOK prometheus.Counter
}

// NewMetrics registers retention's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		archived: prometheus.NewCounter(prometheus.CounterOpts{Name: "sidecar_retention_runs_archived_total",
			Help: "Finished runs written to the archive and read back."}),
		removed: prometheus.NewCounter(prometheus.CounterOpts{Name: "sidecar_retention_runs_removed_total",
			Help: "Finished runs removed from hot state after their archive was confirmed."}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidecar_retention_failures_total",
			Help: "Retention passes that failed, by step (archive, remove, read)."}, []string{"step"}),
		failing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sidecar_archive_failing",
			Help: "1 while the archive cannot be written or read back: nothing is removed and hot state grows."}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sidecar_retention_runs_waiting",
			Help: "Finished runs in hot state waiting for their retention period to pass."}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sidecar_archive_last_success_timestamp_seconds",
			Help: "When a segment was last written and confirmed (Unix seconds)."}),
		archiveOK: prometheus.NewCounter(prometheus.CounterOpts{Name: "sidecar_archive_segments_written_total",
			Help: "Archive segments written and confirmed."}),
	}
	for _, step := range []string{stepArchive, stepRemove, stepRead} {
		m.failures.WithLabelValues(step)
	}
	reg.MustRegister(m.archived, m.removed, m.failures, m.failing, m.waiting, m.lastOK, m.archiveOK)
	return m
}

// Steps of a pass, the label of sidecar_retention_failures_total.
const (
	stepArchive = "archive"
	stepRemove  = "remove"
	stepRead    = "read"
)

func (m *Metrics) failed(step string) {
	if m == nil {
		return
	}
	m.failures.WithLabelValues(step).Inc()
	if step == stepArchive {
		m.failing.Set(1)
	}
}

func (m *Metrics) wrote(runs int, unix float64) {
	if m == nil {
		return
	}
	m.archiveOK.Inc()
	m.archived.Add(float64(runs))
	m.failing.Set(0)
	m.lastOK.Set(unix)
}

func (m *Metrics) removedRun() {
	if m != nil {
		m.removed.Inc()
	}
}

func (m *Metrics) queue(n int) {
	if m != nil {
		m.waiting.Set(float64(n))
	}
}
