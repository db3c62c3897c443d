package pgstore

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// sizeTimeout bounds the query of one scrape.
const sizeTimeout = 2 * time.Second

// SizeCollector exports the log's size at each scrape, as the JetStream
// store does: sidecar_log_bytes (run_events with its indexes and TOAST,
// pg_total_relation_size), sidecar_log_records (the table statistics'
// live rows, which follow inserts and deletes within seconds of their
// commit: the statistics' count, not a count(*), so that a scrape costs
// the same at any size) and sidecar_log_last_sequence (the last log_seq
// appended, removed or not). A scrape the database does not answer within
// 2 s exports none of them. Register it with the node's registry.
func (s *Store) SizeCollector() prometheus.Collector { return &sizeCollector{s: s} }

var (
	logBytesDesc   = prometheus.NewDesc("sidecar_log_bytes", "Bytes the run event log holds now (PostgreSQL: run_events with its indexes).", nil, nil)
	logRecordsDesc = prometheus.NewDesc("sidecar_log_records", "Records the run event log holds now (PostgreSQL: the table statistics' live rows).", nil, nil)
	logLastDesc    = prometheus.NewDesc("sidecar_log_last_sequence", "Sequence of the last record appended to the log: every record ever appended, including those retention removed.", nil, nil)
)

type sizeCollector struct{ s *Store }

func (c *sizeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- logBytesDesc
	ch <- logRecordsDesc
	ch <- logLastDesc
}

// sizeQuery reads the three in one round trip. max(log_seq) is one step
// down the run_events_by_log_seq index.
const sizeQuery = `SELECT pg_total_relation_size('run_events'::regclass),
	coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'run_events'::regclass), 0),
	coalesce((SELECT max(log_seq) FROM run_events), 0)`

func (c *sizeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), sizeTimeout)
	defer cancel()
	var bytes, records, last int64
	if err := c.s.pool.QueryRow(ctx, sizeQuery).Scan(&bytes, &records, &last); err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(logBytesDesc, prometheus.GaugeValue, float64(bytes))
	ch <- prometheus.MustNewConstMetric(logRecordsDesc, prometheus.GaugeValue, float64(records))
	ch <- prometheus.MustNewConstMetric(logLastDesc, prometheus.GaugeValue, float64(last))
}
