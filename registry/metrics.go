package registry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Operation and result label values of the registry metrics.
const (
	opGetOrCreate = "get_or_create"
	opAdopt       = "adopt"
	opLookup      = "lookup"

	resultCreated   = "created"
	resultFound     = "found"
	resultAdopted   = "adopted"
	resultUnchanged = "unchanged"
	resultNotFound  = "not_found"
	resultError     = "error"
)

// Metrics are the registry's Prometheus metrics:
//
//	sidecar_registry_operations_total{op, result}
//	sidecar_registry_operation_duration_seconds{op}
//
// with op get_or_create (result created|found|error), adopt
// (adopted|unchanged|error) and lookup (found|not_found|error). There are
// no per-run labels. A nil *Metrics records nothing.
type Metrics struct {
	ops map[[2]string]prometheus.Counter
	dur map[string]prometheus.Observer
}

// NewMetrics registers the registry metrics with reg and returns them. All
// label combinations are created up front so that they export zero.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	ops := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sidecar_registry_operations_total",
		Help: "EventIdRegistry operations by op (get_or_create, adopt, lookup) and result.",
	}, []string{"op", "result"})
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sidecar_registry_operation_duration_seconds",
		Help:    "Latency of EventIdRegistry operations against its store (the KV bucket or the PostgreSQL table).",
		Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5},
	}, []string{"op"})
	reg.MustRegister(ops, dur)

	m := &Metrics{ops: make(map[[2]string]prometheus.Counter), dur: make(map[string]prometheus.Observer)}
	for op, results := range map[string][]string{
		opGetOrCreate: {resultCreated, resultFound, resultError},
		opAdopt:       {resultAdopted, resultUnchanged, resultError},
		opLookup:      {resultFound, resultNotFound, resultError},
	} {
		m.dur[op] = dur.WithLabelValues(op)
		for _, r := range results {
			m.ops[[2]string{op, r}] = ops.WithLabelValues(op, r)
		}
	}
	return m
}

func (m *Metrics) observe(op, result string, start time.Time) {
	if m == nil {
		return
	}
	m.ops[[2]string{op, result}].Inc()
	m.dur[op].Observe(time.Since(start).Seconds())
}
