package admission

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the admission metrics; a nil *Metrics records nothing.
//
//	sidecar_admission_submitted_total                 starts asked for under limits
//	sidecar_admission_decisions_total{outcome}        started, queued, delayed, rejected, cancelled, failed
//	sidecar_admission_queue_depth{state}              runs waiting: queued, delayed, pending, starting
//	sidecar_admission_wait_seconds                    RunQueued to start, of the queued and delayed runs
type Metrics struct {
	submittedC prometheus.Counter
	decisions  *prometheus.CounterVec
	depthG     *prometheus.GaugeVec
	wait       prometheus.Histogram
}

// NewMetrics registers the metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		submittedC: prometheus.NewCounter(prometheus.CounterOpts{Name: "sidecar_admission_submitted_total",
			Help: "Run starts asked for while admission limits are set."}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidecar_admission_decisions_total",
			Help: "Admission decisions by outcome: started, queued, delayed, rejected, cancelled (while queued), failed (cannot start: its plan or request)."}, []string{"outcome"}),
		depthG: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sidecar_admission_queue_depth",
			Help: "Runs waiting for admission by state (on the deciding replica): pending, queued, delayed, starting."}, []string{"state"}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sidecar_admission_wait_seconds",
			Help:    "Time a queued or delayed run waited, from RunQueued to its start.",
			Buckets: []float64{.1, .5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400}}),
	}
	for _, o := range []string{stateStarted, stateQueued, stateDelayed, stateRejected, stateCancelled} {
		m.decisions.WithLabelValues(o)
	}
	for _, st := range []string{statePending, stateQueued, stateDelayed, stateStarting} {
		m.depthG.WithLabelValues(st)
	}
	if reg != nil {
		reg.MustRegister(m.submittedC, m.decisions, m.depthG, m.wait)
	}
	return m
}

func (m *Metrics) submitted() {
	if m != nil {
		m.submittedC.Inc()
	}
}

func (m *Metrics) decided(outcome string) {
	if m != nil {
		m.decisions.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) waited(d time.Duration) {
	if m != nil {
		m.wait.Observe(d.Seconds())
	}
}

func (m *Metrics) depth(waiting []*entry) {
	if m == nil {
		return
	}
	n := map[string]int{statePending: 0, stateQueued: 0, stateDelayed: 0, stateStarting: 0}
	for _, e := range waiting {
		n[e.State]++
	}
	for s, v := range n {
		m.depthG.WithLabelValues(s).Set(float64(v))
	}
}
