package statestore

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LogSize is what a backend reports of its log at a scrape: the bytes and
// records it holds now, and the sequence of the last record ever appended
// (removed by retention or not).
type LogSize struct {
	Bytes, Records, LastSequence int64
}

// logSizeTimeout bounds one scrape's read of the log's size.
const logSizeTimeout = 2 * time.Second

var (
	logBytesDesc   = prometheus.NewDesc("sidecar_log_bytes", "Bytes the run event log holds now (JetStream: the event stream's messages; PostgreSQL: run_events with its indexes).", nil, nil)
	logRecordsDesc = prometheus.NewDesc("sidecar_log_records", "Records the run event log holds now (PostgreSQL: the table statistics' live rows).", nil, nil)
	logLastDesc    = prometheus.NewDesc("sidecar_log_last_sequence", "Sequence of the last record appended to the log: every record ever appended, including those retention removed.", nil, nil)
)

// NewLogSizeCollector exports the log's size at each scrape, as read reads
// it: sidecar_log_bytes, sidecar_log_records, sidecar_log_last_sequence. A
// read that fails, or takes over 2 s, exports none of them. Each backend
// gives its read (natsstore's and pgstore's SizeCollector).
func NewLogSizeCollector(read func(context.Context) (LogSize, error)) prometheus.Collector {
	return logSizeCollector(read)
}

type logSizeCollector func(context.Context) (LogSize, error)

func (c logSizeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- logBytesDesc
	ch <- logRecordsDesc
	ch <- logLastDesc
}

func (c logSizeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), logSizeTimeout)
	defer cancel()
	s, err := c(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(logBytesDesc, prometheus.GaugeValue, float64(s.Bytes))
	ch <- prometheus.MustNewConstMetric(logRecordsDesc, prometheus.GaugeValue, float64(s.Records))
	ch <- prometheus.MustNewConstMetric(logLastDesc, prometheus.GaugeValue, float64(s.LastSequence))
}
