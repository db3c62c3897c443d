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

// maxReasons is how many pause reasons sidecar_runs_paused_by_reason
// reports apart; the others are summed as "other".
const maxReasons = 10

// pausedByReason reports the PAUSED runs by their pause's reason, from the
// list at each scrape: the 10 most common reasons (cut to 64 bytes), the
// rest as "other", "" as "(none)". A reason is free text: the cap keeps the
// series few whatever operators write. Its cost follows the paused runs.
type pausedByReason struct {
	l    *List
	desc *prometheus.Desc
}

func newPausedByReason(l *List) *pausedByReason {
	return &pausedByReason{l: l, desc: prometheus.NewDesc("sidecar_runs_paused_by_reason",
		"PAUSED runs by the reason of their pause: the 10 most common, the rest as other (every replica reports the same; take max).",
		[]string{"reason"}, nil)}
}

func (c *pausedByReason) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *pausedByReason) Collect(ch chan<- prometheus.Metric) {
	for reason, n := range c.l.pausedByReason() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), reason)
	}
}
