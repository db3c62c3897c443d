package statestore

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the projector's and the append authority's Prometheus
// metrics. A nil *Metrics records nothing.
type Metrics struct {
	appends        *prometheus.CounterVec
	appendDuration prometheus.Histogram
	eventsApplied  prometheus.Counter
	lagSeconds     prometheus.Gauge
	lagHistogram   prometheus.Histogram
	invalid        prometheus.Counter
	nonContig      prometheus.Counter
	gapsAccepted   prometheus.Counter
	cachedRuns     prometheus.Gauge
	durable        *prometheus.CounterVec
}

// NewMetrics registers the projector metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		appends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_store_appends_total",
			Help: "Appends to the event log by result: persisted, duplicate (the key was stored already; the existing record is returned), rejected (SCHEMA_VALIDATION_FAILED or INVALID_TRANSITION, nothing written), error (store unavailable).",
		}, []string{"result"}),
		appendDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sidecar_store_append_duration_seconds",
			Help:    "Append latency: request to the server's acknowledgement (fsync included when on).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12),
		}),
		eventsApplied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_projector_events_applied_total",
			Help: "Records reduced into run snapshots.",
		}),
		lagSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_projector_lag_seconds",
			Help: "Age of the newest record at the time it was projected (last projection). Alert PROJECTOR_LAG_HIGH above 5s.",
		}),
		lagHistogram: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sidecar_projector_lag_distribution_seconds",
			Help:    "Distribution of projection lag: now minus persistedAt of the newest record of each projected batch.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_projector_invalid_transitions_total",
			Help: "INVALID_TRANSITION alerts raised (one per runId and offending eventId).",
		}),
		nonContig: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_projector_non_contiguous_fetch_total",
			Help: "PROJECTOR_NON_CONTIGUOUS_FETCH_DETECTED: visibility gaps observed on a contiguous store.",
		}),
		gapsAccepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_projector_gaps_accepted_total",
			Help: "Visibility gaps that did not close within the grace period and were moved past.",
		}),
		durable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_projector_durable_snapshots_total",
			Help: "Persisted snapshots by outcome: loaded (a run projected from its persisted snapshot and the records after it), saved, discarded (PROJECTOR_SNAPSHOT_MISMATCH: the log no longer has the record the snapshot was taken at; rebuilt from the log), error (the bucket did not answer; projected from the log).",
		}, []string{"outcome"}),
		cachedRuns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_projector_cached_runs",
			Help: "Runs whose snapshots the projector keeps in memory (at most ProjectorOptions.MaxRuns, least recently used dropped).",
		}),
	}
	for _, r := range []string{"persisted", "duplicate", "rejected", "error"} {
		m.appends.WithLabelValues(r)
	}
	for _, o := range []string{"loaded", "saved", "discarded", "error"} {
		m.durable.WithLabelValues(o)
	}
	reg.MustRegister(m.appends, m.appendDuration, m.eventsApplied, m.lagSeconds, m.lagHistogram, m.invalid, m.nonContig, m.gapsAccepted, m.cachedRuns, m.durable)
	return m
}

func (m *Metrics) applied(n int, lag time.Duration) {
	if m == nil {
		return
	}
	m.eventsApplied.Add(float64(n))
	m.lagSeconds.Set(lag.Seconds())
	m.lagHistogram.Observe(lag.Seconds())
}

func (m *Metrics) durableSnapshot(outcome string) {
	if m != nil {
		m.durable.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) invalidTransition() {
	if m != nil {
		m.invalid.Inc()
	}
}

func (m *Metrics) nonContiguous() {
	if m != nil {
		m.nonContig.Inc()
	}
}

func (m *Metrics) gapAccepted() {
	if m != nil {
		m.gapsAccepted.Inc()
	}
}

// Appended records one append's outcome and latency; a store calls it.
func (m *Metrics) Appended(res AppendResult, err error, took time.Duration) {
	if m == nil {
		return
	}
	result := "persisted"
	switch {
	case errors.Is(err, ErrSchemaValidation) || errors.Is(err, ErrInvalidTransition):
		result = "rejected"
	case err != nil:
		result = "error"
	case !res.Persisted:
		result = "duplicate"
	}
	m.appends.WithLabelValues(result).Inc()
	m.appendDuration.Observe(took.Seconds())
}

// AppendedBatch records an AppendBatch: each run's events as Appended
// would (one count per event written or found, one for a refused run),
// and the call's duration once.
func (m *Metrics) AppendedBatch(out []BatchResult, took time.Duration) {
	if m == nil {
		return
	}
	for _, r := range out {
		for _, res := range r.Results {
			result := "persisted"
			if !res.Persisted {
				result = "duplicate"
			}
			m.appends.WithLabelValues(result).Inc()
		}
		switch {
		case r.Err == nil:
		case errors.Is(r.Err, ErrSchemaValidation) || errors.Is(r.Err, ErrInvalidTransition):
			m.appends.WithLabelValues("rejected").Inc()
		default:
			m.appends.WithLabelValues("error").Inc()
		}
	}
	m.appendDuration.Observe(took.Seconds())
}

func (m *Metrics) cached(n int) {
	if m != nil {
		m.cachedRuns.Set(float64(n))
	}
}
