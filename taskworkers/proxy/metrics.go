package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the task proxy's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	requests *prometheus.CounterVec
	tasks    *prometheus.CounterVec
	gate     *prometheus.HistogramVec
	held     prometheus.Gauge
	// slots, upstream and waiting are the proxy's connections to
	// Conductor by kind (poll, update): the bound, those in use, the
	// requests waiting for one.
	slots, upstream, waiting *prometheus.GaugeVec
	// refusedConns counts the connections refused beyond MaxConnections.
	refusedConns prometheus.Counter
}

// NewMetrics registers the proxy's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_proxy_requests_total",
			Help: "Requests the task proxy served, by kind: poll, batch_poll, update, update_v2, update_by_ref, forward (another call of workers, passed through), unauthorized, refused (not a call of workers: 403 PROXY_ROUTE_NOT_FORWARDED), too_large (413), busy (503 PROXY_BUSY).",
		}, []string{"kind"}),
		tasks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_proxy_external_tasks_total",
			Help: "External steps' tasks by what the proxy did: admitted (StepStarted recorded, handed to the worker), held_back (the gate answered Conductor: paused, ended, ...), update_answered (the update was answered by the sidecar, not forwarded), update_not_recorded (the store did not take the outcome; the worker retries), update_not_admitted (a task the proxy never handed out, of a run that may not start it: refused with 409), update_refused (the update named another workflow than the task's, or was no task result: refused with 400); and reserved (a poll of a type of the sidecar's own steps, or an update of such a task: refused with 403, not forwarded).",
		}, []string{"outcome"}),
		gate: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sidecar_proxy_gate_seconds",
			Help:    "Time the proxy added to a worker's call for external steps' tasks, by stage: poll (the gate of a poll's answer, StepStarted appended, for all its tasks), update (the outcome recorded before the update is forwarded).",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"stage"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_proxy_buffered_bytes",
			Help: "Bytes of update bodies the task proxy holds now (its room taken: Content-Length, or the per-update bound for a body of unannounced length); at most its MaxBufferedBytes.",
		}),
		slots: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sidecar_proxy_upstream_slots",
			Help: "Requests the task proxy may have at Conductor at once, by kind: poll (polls, batch polls, the workers' other calls passed through), update (task updates: a quarter of --conductor-proxy-max-upstream-connections, kept so that an update never waits behind long polls).",
		}, []string{"kind"}),
		upstream: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sidecar_proxy_upstream_requests",
			Help: "Requests the task proxy has at Conductor now, by kind (poll, update); at sidecar_proxy_upstream_slots, further ones wait (sidecar_proxy_upstream_waiting).",
		}, []string{"kind"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sidecar_proxy_upstream_waiting",
			Help: "Workers' polls and updates waiting for a connection of the task proxy to Conductor, by kind (poll, update): above 0 for long, raise --conductor-proxy-max-upstream-connections (and Conductor's request threads).",
		}, []string{"kind"}),
		refusedConns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_proxy_connections_refused_total",
			Help: "Connections to the task proxy's listener refused (503 TOO_MANY_CONNECTIONS) because it held its bound (--max-connections).",
		}),
	}
	for _, k := range []string{"poll", "batch_poll", "update", "update_v2", "update_by_ref", "forward", "unauthorized", "refused", "too_large", "busy"} {
		m.requests.WithLabelValues(k)
	}
	for _, o := range []string{"admitted", "held_back", "update_answered", "update_not_recorded", "update_not_admitted", "update_try_timed_out", "update_refused", "reserved"} {
		m.tasks.WithLabelValues(o)
	}
	for _, st := range []string{"poll", "update"} {
		m.gate.WithLabelValues(st)
	}
	for _, k := range []string{"poll", "update"} {
		m.upstream.WithLabelValues(k)
		m.waiting.WithLabelValues(k)
	}
	reg.MustRegister(m.requests, m.tasks, m.gate, m.held, m.slots, m.upstream, m.waiting, m.refusedConns)
	return m
}

// connRefused counts a connection refused beyond the listener's bound.
func (m *Metrics) connRefused() {
	if m != nil {
		m.refusedConns.Inc()
	}
}

func (m *Metrics) request(kind string) {
	if m != nil {
		m.requests.WithLabelValues(kind).Inc()
	}
}

func (m *Metrics) task(outcome string) {
	if m != nil {
		m.tasks.WithLabelValues(outcome).Inc()
	}
}

// gated observes the time a stage of the gate took since began.
func (m *Metrics) gated(stage string, began time.Time) {
	if m != nil {
		m.gate.WithLabelValues(stage).Observe(time.Since(began).Seconds())
	}
}

// buffered adds d to the bytes of update bodies held now.
func (m *Metrics) buffered(d int64) {
	if m != nil {
		m.held.Add(float64(d))
	}
}

// bound sets the connections to Conductor the proxy may use for kind.
func (m *Metrics) bound(kind string, n int) {
	if m != nil {
		m.slots.WithLabelValues(kind).Set(float64(n))
	}
}

// upstreamWait adds d to the requests of kind waiting for a connection.
func (m *Metrics) upstreamWait(kind string, d int) {
	if m != nil {
		m.waiting.WithLabelValues(kind).Add(float64(d))
	}
}

// upstreamHeld adds d to the requests of kind at Conductor now.
func (m *Metrics) upstreamHeld(kind string, d int) {
	if m != nil {
		m.upstream.WithLabelValues(kind).Add(float64(d))
	}
}
