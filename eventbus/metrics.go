package eventbus

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the bus's Prometheus metrics; a nil *Metrics records
// nothing.
//
//	sidecar_eventbus_delivered_total{sink}            events acknowledged by the sink
//	sidecar_eventbus_delivery_failures_total{sink}    failed delivery attempts (each retried or dead-lettered)
//	sidecar_eventbus_dead_lettered_total{sink}        events moved to the dead-letter stream (alert EVENT_BUS_DELIVERY_FAILED)
//	sidecar_eventbus_dead_letters{sink}               dead letters kept now (replay brings it down)
//	sidecar_eventbus_replayed_total{sink}             dead letters replayed and delivered
//	sidecar_eventbus_lag_events{sink}                 log records not yet acknowledged by the sink
//	sidecar_eventbus_delivery_latency_seconds{sink}   persistedAt to the sink's acknowledgement
type Metrics struct {
	deliveredC, failures, deadLetteredC, replayedC *prometheus.CounterVec
	dead, lagG                                     *prometheus.GaugeVec
	latency                                        *prometheus.HistogramVec
}

// NewMetrics registers the metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deliveredC: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidecar_eventbus_delivered_total",
			Help: "Events the sink acknowledged."}, []string{"sink"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidecar_eventbus_delivery_failures_total",
			Help: "Failed delivery attempts (each is retried with backoff, or dead-lettered after the last)."}, []string{"sink"}),
		deadLetteredC: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidecar_eventbus_dead_lettered_total",
			Help: "Events moved to the dead-letter stream after their last attempt (alert EVENT_BUS_DELIVERY_FAILED)."}, []string{"sink"}),
		replayedC: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidecar_eventbus_replayed_total",
			Help: "Dead letters replayed and delivered."}, []string{"sink"}),
		dead: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sidecar_eventbus_dead_letters",
			Help: "Dead letters kept in SIDECAR_EVENTBUS_DLQ (as this replica last saw them)."}, []string{"sink"}),
		lagG: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sidecar_eventbus_lag_events",
			Help: "Log records after the sink's cursor (on the replica delivering to it as it reads; on the others every 30 s)."}, []string{"sink"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sidecar_eventbus_delivery_latency_seconds",
			Help:    "Time from an event's persistedAt to the sink's acknowledgement.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}, []string{"sink"}),
	}
	if reg != nil {
		reg.MustRegister(m.deliveredC, m.failures, m.deadLetteredC, m.replayedC, m.dead, m.lagG, m.latency)
	}
	return m
}

// sink creates the series of a sink at start, so that they exist (at 0)
// before its first event: dashboards and alert rules see the sink.
func (m *Metrics) sink(name string) {
	if m == nil {
		return
	}
	for _, c := range []*prometheus.CounterVec{m.deliveredC, m.failures, m.deadLetteredC, m.replayedC} {
		c.WithLabelValues(name)
	}
	m.dead.WithLabelValues(name)
	m.lagG.WithLabelValues(name)
	m.latency.WithLabelValues(name)
}

func (m *Metrics) delivered(sink string, n int, msgs []Message) {
	if m == nil || n == 0 {
		return
	}
	m.deliveredC.WithLabelValues(sink).Add(float64(n))
	now := time.Now()
	h := m.latency.WithLabelValues(sink)
	for i := range msgs {
		if t, err := time.Parse(time.RFC3339Nano, msgs[i].PersistedAt); err == nil {
			h.Observe(now.Sub(t).Seconds())
		}
	}
}

func (m *Metrics) failure(sink string) {
	if m != nil {
		m.failures.WithLabelValues(sink).Inc()
	}
}

func (m *Metrics) deadLettered(sink string) {
	if m != nil {
		m.deadLetteredC.WithLabelValues(sink).Inc()
		m.dead.WithLabelValues(sink).Add(1)
	}
}

func (m *Metrics) deadLetters(sink string, delta float64) {
	if m != nil {
		m.dead.WithLabelValues(sink).Add(delta)
	}
}

func (m *Metrics) replayed(sink string) {
	if m != nil {
		m.replayedC.WithLabelValues(sink).Inc()
	}
}

func (m *Metrics) lag(sink string, v float64) {
	if m != nil {
		m.lagG.WithLabelValues(sink).Set(v)
	}
}
