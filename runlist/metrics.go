package runlist

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the run list. A nil *Metrics records nothing.
type Metrics struct {
	rows    prometheus.Gauge
	writes  prometheus.Counter
	errors  prometheus.Counter
	forgets prometheus.Counter
	// startRead is the rows of the last full read of the bucket.
	startRead prometheus.Gauge
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
		forgets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_runlist_rows_forgotten_total", Help: "Rows of the run list removed by this replica because their run left hot state (retention).",
		}),
		startRead: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_runlist_start_rows_read",
			Help: "Rows of the run list this replica read from the bucket at its last full read of it (at start, or when its watch began anew).",
		}),
	}
	reg.MustRegister(m.rows, m.writes, m.errors, m.forgets, m.startRead)
	return m
}

func (m *Metrics) setRows(n int) {
	if m != nil {
		m.rows.Set(float64(n))
	}
}

func (m *Metrics) setStartRead(n int) {
	if m != nil {
		m.startRead.Set(float64(n))
	}
}

func (m *Metrics) wrote() {
	if m != nil {
		m.writes.Inc()
	}
}

func (m *Metrics) forgot() {
	if m != nil {
		m.forgets.Inc()
	}
}

func (m *Metrics) error() {
	if m != nil {
		m.errors.Inc()
	}
}

// pausedByReason reports the PAUSED runs by where their pause came from,
// from the list at each scrape. The label is named reason for the
// dashboards that read it, but its values are a bounded set (operator,
// step_failed, conductor): a reason is free text an operator typed, and
// /metrics is read by every viewer whatever its scope. The reason itself
// is in the run list (GET /v1/runs, pauseReason), scoped.
type pausedByReason struct {
	l    *List
	desc *prometheus.Desc
}

func newPausedByReason(l *List) *pausedByReason {
	return &pausedByReason{l: l, desc: prometheus.NewDesc("sidecar_runs_paused_by_reason",
		"PAUSED runs by where the pause came from: operator (the API), step_failed (a held failure), conductor (paused in Conductor); never the free-text reason (every replica reports the same; take max).",
		[]string{"reason"}, nil)}
}

func (c *pausedByReason) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *pausedByReason) Collect(ch chan<- prometheus.Metric) {
	for reason, n := range c.l.pausedByReason() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), reason)
	}
}
