package runlist

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the run list. A nil *Metrics records nothing.
type Metrics struct {
	rows   prometheus.Gauge
	writes prometheus.Counter
	errors prometheus.Counter
}

// NewMetrics registers the run list's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		rows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_runlist_rows", Help: "Runs in this replica's mirror of the run list.",
		}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_runlist_row_writes_total", Help: "Rows of the run list written by this replica's follower of the log.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_runlist_follow_errors_total", Help: "Failed rounds of the run list's follower of the log (retried with backoff).",
		}),
	}
	reg.MustRegister(m.rows, m.writes, m.errors)
	return m
}

func (m *Metrics) setRows(n int) {
	if m != nil {
		m.rows.Set(float64(n))
	}
}

func (m *Metrics) wrote() {
	if m != nil {
		m.writes.Inc()
	}
}

func (m *Metrics) error() {
	if m != nil {
		m.errors.Inc()
	}
}
