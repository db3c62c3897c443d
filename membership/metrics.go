package membership

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the membership's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	live     prometheus.Gauge
	ownsAll  prometheus.Gauge
	failures prometheus.Counter
}

// NewMetrics registers the membership metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		live: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_members_live", Help: "Sidecar replicas this replica counts as live (itself included); they share the per-run background work.",
		}),
		ownsAll: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_members_owns_all", Help: "1 while this replica does every run's background work because it cannot tell who is live (just started, no watch, or its heartbeat failing).",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_members_heartbeat_failures_total", Help: "Heartbeats of this replica the members' bucket did not take.",
		}),
	}
	reg.MustRegister(m.live, m.ownsAll, m.failures)
	return m
}

func (m *Metrics) set(live int, ownsAll bool) {
	if m == nil {
		return
	}
	m.live.Set(float64(live))
	if ownsAll {
		m.ownsAll.Set(1)
	} else {
		m.ownsAll.Set(0)
	}
}

func (m *Metrics) heartbeatFailed() {
	if m != nil {
		m.failures.Inc()
	}
}
